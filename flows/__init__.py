"""Prefect flows: one per DVC stage. The core (src/speccap) knows nothing of Prefect."""
