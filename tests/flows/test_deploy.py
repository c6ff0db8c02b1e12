"""A scheduled Prefect deployment, created and run by a real process worker against a real server."""

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from speccap.tracking import Tracker

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_server")]

ROOT = Path(__file__).resolve().parents[2]


def test_scheduled_deployment_runs_on_a_process_worker(tiny_project, tmp_path, monkeypatch):
    """A deployment's overrides reach its run (sweep.block_lens here; that cluster.* params send a
    sweep to Slurm jobs is tests/flows/test_slurm.py's)."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL

    from flows.deploy import deploy
    # the deployment's source: a project directory of its own (the run writes its reports there)
    _, _, params_file = tiny_project
    proj = tmp_path / "proj"
    shutil.copytree(ROOT / "flows", proj / "flows", ignore=shutil.ignore_patterns("__pycache__"))
    raw = yaml.safe_load(params_file.read_text())
    raw["sweep"] |= {"runs_dir": str(proj / "runs"), "block_lens": [2], "gates": {}}
    raw["tracking"] = {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "deployed"}
    (proj / "params.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    overrides = {"sweep.block_lens": [3]}
    deploy(["decode"], pool="speccap-test", cron="30 3 * * 1-5", overrides=overrides, source=proj)

    async def read():
        async with get_client() as client:
            dep = await client.read_deployment_by_name("speccap-decode/decode")
            pool = await client.read_work_pool("speccap-test")
            return dep, pool
    dep, pool = asyncio.run(read())
    assert pool.type == "process"
    assert [s.schedule.cron for s in dep.schedules] == ["30 3 * * 1-5"]
    assert dep.parameters == {"params_path": "params.yaml", "overrides": overrides}

    run = run_deployment("speccap-decode/decode", timeout=0)  # due now; the worker picks it up
    env = os.environ | {"PREFECT_API_URL": PREFECT_API_URL.value(), "PYTHONPATH": str(ROOT / "src")}
    worker = subprocess.run(["prefect", "worker", "start", "--pool", "speccap-test", "--run-once"], cwd=proj,
                            env=env, capture_output=True, text=True, timeout=600)

    async def state():
        async with get_client() as client:
            return (await client.read_flow_run(run.id)).state
    final = asyncio.run(state())
    assert final.is_completed(), (final, worker.stdout[-3000:], worker.stderr[-3000:])
    summary = json.loads((proj / "reports" / "decode_summary.json").read_text())
    ugsd = [c for c in summary["configs"] if c["method"] == "ugsd"]
    # the override reached the run: the L sweep is at 3 (the file says 2, also decode.block_len)
    assert {c["block_len"] for c in ugsd} == {2, 3} and sum(c["block_len"] == 3 for c in ugsd) == 2
    assert all(c["status"] == "FINISHED" for c in summary["configs"])
    # every configuration reached MLflow
    nested = [r for r in Tracker(raw["tracking"]["uri"], "deployed").runs() if "config_id" in r["tags"]]
    assert len(nested) == len(summary["configs"]) and all(r["status"] == "FINISHED" for r in nested)
