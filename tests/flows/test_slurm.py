"""The decode sweep on a real Slurm cluster (one node, started by the test: tests/flows/daemons.py):
worker jobs submitted through dask-jobqueue, one of them cancelled mid-sweep, and the captions equal
to the local executor's, clip for clip, none lost or written twice."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from speccap.tracking import Tracker

from .daemons import stop
from .test_cluster import _project, _records

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_server")]

ROOT = Path(__file__).resolve().parents[2]


def _sacct() -> list[dict]:
    out = subprocess.run(["sacct", "--completion", "-n", "-P", "-o", "JobID,JobName,State"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return [dict(zip(("id", "name", "state"), line.split("|"))) for line in out.splitlines() if line]


def _running_jobs() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-n", "speccap-sweep", "-t", "RUNNING", "-o", "%i"], capture_output=True,
                         text=True, timeout=30).stdout
    return out.split()


def test_a_slurm_sweep_captions_as_the_local_one_and_survives_a_cancelled_job(slurm, tiny_project, tmp_path,
                                                                              monkeypatch):
    from prefect.settings import PREFECT_API_URL

    from flows.decode import decode_flow
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    local_dir, slurm_dir = tmp_path / "local", tmp_path / "slurm"
    local_dir.mkdir()
    slurm_dir.mkdir()
    _, local_file = _project(tiny_project, local_dir)
    monkeypatch.chdir(local_dir)
    decode_flow(str(local_file))

    cluster = {"executor": "dask", "dask": {"kind": "slurm", "workers": 2},
               "slurm": {"cores": 1, "memory": "3GB", "walltime": "00:20:00", "gpus": 0,
                         "log_directory": str(slurm_dir / "logs"), "local_directory": str(slurm_dir / "scratch")}}
    raw, slurm_file = _project(tiny_project, slurm_dir, cluster=cluster)
    raw["tracking"]["prefect_api_url"] = PREFECT_API_URL.value()  # the sweep process is not this one
    slurm_file.write_text(yaml.safe_dump(raw))
    env = os.environ | {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "SPECCAP_PARAMS": str(slurm_file)}
    proc = subprocess.Popen([sys.executable, "-c", "from flows.decode import decode_flow; import json; "
                             "print(json.dumps(decode_flow('params.yaml')))"], cwd=slurm_dir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # as soon as a worker job has written a caption, cancel one of the jobs
        deadline = time.monotonic() + 300
        runs = slurm_dir / "runs"
        while not any(f.stat().st_size for f in runs.glob("*.jsonl")) if runs.exists() else True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.2)
        done_at_cancel = sum(len(f.read_text().splitlines()) for f in runs.glob("*.jsonl"))
        victim = _running_jobs()[0]
        subprocess.run(["scancel", victim], check=True, timeout=30)
        out = proc.communicate(timeout=600)[0]
    finally:
        stop(proc)
    assert proc.returncode == 0, out[-4000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["failed"] == [], out[-4000:]

    local = _records(local_dir / "runs")
    total = sum(len(v) for v in local.values())
    assert done_at_cancel < total  # the job died mid-sweep
    # every configuration's captions as the local executor wrote them: clip for clip, none twice
    assert _records(runs) == local
    for f in runs.glob("*.jsonl"):
        ids = [json.loads(x)["id"] for x in f.read_text().splitlines()]
        assert len(ids) == len(set(ids)), f.name
    summary = json.loads((slurm_dir / "reports" / "decode_summary.json").read_text())
    nested = [r for r in Tracker(raw["tracking"]["uri"], raw["tracking"]["experiment"]).runs() if "config_id" in r["tags"]]
    assert len(nested) == len(summary["configs"]) and all(r["status"] == "FINISHED" for r in nested)
    # the jobs Slurm ran for it, the cancelled one among them
    jobs = [j for j in _sacct() if j["name"] == "speccap-sweep"]
    assert len(jobs) >= 2 and any(j["id"] == victim and j["state"].startswith("CANCELLED") for j in jobs), jobs
    # and the configurations ran in them: each summary names its worker's Slurm job
    ran_in = {c["worker"]["slurm_job"] for c in summary["configs"] if c.get("worker")}
    assert ran_in and ran_in <= {j["id"] for j in jobs}, (ran_in, jobs)
