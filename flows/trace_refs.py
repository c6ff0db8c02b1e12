"""DVC stage `trace_refs`: the train and validation clips with the references their corrections are
judged against (human, or the cloud-only caption for a trace pool and with data.trace_references:
cloud; speccap.pipeline.trace_refs), as a Prefect flow; the counts go to reports/trace_refs.json and
to MLflow."""

from __future__ import annotations

from prefect import flow

from flows import stage_main
from speccap.config import load_params
from speccap.pipeline.trace_refs import run_trace_refs


@flow(name="speccap-trace-refs")
def trace_refs_flow(params_path: str | None = None) -> dict:
    return run_trace_refs(load_params(params_path), params_path)


if __name__ == "__main__":
    stage_main(trace_refs_flow, "trace_refs")
