"""DAgger rounds for the token gates (the `gates` stage, params gates.dagger).

The first gates learn from the edge's own captions, but a deployed gate leaves that trajectory at
its first correction, and the positions after it are states the first traces never showed. Each
round therefore decodes train and validation clips with the current chosen gate (the main
target's, pipeline.gates.main_gate, at the promote budget), traces the captions the loop committed (gating.shadow with
`committed`: what the edge drafted at every position, the cloud's rank of it, every mismatch judged
by correcting it against keeping the draft, the edge finishing), adds the train traces to the
training set and trains every gate again. Thresholds and the chosen classifiers come from the
round's validation traces: the budget is a share of the tokens the gate meets where it is deployed.

Traces are written per clip as they come under data/dagger/round<k>/ (resumable, like the first
round's); traces made under another gate or other models are made again.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from ..config import Params
from ..gating.gate_file import model_of
from .gates import main_gate, roc_auc, train_gates
from .saved import gate_path
from .traces import DaggerSettings, collect, dagger_one, features_of, shadow_summary, trace_clips
from .workers import Pool

DAGGER_DIR = Path("data/dagger")


def round_gate(result: dict) -> str:
    """The gate a round decodes with: the chosen gate of the main target (the first of gates.targets)."""
    return main_gate(result["chosen"])


def round_counts(params: Params) -> SimpleNamespace:
    d = params.gates.dagger
    return SimpleNamespace(train_clips=d.train_clips, val_clips=d.val_clips or params.gates.traces.val_clips)


def round_settings(params: Params, name: str, budget: float | None = None):
    """The round's trace settings (the gate at its thresholds for `budget`, default its own: the
    promote budget's; its file's hash) and the gate's model, from one read of
    models/gates/<name>.gate.json."""
    blob = gate_path(params, name).read_bytes()
    saved = json.loads(blob)
    if budget is not None and str(budget) not in saved["thresholds"]:
        raise ValueError(f"{gate_path(params, name)}: no thresholds for budget {budget} (it has "
                         f"{', '.join(saved['thresholds'])}; gates.budgets)")
    threshold = saved["threshold"] if budget is None else saved["thresholds"][str(budget)]
    settings = DaggerSettings(rank=params.decode.rank, critical_margin=params.gates.traces.critical_margin,
                              max_new_tokens=params.models.max_new_tokens, gate=name, threshold=threshold,
                              verify=params.gates.verify, gate_sha=hashlib.sha256(blob).hexdigest()[:12],
                              entropy_temperatures=tuple(params.gates.entropy_temperatures))
    return settings, model_of(saved, name)


def dagger_rounds(params: Params, params_path: str | None, train: pd.DataFrame, val: pd.DataFrame, result: dict,
                  out_dir: Path = DAGGER_DIR, workers: int | None = None, progress=None,
                  budget: float | None = None) -> tuple[dict, list[dict]]:
    """Run params.gates.dagger.rounds rounds after the first gates (`result`, trained on `train`
    and `val`), each round's gate at its thresholds for `budget` (default: the promote budget's).
    Returns the last gates.json content and one summary per round."""
    rounds = []
    counts = round_counts(params)
    for k in range(1, params.gates.dagger.rounds + 1):
        name = round_gate(result)
        settings, model = round_settings(params, name, budget)
        pool = Pool.for_stage(params, params_path, "gates", fn=dagger_one, workers=workers)
        try:
            tables = collect(params, pool, out_dir / f"round{k}", progress=progress, settings=settings, counts=counts)
        finally:
            pool.close()
        for df in tables.values():
            if len(df):
                df.insert(2, "round", k)
        train = pd.concat([train, tables["train"]], ignore_index=True)
        val = tables["val"]
        stats = shadow_summary(tables)
        # the round's gate on the trajectories it led to (the shift the first traces did not show),
        # then the gates trained again with them, on the same validation traces
        scores = model.token_scores(features_of(val))
        before = {t: roc_auc(val[t].to_numpy(bool), scores) for t in ("mismatch", "critical")}
        result = train_gates(params, train, val)
        rounds.append({"round": k, "gate": name, "threshold": settings.threshold, "traces": stats,
                       "train_tokens": int(len(train)), "val_auc_before": before,
                       "val_auc_after": {t: result["gates"][round_gate(result)].get(f"auc_{t}")
                                         for t in ("mismatch", "critical")}, "chosen_after": round_gate(result),
                       "corrected_share_of_val_tokens": float((~val["kept"].astype(bool)).mean()) if len(val) else 0.0})
    ran = {f"round{k}" for k in range(1, params.gates.dagger.rounds + 1)}
    for old in out_dir.glob("round*"):  # rounds an earlier run had beyond this one's: no output of it
        if old.is_dir() and old.name not in ran:
            shutil.rmtree(old)
    return result, rounds


def total_clips(params: Params) -> int:
    """Clips a DAgger run traces (for a progress bar)."""
    counts = round_counts(params)
    per_round = sum(len(trace_clips(params, s, lang, counts)) for s in ("train", "val") for lang in params.data.languages)
    return per_round * params.gates.dagger.rounds
