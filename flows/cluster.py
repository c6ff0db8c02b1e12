"""Sweep configurations on a Dask cluster: a LocalCluster here, or Slurm jobs through dask-jobqueue.

`cluster.executor: dask` in params sends each configuration of a sweep (decode, gate_eval) to
Prefect's DaskTaskRunner as one task. A worker loads the models once (speccap.pipeline.sweep.
ensure_models) and keeps them for every configuration it runs; records go to the same resumable
JSONL files as locally, so the runs directory must be on a file system the workers share (on a
cluster: the project directory). MLflow is written only by the flow process, after the results come
back: one writer per sweep, however many workers.
"""

from __future__ import annotations

import os
from pathlib import Path

from prefect import flow, task
from prefect.futures import wait

from speccap.config import Params
from speccap.pipeline.sweep import RunConfig, run_config, summarize
from speccap.pipeline.workers import Loaded, ensure_models

ROOT = Path(__file__).resolve().parents[1]


def slurm_kwargs(params: Params, root: Path = ROOT) -> dict:
    """dask_jobqueue.SLURMCluster arguments from `cluster.slurm` (one worker process per job)."""
    s, d = params.cluster.slurm, params.cluster.dask
    extra = list(s.job_extra_directives)
    if s.gpus:
        extra.append(f"--gres=gpu:{s.gpus}")
    prologue = [f"cd {root}", "export PREFECT_SERVER_ANALYTICS_ENABLED=false", *s.job_script_prologue]
    for var in ("MLFLOW_TRACKING_URI", "SPECCAP_PARAMS", "NLTK_DATA", "HF_HOME"):
        if os.environ.get(var):
            prologue.append(f"export {var}={os.environ[var]}")
    # the job books `cores` CPUs (the models' torch threads use them) but its worker runs
    # threads_per_worker tasks at a time (1: one configuration on one copy of the models)
    return {"queue": s.queue or None, "account": s.account or None, "cores": d.threads_per_worker,
            "job_cpu": s.cores, "processes": 1, "memory": s.memory, "walltime": s.walltime,
            "job_extra_directives": extra, "job_script_prologue": prologue, "local_directory": s.local_directory,
            "log_directory": s.log_directory, "job_name": "speccap-sweep"}


def slurm_job_script(params: Params) -> str:
    """The sbatch script each Slurm worker job would run (nothing is submitted)."""
    from dask_jobqueue import SLURMCluster
    with SLURMCluster(**slurm_kwargs(params)) as cluster:
        return cluster.job_script()


def task_runner(params: Params):
    """Prefect's DaskTaskRunner for `cluster.dask` (a LocalCluster, or SLURMCluster jobs)."""
    from prefect_dask import DaskTaskRunner
    d = params.cluster.dask
    adapt = {"minimum": d.adapt_minimum, "maximum": d.adapt_maximum} if d.adapt_maximum else None
    if d.kind == "slurm":
        return DaskTaskRunner(cluster_class="dask_jobqueue.SLURMCluster", cluster_kwargs=slurm_kwargs(params),
                              adapt_kwargs=adapt or {"minimum": d.workers, "maximum": d.workers})
    return DaskTaskRunner(cluster_class="distributed.LocalCluster",
                          cluster_kwargs={"n_workers": d.workers, "threads_per_worker": d.threads_per_worker,
                                          "processes": True, "dashboard_address": None},
                          adapt_kwargs=adapt)


@task(name="sweep-config-dask", retries=1, retry_delay_seconds=1)
def config_on_worker(cfg: RunConfig, key: str, clips: list[dict], runs_dir: str, params_path: str,
                     threads: int) -> dict:
    # in the worker: models stay loaded across tasks; a retry resumes from the records on disk
    loads = ensure_models(params_path, threads)
    records = run_config(cfg, clips, Loaded.as_loaded(), Path(runs_dir) / f"{key}.jsonl")
    where = {"host": os.uname().nodename, "pid": os.getpid(), "model_loads": loads,
             "slurm_job": os.environ.get("SLURM_JOB_ID")}  # None outside a Slurm job
    return {"metrics": summarize(cfg, records, clips), "worker": where}


@flow(name="speccap-sweep-dask")
def sweep_on_dask(jobs: list[tuple[RunConfig, str, list[dict]]], runs_dir: str, params_path: str,
                  threads: int) -> dict[str, dict | str]:
    """{config key: {"metrics", "worker"}, or the error text of a configuration that failed}."""
    futures = {key: config_on_worker.submit(cfg, key, clips, runs_dir, params_path, threads)
               for cfg, key, clips in jobs}
    wait(list(futures.values()))
    out: dict[str, dict | str] = {}
    for key, fut in futures.items():
        state = fut.state
        out[key] = fut.result() if state.is_completed() else (state.message or state.name)
    return out


def run_on_dask(params: Params, params_path: str | None, jobs, runs_dir: str) -> dict[str, dict | str]:
    path = str(Path(params_path or os.environ.get("SPECCAP_PARAMS", "params.yaml")).resolve())
    return sweep_on_dask.with_options(task_runner=task_runner(params))(jobs, str(Path(runs_dir).resolve()), path,
                                                                       params.sweep.threads)


def main(argv=None) -> int:
    """`python -m flows.cluster [--params params.yaml]`: print the Slurm job script the sweep would submit."""
    import argparse

    from speccap.config import load_params
    ap = argparse.ArgumentParser(description="Print the sbatch script of one Dask worker job (cluster.slurm params); "
                                             "nothing is submitted.")
    ap.add_argument("--params", default=None, help="params file (default: $SPECCAP_PARAMS or params.yaml)")
    print(slurm_job_script(load_params(ap.parse_args(argv).params)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
