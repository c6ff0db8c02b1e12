"""Prefect flows: one per DVC stage. The core (src/speccap) knows nothing of Prefect.

Importing this package points Prefect at the shared server of params (`tracking.prefect_api_url`)
before Prefect reads its settings, unless $PREFECT_API_URL is set already (which wins), so every
flow process of a cluster can be sent to one server by params alone. And it pins the numerical
kernels before numpy and torch load (speccap.kernels), so a stage writes the same bytes on any
x86-64 machine.
"""

import json
import os
import sys

from speccap.kernels import pin_kernels

pin_kernels()
from speccap.config import ConfigError, load_params  # noqa: E402 - after the pins
from speccap.params_reads import STAGE_ENV  # noqa: E402 - after the pins
from speccap.preflight import INPUT_ERRORS, check_stage  # noqa: E402 - after the pins


def _shared_prefect_server() -> None:
    if os.environ.get("PREFECT_API_URL"):
        return
    try:
        url = load_params().tracking.prefect_api_url
    except Exception:  # noqa: BLE001 - no or bad params here: the flow itself will say so
        return
    if url:
        os.environ["PREFECT_API_URL"] = url


_shared_prefect_server()


def stage_main(flow_fn, stage: str) -> None:
    """A DVC stage's command: the stage's inputs are checked before the flow starts, and bad or missing
    input ends the stage with one line naming the param (exit 1), not a traceback."""
    os.environ[STAGE_ENV] = stage  # whose params a recording of reads (speccap.params_reads) holds
    try:
        check_stage(load_params(), stage)
    except (ConfigError, *INPUT_ERRORS) as exc:
        print(f"error: stage {stage}: {exc}", file=sys.stderr)
        sys.exit(1)
    # one line: the full result is in the stage's report files, and a log reads better without it spread out
    print(json.dumps(flow_fn(), ensure_ascii=False, default=str))
