"""Where the learned deciders are saved and how a decoder loads them: the token gates
(models/gates/<name>.pkl, and per fold under cross-fitting) and the WISV head (models/wisv/head.pt).
The decoding workers (pipeline.sweep), the stages that train them and the CLI read them here, so
loading a decider never needs the code that trains it."""

from __future__ import annotations

import pickle
from pathlib import Path

from ..config import Params
from ..decoding.decision_head import load_head
from ..gating.learned import LearnedGate
from ..gating.token_gates import LearnedTokenGate


def gate_dir(params: Params, fold: int | None = None) -> Path:
    """Where the gates are saved: the shipped ones, or under cross-fitting those that evaluate
    `fold` (pipeline.folds)."""
    root = Path(params.models.dir) / "gates"
    return root if fold is None else root / "folds" / str(fold)


def gate_from_saved(saved: dict, threshold: float | dict | None = None, name: str | None = None):
    """The gate a saved pickle describes: a token gate, or an older block gate (gating.learned)."""
    thr = saved["threshold"] if threshold is None else threshold
    model = saved["model"]
    if getattr(model, "level", "block") == "token":
        return LearnedTokenGate(model, thr, name or saved.get("name"), saved.get("verify", "alone"),
                                saved.get("verify_rank"))
    return LearnedGate(model, thr, name or saved.get("name"))


def load_gate(params: Params, name: str, threshold: float | dict | None = None, cache: dict | None = None,
              fold: int | None = None):
    """A learned gate from models/gates/<name>.pkl (`fold`: the cross-fitted one that evaluates that
    fold), at `threshold` (default: the promote budget's, per language)."""
    path = gate_dir(params, fold) / f"{name}.pkl"
    if cache is not None and path in cache:
        saved = cache[path]
    else:
        if not path.exists():
            raise FileNotFoundError(f"{path}: no trained gate {name!r} (run the `gates` stage: dvc repro gates)")
        with open(path, "rb") as fh:
            saved = pickle.load(fh)
        if cache is not None:
            cache[path] = saved
    return gate_from_saved(saved, threshold, name)


def head_path(params: Params) -> Path:
    return Path(params.models.dir) / "wisv" / "head.pt"


def cached_head(params: Params, cache: dict):
    """The trained head, loaded once per worker process (reloaded when the file changes)."""
    path = head_path(params)
    stamp = (str(path), path.stat().st_mtime_ns if path.exists() else None)
    if cache.get("wisv_stamp") != stamp:
        cache["wisv_head"] = load_head(path)
        cache["wisv_stamp"] = stamp
    return cache["wisv_head"]
