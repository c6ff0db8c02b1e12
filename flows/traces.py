"""DVC stage `traces`: the token gates' on-policy traces on the train and validation splits
(speccap.pipeline.traces), as a Prefect flow.

The edge writes its own caption, one cloud forward scores every token, and every mismatch is
judged by correcting it and letting the edge finish (gating.shadow). Per-clip records are appended
as they come (an interrupted run resumes); the tables go to data/traces/*.parquet and their
summary to reports/traces.json and to MLflow.
"""

from __future__ import annotations

from prefect import flow

from flows import stage_main
from speccap.config import load_params
from speccap.pipeline.traces import run_traces


@flow(name="speccap-traces")
def traces_flow(params_path: str | None = None) -> dict:
    return run_traces(load_params(params_path), params_path)


if __name__ == "__main__":
    stage_main(traces_flow, "traces")
