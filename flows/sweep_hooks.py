"""What a stage's flow lends its sweep (speccap.pipeline.sweep_run.SweepHooks): each configuration as a
Prefect task that retries once (resuming from its records on disk), Prefect's Dask runner for
`cluster.executor: dask`, and the flow run's logger."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.utilities.annotations import quote

from flows.cluster import run_on_dask
from speccap.pipeline.sweep_run import SweepHooks


def _config_task(fn):
    """`fn` as a Prefect task that retries once, its arguments quoted: Prefect walks a task's
    arguments for futures to wait on, and a configuration's clips with their references took it
    0.05 s a configuration to find none."""
    run = task(fn, name="sweep-config", retries=1, retry_delay_seconds=1)

    def call(*args, **kwargs):
        return run(*map(quote, args), **{k: quote(v) for k, v in kwargs.items()})
    return call


def sweep_hooks() -> SweepHooks:
    """Called inside a flow run (its logger is the run's)."""
    return SweepHooks(task=_config_task, cluster=run_on_dask, log=get_run_logger())
