"""DVC stage `promote`: the best learned gate on validation (by the share of both gaps it closes,
against edge-only and cloud-only on the same clips) gets alias `champion` in the MLflow
registry if it beats the current champion at the same budget; the decision and why go to
reports/promotion.json and onto the model version, and the champion ships as
models/champion.gate.json (speccap.pipeline.promote), as a Prefect flow."""

from __future__ import annotations

from prefect import flow

from flows import stage_main
from speccap.config import load_params
from speccap.pipeline.promote import run_promote


@flow(name="speccap-promote")
def promote_flow(params_path: str | None = None) -> dict:
    return run_promote(load_params(params_path))


if __name__ == "__main__":
    stage_main(promote_flow, "promote")
