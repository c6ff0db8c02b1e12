"""DVC stage `gate_eval`: the oracle, the ceiling, the entropy baselines and the chosen token gates
at every budget on the test clips (speccap.pipeline.gate_eval), as a Prefect flow: each
configuration a Prefect task of the sweep."""

from __future__ import annotations

from prefect import flow

from flows import stage_main
from flows.sweep_hooks import sweep_hooks
from speccap.config import load_params, materialize
from speccap.pipeline.gate_eval import run_gate_eval


@flow(name="speccap-gate-eval")
def gate_eval_flow(params_path: str | None = None, overrides: dict | None = None) -> dict:
    """`overrides`: dotted params keys on top of the file (a deployment's parameters)."""
    params_path = materialize(params_path, overrides)
    return run_gate_eval(load_params(params_path), params_path, sweep_hooks())


if __name__ == "__main__":
    stage_main(gate_eval_flow, "gate_eval")
