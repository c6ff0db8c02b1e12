"""DVC stage `decode`: the sweep of edge-only, cloud-only and UGSD configurations, as a Prefect flow.

One MLflow parent run per sweep (resumed, not duplicated, on a rerun of the same sweep), one
nested run per configuration with params, metrics and the per-caption records. A configuration
that fails is logged FAILED with its error and the others go on; finished ones are not redone.
"""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow

from flows import stage_main
from flows.sweep_hooks import sweep_hooks
from speccap.config import load_params, materialize
from speccap.pipeline.sweep import build_configs, sweep_clips
from speccap.pipeline.sweep_run import run_sweep

SUMMARY = Path("reports/decode_summary.json")
# edge-only and cloud-only alone: the gate evaluation reads these, and they change only when those
# two configurations do (not on a change of L or of a gate, which re-runs this stage)
REFERENCES = Path("reports/references.json")


@flow(name="speccap-decode")
def decode_flow(params_path: str | None = None, overrides: dict | None = None) -> dict:
    """`overrides`: dotted params keys on top of the file (a deployment's parameters)."""
    params_path = materialize(params_path, overrides)
    params = load_params(params_path)
    configs = build_configs(params)
    summary = run_sweep(params, params_path, "decode", configs, sweep_clips(params), params.sweep.runs_dir,
                        hooks=sweep_hooks())
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    refs = [{k: v for k, v in c.items() if k != "worker"} for c in summary["configs"] if c["method"] in ("edge", "cloud")]
    REFERENCES.write_text(json.dumps({"configs": refs}, indent=1, ensure_ascii=False))
    failed = [c["name"] for c in summary["configs"] if c["status"] == "FAILED"]
    return {"configs": len(configs), "failed": failed}


if __name__ == "__main__":
    stage_main(decode_flow, "decode")
