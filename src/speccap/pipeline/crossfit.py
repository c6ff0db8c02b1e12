"""Cross-fitted gates (params data.cross_fit; which clip is in which fold: pipeline.splits).

The `gates` stage trains, beside the shipped gates, one set per fold f: every gate of
params.gates fitted on the first traces of the folds other than f and f + 1, thresholded on fold
f + 1, saved under models/gates/folds/<f>/, its flagged tokens judged by the R the shipped gates
chose. DAgger rounds are the shipped gates' alone: their traces were made under a gate that had
learned from every fold, so a fold's gates do not take them.

The `gate_eval` stage then decodes each test clip with the gates of its own fold (RunConfig.fold)
and pools the folds' records per gate and budget: one row per gate over every referenced clip,
each clip scored by a gate that never saw it, with the usual paired intervals. Edge-only,
cloud-only and the oracle do not depend on a gate and run once over all clips.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import Params
from ..data.manifest import read_jsonl
from .gate_names import untuned_name
from .gate_report import gate_configs
from .gates import train_gates
from .saved import gate_dir
from .splits import referenced_clips, val_fold
from .sweep import RunConfig, summarize
from .verify_rank import stamp_gates


def fold_column(params: Params, traces: pd.DataFrame) -> np.ndarray:
    """Each trace row's fold (-1 for a clip that is not a referenced one)."""
    fold = {(lang, r["id"]): r["fold"] for lang in params.data.languages for r in referenced_clips(params, lang)}
    return np.array([fold.get(key, -1) for key in zip(traces["language"], traces["clip_id"])], dtype=int)


def train_fold_gates(params: Params, train: pd.DataFrame, val: pd.DataFrame, verify_rank: dict[str, int],
                     progress=None) -> dict:
    """Every fold's gates from the first traces (`train` and `val` together hold each traced
    referenced clip once). Returns gates.json's "cross_fit" entry."""
    traces = pd.concat([train, val], ignore_index=True)
    fold = fold_column(params, traces)
    k = params.data.cross_fit.folds
    per_fold = []
    for f in range(k):
        v = val_fold(f, k)
        tr, va = traces[(fold != f) & (fold != v) & (fold >= 0)], traces[fold == v]
        result = train_gates(params, tr.reset_index(drop=True), va.reset_index(drop=True), gate_dir(params, f))
        stamp_gates(params, verify_rank, f)
        per_fold.append({"fold": f, "val_fold": v, "train_clips": int(tr["clip_id"].nunique()),
                         "val_clips": int(va["clip_id"].nunique()), "chosen": result["chosen"],
                         "auc_critical": {n: g.get("auc_critical") for n, g in result["gates"].items()
                                          if g["kind"] != "rule"}})
        if progress is not None:
            progress()
    return {"folds": k, "per_fold": per_fold, "dagger": "shipped gates only"}


def fold_gates_json(params: Params, fold: int, shipped: dict) -> dict:
    """A fold's gates.json with the shipped gates' choices (which classifier per target, which R):
    every fold evaluates the gates that ship, each trained without it."""
    path = gate_dir(params, fold) / "gates.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no cross-fitted gates of fold {fold} (run the `gates` stage: dvc repro gates)")
    own = json.loads(path.read_text())
    return own | {"chosen": shipped["chosen"], "verify_rank": shipped.get("verify_rank", {})}


def crossfit_configs(params: Params, shipped: dict) -> tuple[list[RunConfig], dict[RunConfig, dict]]:
    """gate_configs with each gated configuration once per fold (its own gate and thresholds) and
    the gate-free ones (edge, cloud, the oracle) once. Without the entropy rule's row at T = 1: each
    fold tunes its own temperature, so that row would exist in some folds and not in others."""
    configs, tags = gate_configs(params, shipped)
    out = [c for c in configs if tags.get(c, {}).get("budget") is None]
    out_tags = {c: tags[c] for c in out if c in tags}
    untuned = {untuned_name(rule) for rule in params.gates.baselines}
    for f in range(params.data.cross_fit.folds):
        fold_cfgs, fold_tags = gate_configs(params, fold_gates_json(params, f, shipped))
        for c in fold_cfgs:
            if fold_tags.get(c, {}).get("budget") is not None and fold_tags[c]["gate_name"] not in untuned:
                cf = c.with_spec(fold=f)
                out.append(cf)
                out_tags[cf] = fold_tags[c] | {"fold": f}
    return out, out_tags


def fold_clips(base):
    """A configuration's clips: `base(cfg)`, only its own fold's for a fold's configuration."""
    def clips(cfg: RunConfig) -> list[dict]:
        recs = base(cfg)
        return recs if cfg.fold is None else [r for r in recs if r["fold"] == cfg.fold]
    return clips


def pool_folds(summary: dict, configs: list[RunConfig], tags: dict[RunConfig, dict], clips_of, runs_dir: Path) -> dict:
    """The summary with each gate's fold rows replaced by one row over all their clips (their records
    read back and scored together); a gate with a failed fold is one FAILED row."""
    by_name = {c.name: c for c in configs}
    keep, groups = [], {}
    for row in summary["configs"]:
        cfg = by_name.get(row["name"])
        if cfg is None or cfg.fold is None:
            keep.append(row)
            continue
        # one row per gate and budget: the folds' thresholds (and the entropy baseline's tuned
        # temperatures) differ, so the budget tells them apart
        tag = tags[cfg]
        key = (cfg.with_spec(fold=None, threshold=None, gate_temperature=None), tag["gate_name"],
               tag["budget"])
        groups.setdefault(key, []).append((cfg, row))
    for (pooled, _, budget), members in groups.items():
        tag = {k: v for k, v in tags[members[0][0]].items() if k != "fold"}
        folds = {cfg.fold: {"config_id": row["config_id"], "threshold": cfg.spec.threshold,
                            "gate_temperature": cfg.spec.gate_temperature, "clips": row["clips"]}
                 for cfg, row in members}
        head = {"config_id": "+".join(row["config_id"] for _, row in members),
                "name": f"{pooled.name}-rho{budget:g}-crossfit", **pooled.to_dict(), **tag, "folds": folds}
        failed = [row for _, row in members if row["status"] != "FINISHED"]
        if failed:
            keep.append(head | {"clips": 0, "status": "FAILED", "error": failed[0].get("error", "a fold failed")})
            continue
        clips, records = [], []
        for cfg, row in sorted(members, key=lambda m: m[0].fold):
            clips += clips_of(cfg)
            records += read_jsonl(runs_dir / f"{row['config_id']}.jsonl")
        by_id = {r["id"]: r for r in records}
        records = [by_id[c["id"]] for c in clips]
        metrics = summarize(pooled, records, clips)
        stats = metrics.pop("clip_stats")
        keep.append(head | {"clips": len(clips), "status": "FINISHED", "metrics": metrics, "clip_stats": stats})
    return summary | {"configs": keep}
