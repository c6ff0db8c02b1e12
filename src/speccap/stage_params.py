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
                "decode.edge_time_scale", "decode.cloud_time_scale")
# whether the gates learn from folds of the test clips (pipeline.folds.active), and how many
_CROSS_FIT = ("data.source", "data.trace_pool.path", "data.cross_fit")
STAGE_PARAMS: dict[str, tuple[str, ...]] = {
    "prepare": ("seed", "data"),
    "featurize": ("features", "data.max_clip_seconds"),
    "train": ("seed", "models", "features", "data.languages"),
    "decode": ("seed", "decode", "link", "sweep", "qs", "models.max_new_tokens", "data.languages",
               "tracking.experiment"),
    "report": ("decode", "link", "data.languages"),
    "trace_refs": ("seed", "data.trace_references", *_CROSS_FIT, "decode.temperature", "decode.cloud_time_scale",
                   "models.max_new_tokens", "data.languages", "sweep.workers", "sweep.threads"),
    "traces": ("seed", "data.trace_references", "gates.traces", "decode.rank", "models.max_new_tokens", "data.languages"),
    # the link changes when the DAgger and verify-rank captions' clocks tick, not what they say: not listed
    "gates": ("seed", "gates.kinds", "gates.targets", "gates.impact_weight", "gates.baselines", "gates.budgets", "gates.registry_name",
              "gates.verify", "gates.verify_ranks", "gates.promote_budget", "gates.traces", "gates.dagger",
              *_GATE_DECODE, "sweep.workers", "sweep.threads", "models.max_new_tokens", "data.languages",
              *_CROSS_FIT, "tracking.experiment"),
    # gates are evaluated at the block length their thresholds were calibrated on (gates.traces.block_len),
    # so a change of decode.block_len leaves them alone
    "gate_eval": ("seed", "gates", *_GATE_DECODE, *_CROSS_FIT, "link", "sweep.workers", "sweep.threads", "models.max_new_tokens",
                  "data.languages", "tracking.experiment"),
    "promote": ("seed", "gates", *_GATE_DECODE, "link", "sweep.workers", "sweep.threads", "models.max_new_tokens",
                "data.languages", "tracking.experiment"),
    "wisv_head": ("seed", "wisv.traces", "wisv.kappa", "wisv.policy_temperature", "wisv.budget_min",
                  "wisv.budget_max", "wisv.csi_draws", "wisv.hidden", "wisv.dropout", "wisv.epochs", "wisv.lr",
                  "wisv.rank", "wisv.scalars", "wisv.weight_decay", "wisv.patience", "wisv.labels",
                  "gates.traces",
                  "wisv.registry_name", "models.max_new_tokens", "data.languages", "tracking.experiment"),
    # its edge-only, cloud-only and greedy runs read decode's temperature and clocks, and the link
    "wisv_eval": ("seed", "wisv", "decode.rank", "decode.temperature", "decode.edge_time_scale",
                  "decode.cloud_time_scale", "link", *_CROSS_FIT, "sweep.workers", "sweep.threads", "models.max_new_tokens",
                  "data.languages", "tracking.experiment"),
}


def stage_params(p: Params, stage: str) -> dict:
    """The resolved values of the keys `stage` depends on, as plain data (dotted key -> value)."""
    if stage not in STAGE_PARAMS:
        raise ConfigError(f"unknown stage {stage!r} (have {sorted(STAGE_PARAMS)})")
    out = {}
    for key in STAGE_PARAMS[stage]:
        value = p
        for part in key.split("."):
            value = getattr(value, part)
        out[key] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
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
