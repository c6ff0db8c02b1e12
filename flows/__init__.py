"""Prefect flows: one per DVC stage. The core (src/speccap) knows nothing of Prefect.

Importing this package points Prefect at the shared server of params (`tracking.prefect_api_url`)
before Prefect reads its settings, unless $PREFECT_API_URL is set already (which wins), so every
flow process of a cluster can be sent to one server by params alone.
"""

import os


def _shared_prefect_server() -> None:
    if os.environ.get("PREFECT_API_URL"):
        return
    try:
        from speccap.config import load_params
        url = load_params().tracking.prefect_api_url
    except Exception:  # noqa: BLE001 - no or bad params here: the flow itself will say so
        return
    if url:
        os.environ["PREFECT_API_URL"] = url


_shared_prefect_server()
