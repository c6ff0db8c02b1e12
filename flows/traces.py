"""DVC stage `traces`: the token gates' on-policy traces on the train and validation splits, as a
Prefect flow.

The edge writes its own caption, one cloud forward scores every token, and every mismatch is
judged by correcting it and letting the edge finish (gating.shadow). Per-clip records are appended
as they come (an interrupted run resumes); the tables go to data/traces/*.parquet and their
summary to reports/traces.json and to MLflow.
"""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow
from tqdm import tqdm

from flows import stage_main
from speccap.config import load_params
from speccap.pipeline.traces import TRACE_DIR, collect, shadow_one, summary, trace_clips, traces_key
from speccap.pipeline.workers import Pool
from speccap.tracking import Tracker

SUMMARY = Path("reports/traces.json")


@flow(name="speccap-traces")
def traces_flow(params_path: str | None = None) -> dict:
    params = load_params(params_path)
    total = sum(len(trace_clips(params, s, lang)) for s in ("train", "val") for lang in params.data.languages)
    pool = Pool.for_stage(params, params_path, "traces", fn=shadow_one)
    bar = tqdm(total=total, desc="traces", unit="clip")
    try:
        tables = collect(params, pool, TRACE_DIR, progress=bar.update)
    finally:
        bar.close()
        pool.close()
    for split, df in tables.items():
        df.to_parquet(TRACE_DIR / f"{split}.parquet", index=False)
    result = summary(tables)
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(json.dumps(result, indent=1))
    key = traces_key(params)
    tracker = Tracker.for_stage(params.tracking.uri, params.tracking.experiment, "traces")
    with tracker.sweep(f"traces-{key}", {"traces": params.gates.traces.__dict__, "rank": params.decode.rank},
                       {"sweep_key": f"traces-{key}", "stage": "traces"}) as parent:
        for split, stats in result.items():
            tracker.log_config(parent, f"traces-{key}-{split}", f"traces-{split}", {"split": split}, stats)
    return result


if __name__ == "__main__":
    stage_main(traces_flow, "traces")
