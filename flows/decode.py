"""DVC stage `decode`: the sweep of edge-only, cloud-only and UGSD configurations
(speccap.pipeline.decode), as a Prefect flow: each configuration a Prefect task of the sweep."""

from __future__ import annotations

from prefect import flow

from flows import stage_main
from flows.sweep_hooks import sweep_hooks
from speccap.config import load_params, materialize
from speccap.pipeline.decode import run_decode


@flow(name="speccap-decode")
def decode_flow(params_path: str | None = None, overrides: dict | None = None) -> dict:
    """`overrides`: dotted params keys on top of the file (a deployment's parameters)."""
    params_path = materialize(params_path, overrides)
    return run_decode(load_params(params_path), params_path, sweep_hooks())


if __name__ == "__main__":
    stage_main(decode_flow, "decode")
