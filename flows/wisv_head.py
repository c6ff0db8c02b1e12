"""DVC stage `wisv_head`: WISV's decision head from hidden-state traces, trained, measured on
validation, saved to models/wisv/head.pt and registered in MLflow (speccap.pipeline.wisv_head), as
a Prefect flow."""

from __future__ import annotations

from prefect import flow

from flows import stage_main
from speccap.config import load_params
from speccap.pipeline.wisv_head import run_wisv_head


@flow(name="speccap-wisv-head")
def wisv_head_flow(params_path: str | None = None) -> dict:
    return run_wisv_head(load_params(params_path), params_path)


if __name__ == "__main__":
    stage_main(wisv_head_flow, "wisv_head")
