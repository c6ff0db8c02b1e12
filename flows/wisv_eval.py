"""DVC stage `wisv_eval`: WISV against greedy and rank-R verification over the channels of
wisv.channels and the draft windows of wisv.block_lens (speccap.pipeline.wisv_eval), as a Prefect
flow: each configuration a Prefect task of the sweep."""

from __future__ import annotations

from prefect import flow

from flows import stage_main
from flows.sweep_hooks import sweep_hooks
from speccap.config import load_params, materialize
from speccap.pipeline.wisv_eval import run_wisv_eval


@flow(name="speccap-wisv-eval")
def wisv_eval_flow(params_path: str | None = None, overrides: dict | None = None) -> dict:
    """`overrides`: dotted params keys on top of the file (a deployment's parameters)."""
    params_path = materialize(params_path, overrides)
    return run_wisv_eval(load_params(params_path), params_path, sweep_hooks())


if __name__ == "__main__":
    stage_main(wisv_eval_flow, "wisv_eval")
