"""What each DVC stage depends on among the params, resolved (the `resolve` stage writes them).

DVC tracks params by their keys in params.yaml, so a stage listing `profiles` would re-run when
ANY profile changes, and one not listing it would miss its own profile's overrides. Instead the
`resolve` stage writes, per stage, the values it really uses after the profile is applied
(resolved/<stage>.json); the stage depends on that file, which only changes when they do.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from .config import ConfigError, Params

_GATE_DECODE = ("decode.temperature", "decode.rule", "decode.rank", "decode.in_flight", "decode.draft_ahead",
                "decode.edge_time_scale", "decode.cloud_time_scale", "decode.cost")
# whether the gates learn from folds of the test clips (pipeline.splits.active), how many, and the test
# clips (sweep.clips) the folds are dealt from, which the gates and the WISV head are evaluated on too
_CROSS_FIT = ("data.source", "data.trace_pool.path", "data.cross_fit", "sweep.clips")
# what the models a stage decodes with are loaded from and as (a trained model's other settings
# re-run `train`, whose models/ every decoding stage depends on), and the caption length
_MODELS = (*(f"models.{role}.{k}" for role in ("edge", "cloud") for k in ("backend", "path", "dtype", "family", "size")),
           "models.max_new_tokens")
# how a stage's captions are stepped: how many at once, batch-invariant stepping with the room it
# leaves for the longest clip (pipeline.workers.invariance), and the prompts kept across captions
_EXECUTOR = ("sweep.batch", "sweep.invariant_rows", "sweep.prompt_cache_mb", "data.max_clip_seconds",
             "features.sample_rate", "features.hop_length")
_WISV_RULE = ("wisv.tau", "wisv.protocol", "wisv.max_rank")  # what a wisv-rule configuration decodes with
STAGE_PARAMS: dict[str, tuple[str, ...]] = {
    "prepare": ("seed", "data"),
    "featurize": ("features", "data.max_clip_seconds", "data.languages"),
    "train": ("seed", "models", "features", "uplink", "data.languages"),
    "decode": ("seed", "decode", "link", "sweep", "qs", *_MODELS, *_WISV_RULE, "wisv.channels", "data.source",
               "data.languages", "tracking.experiment"),
    "report": ("decode", "link", "sweep.detail_clips", "data.languages", "tracking.experiment"),
    "trace_refs": ("seed", "data.trace_references", *_CROSS_FIT, "decode.temperature", "decode.cloud_time_scale",
                   "decode.cost",
                   *_MODELS, "data.languages", "sweep.workers", "sweep.threads", *_EXECUTOR, "tracking.experiment"),
    "traces": ("seed", "data.trace_references", "gates.traces", "gates.entropy_temperatures", "decode.rank", *_MODELS,
               "data.languages", "sweep.workers", "sweep.threads", *_EXECUTOR, "tracking.experiment"),
    "gates": ("seed", "gates.kinds", "gates.targets", "gates.impact_weight", "gates.baselines", "gates.budgets",
              "gates.registry_name", "gates.verify", "gates.verify_ranks", "gates.promote_budget", "gates.traces",
              "gates.dagger", "gates.entropy_temperatures", "data.trace_references", *_GATE_DECODE, "sweep.workers",
              "sweep.threads", *_EXECUTOR, *_MODELS, "data.languages", *_CROSS_FIT, "tracking.experiment"),
    # gates are evaluated at the block length their thresholds were calibrated on (gates.traces.block_len),
    # so a change of decode.block_len leaves them alone
    "gate_eval": ("seed", "gates", *_GATE_DECODE, *_CROSS_FIT, "link", "sweep.workers", "sweep.threads", *_EXECUTOR, *_MODELS,
                  "wisv.channels", "data.languages", "tracking.experiment"),
    "promote": ("seed", "gates", *_GATE_DECODE, "link", "sweep.workers", "sweep.threads", *_EXECUTOR, *_MODELS,
                "data.languages", "tracking.experiment"),
    "wisv_head": ("seed", "wisv.traces", "wisv.kappa", "wisv.policy_temperature", "wisv.budget_min",
                  "wisv.budget_max", "wisv.csi_draws", "wisv.hidden", "wisv.dropout", "wisv.epochs", "wisv.lr",
                  "wisv.rank", "wisv.scalars", "wisv.weight_decay", "wisv.patience", "wisv.labels",
                  "wisv.critical_weight", "wisv.tau", "wisv.registry_name", "gates.traces", "gates.entropy_temperatures",
                  "data.trace_references",
                  "decode.rank", *_EXECUTOR, *_MODELS, "data.languages", "tracking.experiment"),
    # its edge-only, cloud-only and greedy runs read decode's temperature and clocks, and the link
    "wisv_eval": ("seed", "wisv", "decode.rank", "decode.temperature", "decode.edge_time_scale",
                  "decode.cloud_time_scale", "decode.cost", "link", *_CROSS_FIT, "sweep.workers", "sweep.threads", *_EXECUTOR, *_MODELS,
                  "data.languages", "tracking.experiment"),
    "privacy": ("seed", "privacy", "uplink", "features", "data.languages", "tracking.experiment"),
    "headline": ("data.languages",),
}


# Keys a stage reads without its outputs depending on them through its params, one place with the
# reason: ("*", key) for every stage. speccap.params_reads records what stages read; uncovered() holds
# those records against STAGE_PARAMS and this.
READ_NOT_RESULTS: dict[tuple[str, str], str] = {
    **{("*", k): "a path dvc.yaml fixes as the stage's deps and outs" for k in
       ("data.raw_dir", "data.processed_dir", "models.dir", "sweep.runs_dir")},
    ("*", "tracking.uri"): "where MLflow records the results, not what they are",
    ("*", "tracking.prefect_api_url"): "where Prefect shows the runs",
    ("*", "profile"): "its values are resolved into every other key",
    ("*", "cluster"): "where configurations run (local processes or Dask): the same records either way "
                      "(tests/flows/test_cluster.py)",
    ("*", "sweep.audio_cache_mb"): "how much of the audio encoder's work a worker keeps: the same bits either "
                                   "way (tests/models/test_thinker.py)",
    ("gates", "link"): "the DAgger and verify-rank captions' clocks, not what they say",
    ("trace_refs", "link"): "the clocks of the cloud-only captions it keeps, not what they say",
}


def _covers(entry: str, key: str) -> bool:
    return key == entry or key.startswith(entry + ".")


def uncovered(reads: dict[str, set[str]], table: dict[str, tuple[str, ...]] | None = None,
              declared: dict[tuple[str, str], str] | None = None) -> list[str]:
    """One line per key a stage was recorded reading (speccap.params_reads) that neither its entry in
    `table` (STAGE_PARAMS) nor `declared` (READ_NOT_RESULTS) covers: a change of it would leave the
    stage's outputs stale. Records of processes that are not a stage of `table` are ignored."""
    table = STAGE_PARAMS if table is None else table
    declared = READ_NOT_RESULTS if declared is None else declared
    lines = []
    for stage in sorted(set(reads) & set(table)):
        free = [e for (s, e) in declared if s in ("*", stage)]
        for key in sorted(reads[stage]):
            if not any(_covers(e, key) for e in (*table[stage], *free)):
                lines.append(f"stage {stage} reads params key {key}, which STAGE_PARAMS[{stage!r}] does not list "
                             "(list it, or declare it in READ_NOT_RESULTS with the reason)")
    return lines


def unread(reads: dict[str, set[str]], table: dict[str, tuple[str, ...]] | None = None) -> dict[str, list[str]]:
    """stage -> the entries of its STAGE_PARAMS that no recorded read touched: each may be a dependency
    of a path these records did not take, or one too many (it re-runs the stage for nothing)."""
    table = STAGE_PARAMS if table is None else table
    return {stage: [e for e in table[stage] if not any(_covers(e, k) for k in reads[stage])]
            for stage in sorted(set(reads) & set(table))}


def _plain(value):
    """A params value as JSON-ready data (a section, or a mapping of sections like wisv.channels)."""
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def stage_params(p: Params, stage: str) -> dict:
    """The resolved values of the keys `stage` depends on, as plain data (dotted key -> value)."""
    if stage not in STAGE_PARAMS:
        raise ConfigError(f"unknown stage {stage!r} (have {sorted(STAGE_PARAMS)})")
    out = {}
    for key in STAGE_PARAMS[stage]:
        value = p
        for part in key.split("."):
            value = getattr(value, part)
        out[key] = _plain(value)
    return out


def write_resolved(p: Params, out_dir: str | os.PathLike) -> list[Path]:
    """Write resolved/<stage>.json for every stage; a file is rewritten only if its content changes."""
    import json
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for stage in STAGE_PARAMS:
        path = out / f"{stage}.json"
        text = json.dumps(stage_params(p, stage), indent=1, sort_keys=True, default=list) + "\n"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        written.append(path)
    return written
