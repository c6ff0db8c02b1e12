"""Which referenced clip belongs to which fold when the gates learn from the test clips themselves
(cross-fitting, params data.cross_fit).

MER2024's referenced clips are all test clips. Without a trace pool the gates and the WISV head
can only learn from them, so they are dealt into k folds: the gates that evaluate fold f are
trained on the folds other than f and f + 1 and thresholded on fold f + 1 (mod k), and never see
fold f. The gates that ship (promotion, the registry) are trained on folds 1..k-1 and thresholded
on fold 0: to the rest of the pipeline that is an ordinary train and validation split.

A clip's fold comes from the order of the SHA-256 of its id, dealt round robin: folds differ in
size by one clip at most, a clip keeps its fold when the params change, and the two languages'
folds agree when they hold the same clips (MER2024's do).
"""

from __future__ import annotations

import hashlib

from ..config import Params
from ..data.manifest import ManifestError, manifest_path
from .sweep import eval_clips

PARAM = "data.cross_fit"
SHIPPED_VAL_FOLD = 0  # the shipped gates' validation fold


def active(params: Params) -> bool:
    """Whether the gates learn from folds of the test clips: `always`, or `auto` on MER2024 without
    a trace pool (the corpus has no other clips with or without references)."""
    cf = params.data.cross_fit
    return cf.when == "always" or (cf.when == "auto" and params.data.source == "mer2024"
                                   and not params.data.trace_pool.path)


def folds_of(ids: list[str], k: int) -> dict[str, int]:
    """clip id -> fold in 0..k-1."""
    order = sorted(set(ids), key=lambda i: hashlib.sha256(i.encode()).hexdigest())
    return {clip_id: n % k for n, clip_id in enumerate(order)}


def val_fold(fold: int, k: int) -> int:
    """The fold the gates that evaluate `fold` are thresholded on."""
    return (fold + 1) % k


def referenced_clips(params: Params, language: str) -> list[dict]:
    """The test clips of a language, each with its "fold"."""
    path = manifest_path(params.data.processed_dir, "test", language)
    if not path.exists():
        raise ManifestError(f"{path}: no test clips to cross-fit over (run the prepare stage: dvc repro prepare)")
    recs = eval_clips(params, language)
    k = params.data.cross_fit.folds
    if len(recs) < k:
        raise ManifestError(f"{PARAM}.folds: {k} folds need at least {k} referenced {language} clips, "
                            f"{path} holds {len(recs)}")
    fold = folds_of([r["id"] for r in recs], k)
    return [r | {"fold": fold[r["id"]]} for r in recs]


def shipped_split(params: Params, split: str, language: str) -> list[dict]:
    """The shipped gates' train (folds other than 0) or validation (fold 0) clips."""
    recs = referenced_clips(params, language)
    if split == "val":
        return [r for r in recs if r["fold"] == SHIPPED_VAL_FOLD]
    return [r for r in recs if r["fold"] != SHIPPED_VAL_FOLD]
