"""Which clips each split holds: the test clips the sweeps decode, the train and validation clips the
gates and the WISV head learn from, and, when those learn from the test clips themselves
(cross-fitting, params data.cross_fit), which referenced clip belongs to which fold.

Light on purpose: every stage's preflight (speccap.preflight) reads the splits before its flow
starts, so nothing here loads torch or the models.

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
from ..data.manifest import ManifestError, manifest_path, read_manifest

PARAM = "data.cross_fit"
SHIPPED_VAL_FOLD = 0  # the shipped gates' validation fold
SPLITS = ("train", "val")  # the splits the gates and the WISV head learn from


def eval_clips(params: Params, language: str) -> list[dict]:
    """The test clips of a language the sweeps decode: the first `sweep.clips` (0: all)."""
    recs = read_manifest(manifest_path(params.data.processed_dir, "test", language))
    return recs[: params.sweep.clips] if params.sweep.clips else recs


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


def missing_split_error(params: Params, split: str, language: str) -> ManifestError:
    path = manifest_path(params.data.processed_dir, split, language)
    if params.data.source == "mer2024":
        return ManifestError(
            f"data.cross_fit.when: never, data.trace_pool.path: not set, and MER2024's referenced clips are all "
            f"test clips: the gates and the WISV head need {split} clips to learn from. Point data.trace_pool.path "
            f"at a folder of speech (unlabeled is fine: the cloud's caption is its reference), or let them learn "
            f"from folds of the referenced clips (data.cross_fit.when: auto) ({path} does not exist)")
    return ManifestError(f"{path}: no {split} clips in {language} (run the prepare stage: dvc repro prepare)")


def split_records(params: Params, split: str, language: str) -> list[dict]:
    """A train or validation split's clips as prepared: the manifest's, or under cross-fitting the
    shipped gates' folds of the referenced clips."""
    if active(params):
        return shipped_split(params, split, language)
    path = manifest_path(params.data.processed_dir, split, language)
    if not path.exists():
        raise missing_split_error(params, split, language)
    return read_manifest(path)
