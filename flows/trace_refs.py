"""DVC stage `trace_refs`: the train and validation clips with the references their corrections are
judged against (human, or the cloud-only caption for a trace pool and with data.trace_references:
cloud), as a Prefect flow; the counts go to reports/trace_refs.json and to MLflow."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow
from tqdm import tqdm

from flows import stage_main
from speccap.config import load_params
from speccap.pipeline.trace_refs import build_trace_refs, count_cloud_captions
from speccap.pipeline.workers import Pool
from speccap.tracking import Tracker

REPORT = Path("reports/trace_refs.json")


@flow(name="speccap-trace-refs")
def trace_refs_flow(params_path: str | None = None) -> dict:
    params = load_params(params_path)
    total = count_cloud_captions(params)
    pool = Pool.for_stage(params, params_path, "trace_refs") if total else None
    bar = tqdm(total=total, desc="cloud references", unit="clip", disable=not total)
    try:
        report = build_trace_refs(params, pool, progress=bar.update)
    finally:
        bar.close()
        if pool is not None:
            pool.close()
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(report, indent=1))
    tracker = Tracker.for_stage(params.tracking.uri, params.tracking.experiment, "trace_refs")
    key = f"trace-refs-{report['models']}-{params.data.trace_references}"
    with tracker.sweep(key, {"trace_references": params.data.trace_references}, {"sweep_key": key,
                                                                                 "stage": "trace_refs"}) as parent:
        for name, stats in report["splits"].items():
            tracker.log_config(parent, f"{key}-{name}", f"trace-refs-{name}", {"split": name},
                               {k: v for k, v in stats.items() if v is not None})
    return report


if __name__ == "__main__":
    stage_main(trace_refs_flow, "trace_refs")
