"""What a stage's flow lends its sweep (speccap.pipeline.sweep_run.SweepHooks): each configuration as a
Prefect task that retries once (resuming from its records on disk), Prefect's Dask runner for
`cluster.executor: dask`, and the flow run's logger."""

from __future__ import annotations

from prefect import get_run_logger, task

from flows.cluster import run_on_dask
from speccap.pipeline.sweep_run import SweepHooks


def sweep_hooks() -> SweepHooks:
    """Called inside a flow run (its logger is the run's)."""
    return SweepHooks(task=task(name="sweep-config", retries=1, retry_delay_seconds=1), cluster=run_on_dask,
                      log=get_run_logger())
