"""The `decode` stage, start to end: the sweep of edge-only, cloud-only and UGSD configurations
(speccap.pipeline.sweep builds them), one MLflow parent run per sweep (resumed, not duplicated, on
a rerun of the same sweep), one nested run per configuration with params, metrics and the
per-caption records. A configuration that fails is logged FAILED with its error and the others go
on; finished ones are not redone."""

from __future__ import annotations

import json
from pathlib import Path

from ..config import Params
from .sweep import build_configs, sweep_clips
from .sweep_run import SweepHooks, run_sweep

SUMMARY = Path("reports/decode_summary.json")
# edge-only and cloud-only alone: the gate evaluation reads these, and they change only when those
# two configurations do (not on a change of L or of a gate, which re-runs this stage)
REFERENCES = Path("reports/references.json")


def run_decode(params: Params, params_path: str | None, hooks: SweepHooks | None = None) -> dict:
    """Decode every configuration (`hooks`: what the calling flow lends the sweep), write the
    summary and the references; how many configurations ran and which failed is what it returns."""
    configs = build_configs(params)
    summary = run_sweep(params, params_path, "decode", configs, sweep_clips(params), params.sweep.runs_dir,
                        hooks=SweepHooks() if hooks is None else hooks)
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    refs = [{k: v for k, v in c.items() if k != "worker"} for c in summary["configs"] if c["method"] in ("edge", "cloud")]
    REFERENCES.write_text(json.dumps({"configs": refs}, indent=1, ensure_ascii=False))
    failed = [c["name"] for c in summary["configs"] if c["status"] == "FAILED"]
    return {"configs": len(configs), "failed": failed}
