"""DVC stage `privacy`: what the uplink reveals about the speech (speccap.pipeline.privacy_stage),
as a Prefect flow."""

from __future__ import annotations

from prefect import flow

from flows import stage_main
from speccap.config import load_params
from speccap.pipeline.privacy_stage import run_privacy


@flow(name="speccap-privacy")
def privacy_flow(params_path: str | None = None) -> dict:
    return run_privacy(load_params(params_path))


if __name__ == "__main__":
    stage_main(privacy_flow, "privacy")
