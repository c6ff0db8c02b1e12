"""Where the learned deciders are saved and how a decoder loads them: the token gates
(models/gates/<name>.gate.json, gating.gate_file; per fold under cross-fitting) and the WISV head
(models/wisv/head.pt). The decoding workers (pipeline.sweep), the stages that train them and the CLI
read them here, so loading a decider never needs the code that trains it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..config import Params
from ..decoding.wisv.head import load_head
from ..gating.gate_file import SUFFIX, model_of, read_gate
from ..gating.token_gates import LearnedTokenGate, TokenGateModel


def gate_dir(params: Params, fold: int | None = None) -> Path:
    """Where the gates are saved: the shipped ones, or under cross-fitting those that evaluate
    `fold` (pipeline.splits)."""
    root = Path(params.models.dir) / "gates"
    return root if fold is None else root / "folds" / str(fold)


def gate_path(params: Params, name: str, fold: int | None = None) -> Path:
    return gate_dir(params, fold) / f"{name}{SUFFIX}"


def champion_path(params: Params) -> Path:
    """The promoted gate's file, as the promote stage ships it to devices."""
    return Path(params.models.dir) / f"champion{SUFFIX}"


def gate_from_document(doc: dict, threshold: float | dict | None = None, name: str | None = None,
                       model: TokenGateModel | None = None) -> LearnedTokenGate:
    """The token gate a gate file's document describes, at `threshold` (default: its own, the
    promote budget's per language), scoring with `model` (default: the one the document holds)."""
    return LearnedTokenGate(model or model_of(doc, name or doc.get("name", "gate")),
                            doc["threshold"] if threshold is None else threshold, name or doc.get("name"),
                            doc.get("verify", "alone"), doc.get("verify_rank"))


def load_gate(params: Params, name: str, threshold: float | dict | None = None, cache: dict | None = None,
              fold: int | None = None, through: Callable[[TokenGateModel], object] | None = None
              ) -> LearnedTokenGate:
    """A learned gate from models/gates/<name>.gate.json (`fold`: the cross-fitted one that evaluates
    that fold), at `threshold` (default: the promote budget's, per language). With `cache`, each
    file is read and its model built once (parsing a LightGBM model takes milliseconds: once per
    worker, not once per caption); `through` wraps the built model (a batching executor's scorer)."""
    path = gate_path(params, name, fold)
    if cache is not None and path in cache:
        doc, model = cache[path]
    else:
        if not path.exists():
            raise FileNotFoundError(f"{path}: no trained gate {name!r} (run the `gates` stage: dvc repro gates)")
        doc = read_gate(path)
        model = model_of(doc, str(path))
        model = through(model) if through is not None else model
        if cache is not None:
            cache[path] = doc, model
    return gate_from_document(doc, threshold, name, model)


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
