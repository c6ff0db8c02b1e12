"""DVC stage `gates`: token gates trained on the on-policy traces, DAgger rounds, the verify R
chosen, each gate logged and registered in MLflow (speccap.pipeline.gates_stage), as a Prefect flow."""

from __future__ import annotations

from prefect import flow

from flows import stage_main
from speccap.config import load_params
from speccap.pipeline.gates_stage import run_gates


@flow(name="speccap-gates")
def gates_flow(params_path: str | None = None) -> dict:
    return run_gates(load_params(params_path), params_path)


if __name__ == "__main__":
    stage_main(gates_flow, "gates")
