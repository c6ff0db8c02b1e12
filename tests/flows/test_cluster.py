"""Sweeps on a Dask cluster: a real LocalCluster with two worker processes, and the Slurm job script."""

import json

import pytest
import yaml

from speccap.config import params_from_dict
from speccap.tracking import Tracker


def _project(tiny_project, tmp_path, **extra):
    params, _, params_file = tiny_project
    raw = yaml.safe_load(params_file.read_text())
    raw["sweep"]["runs_dir"] = str(tmp_path / "runs")
    raw["tracking"] = {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "dask-test"}
    raw.update(extra)
    pfile = tmp_path / "params.yaml"
    pfile.write_text(yaml.safe_dump(raw))
    return raw, pfile


def _records(runs):
    return {p.name: [json.loads(x)["caption"] for x in p.read_text().splitlines()] for p in runs.glob("*.jsonl")}


@pytest.mark.e2e
@pytest.mark.usefixtures("prefect_server")
def test_dask_local_cluster_runs_the_sweep_as_the_local_executor_does(tiny_project, tmp_path, monkeypatch):
    from flows.decode import decode_flow
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    local_dir, dask_dir = tmp_path / "local", tmp_path / "dask"
    local_dir.mkdir()
    dask_dir.mkdir()
    _, local_file = _project(tiny_project, local_dir)
    raw, dask_file = _project(tiny_project, dask_dir, cluster={"executor": "dask", "dask": {"workers": 2}})
    monkeypatch.chdir(local_dir)
    decode_flow(str(local_file))
    monkeypatch.chdir(dask_dir)
    out = decode_flow(str(dask_file))
    local = json.loads((local_dir / "reports" / "decode_summary.json").read_text())
    dask = json.loads((dask_dir / "reports" / "decode_summary.json").read_text())
    assert out["failed"] == [] and len(dask["configs"]) == len(local["configs"]) == out["configs"]
    # the same configurations, keys, captions and scores
    assert {c["config_id"] for c in dask["configs"]} == {c["config_id"] for c in local["configs"]}
    assert _records(dask_dir / "runs") == _records(local_dir / "runs")
    by_key = {c["config_id"]: c for c in local["configs"]}
    for c in dask["configs"]:
        assert c["metrics"]["bleu1"] == by_key[c["config_id"]]["metrics"]["bleu1"]
    # two worker processes shared the configurations, each loading the models once
    workers = {}
    for c in dask["configs"]:
        w = c["worker"]
        workers[w["pid"]] = max(workers.get(w["pid"], 0), w["model_loads"])
    assert len(workers) == 2 and set(workers.values()) == {1}
    # one MLflow writer: every configuration has its nested run
    nested = [r for r in Tracker(raw["tracking"]["uri"], "dask-test").runs() if "config_id" in r["tags"]]
    assert len(nested) == len(dask["configs"]) and all(r["status"] == "FINISHED" for r in nested)


def test_slurm_job_script_carries_the_params(tmp_path):
    from flows.cluster import ROOT, slurm_job_script
    params = params_from_dict({"cluster": {"executor": "dask", "dask": {"kind": "slurm", "threads_per_worker": 1},
                                           "slurm": {"queue": "gpu-a100", "account": "speech-lab", "cores": 16,
                                                     "memory": "120GB", "walltime": "06:30:00", "gpus": 2,
                                                     "job_extra_directives": ["--constraint=a100"],
                                                     "job_script_prologue": ["module load cuda/12.4",
                                                                             "source ~/venvs/speccap/bin/activate"],
                                                     "log_directory": str(tmp_path / "logs")}}})
    script = slurm_job_script(params)
    lines = script.splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    for directive in ("#SBATCH -J speccap-sweep", "#SBATCH -p gpu-a100", "#SBATCH -A speech-lab",
                      "#SBATCH -n 1", "#SBATCH --cpus-per-task=16", "#SBATCH --mem=112G", "#SBATCH -t 06:30:00",
                      "#SBATCH --constraint=a100", "#SBATCH --gres=gpu:2", f"#SBATCH -e {tmp_path / 'logs'}/"):
        assert any(line.startswith(directive) for line in lines), (directive, script)
    body = "\n".join(line for line in lines if not line.startswith("#"))
    # the prologue runs before the worker, from the project root, with the user's environment lines
    assert body.index(f"cd {ROOT}") < body.index("module load cuda/12.4") < body.index("distributed.cli.dask_worker")
    assert "--nthreads 1 " in body and "--memory-limit 111.76GiB" in body  # 120 GB, one task at a time
