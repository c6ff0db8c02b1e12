"""The params schema's `cluster:` section: where sweep configurations run (local processes, a Dask
LocalCluster, or Slurm jobs through dask-jobqueue; docs/hpc.md). Not a result: no stage re-runs on a
change (stage_params.READ_NOT_RESULTS).
"""

from __future__ import annotations

from dataclasses import field
from typing import Literal

from .params_types import Count, NonNeg, params_class


@params_class
class DaskParams:
    kind: Literal["local", "slurm"] = "local"  # local: a LocalCluster on this machine; slurm: dask-jobqueue SLURMCluster jobs
    workers: Count = 2  # LocalCluster workers, or Slurm jobs to start with (one worker each)
    threads_per_worker: Count = 1  # one task at a time per worker: each holds its own models
    adapt_maximum: NonNeg = 0  # > 0: scale between adapt_minimum and this many workers with the load
    adapt_minimum: NonNeg = 0


@params_class
class SlurmParams:
    queue: str = ""  # partition (#SBATCH -p)
    account: str = ""  # #SBATCH -A
    cores: Count = 8  # CPU cores per job
    memory: str = "64GB"
    walltime: str = "04:00:00"
    gpus: NonNeg = 1  # #SBATCH --gres=gpu:N
    job_extra_directives: tuple[str, ...] = ()  # more #SBATCH lines, e.g. "--constraint=a100"
    job_script_prologue: tuple[str, ...] = ()  # shell lines before the worker starts (module load, venv)
    local_directory: str = "/tmp"  # worker scratch space on the node
    log_directory: str = "logs/slurm"


@params_class
class ClusterParams:
    # local: each sweep configuration in turn, its captions over sweep.workers processes here;
    # dask: configurations as Prefect tasks on a Dask cluster (each worker keeps its models loaded)
    executor: Literal["dask", "local"] = "local"
    dask: DaskParams = field(default_factory=DaskParams)
    slurm: SlurmParams = field(default_factory=SlurmParams)
