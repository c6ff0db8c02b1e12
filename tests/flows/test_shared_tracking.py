"""Two sweep processes at once against ONE MLflow tracking server and ONE Prefect server: no run lost,
on SQLite and on PostgreSQL (started by the test, tests/flows/daemons.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from speccap.gating.features import token_columns
from speccap.tracking import Tracker

from ..gating.test_token_gates import DIM
from ..test_tracking import _gate_file
from .daemons import mlflow_server, postgres, prefect_server, stop

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_server")]

ROOT = Path(__file__).resolve().parents[2]


def _decode_runs(api_url: str | None = None) -> int:
    """Flow runs of the decode flow a Prefect server holds (the test harness's unless `api_url`)."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    async def count():
        async with get_client() as client:
            return len(await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["speccap-decode"]))))
    if api_url is None:
        return asyncio.run(count())
    with temporary_settings({PREFECT_API_URL: api_url}):
        return asyncio.run(count())


def _two_sweeps_at_once(tiny_project, tmp_path, mlflow_url: str, prefect_api: str) -> None:
    """Two decode sweeps in two processes at once against one MLflow and one Prefect server: both flow
    runs reach Prefect, and every configuration of each has its finished nested run under its parent."""
    before = _decode_runs(prefect_api)
    env = os.environ | {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("PREFECT_API_URL", None)  # the sweep processes find the Prefect server through params only
    _, _, params_file = tiny_project
    procs = []
    for name, lens in (("a", [2]), ("b", [3])):  # two different sweeps (two parent runs)
        work = tmp_path / name
        work.mkdir()
        raw = yaml.safe_load(params_file.read_text())
        raw["sweep"] |= {"runs_dir": str(work / "runs"), "block_lens": lens}
        raw["tracking"] = {"uri": "sqlite:///ignored.db", "experiment": "shared", "prefect_api_url": prefect_api}
        (work / "params.yaml").write_text(yaml.safe_dump(raw))
        # every process is pointed at the one MLflow server through the environment (it wins
        # over params) and at the one Prefect server through tracking.prefect_api_url
        procs.append(subprocess.Popen(
            [sys.executable, "-c", "import sys; from flows.decode import decode_flow; print(decode_flow('params.yaml'))"],
            cwd=work, env=env | {"MLFLOW_TRACKING_URI": mlflow_url, "SPECCAP_PARAMS": str(work / "params.yaml")},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            stop(p)
    assert [p.returncode for p in procs] == [0, 0], [o[-2000:] for o in outs]
    assert _decode_runs(prefect_api) == before + 2  # both flow runs went to the one Prefect server
    summaries = [json.loads((tmp_path / n / "reports" / "decode_summary.json").read_text()) for n in "ab"]
    runs = Tracker(mlflow_url, "shared").runs()
    parents = [r for r in runs if "sweep_key" in r["tags"] and "config_id" not in r["tags"]]
    nested = [r for r in runs if "config_id" in r["tags"]]
    # two parent runs, and every configuration of each logged, finished, with metrics
    assert len(parents) == 2
    assert len(nested) == sum(len(s["configs"]) for s in summaries)
    assert all(r["status"] == "FINISHED" and "bleu1" in r["metrics"] for r in nested)
    for s in summaries:
        mine = [r for r in nested if r["tags"].get("mlflow.parentRunId") == s["parent_run_id"]]
        assert sorted(r["tags"]["config_id"] for r in mine) == sorted(c["config_id"] for c in s["configs"])
        assert s["tracking_uri"] == mlflow_url


def test_two_sweeps_at_once_lose_no_run(tiny_project, tmp_path):
    """SQLite behind MLflow, the test harness's Prefect server."""
    from prefect.settings import PREFECT_API_URL
    with mlflow_server(f"sqlite:///{tmp_path / 'shared.db'}", tmp_path / "artifacts") as url:
        _two_sweeps_at_once(tiny_project, tmp_path, url, PREFECT_API_URL.value())


def test_mlflow_and_prefect_on_postgresql(tiny_project, tmp_path):
    """docs/hpc.md's shared servers: MLflow (`--backend-store-uri postgresql://...`) and Prefect
    (PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://...) on one PostgreSQL server. Two
    sweeps at once lose no run, and the registry's champion alias moves from version to version."""
    with postgres() as dbs:
        prefect_db = dbs["prefect"].replace("postgresql://", "postgresql+asyncpg://")
        with mlflow_server(dbs["mlflow"], tmp_path / "artifacts") as url, \
                prefect_server(prefect_db, tmp_path / "prefect") as api:
            _two_sweeps_at_once(tiny_project, tmp_path, url, api)
            tracker = Tracker(url, "registry")
            rows = pd.DataFrame([{c: 0.0 for c in token_columns(DIM)} | {"h0": h} for h in (-1.0, 3.0)])
            versions = [tracker.log_gate("gate-pg", f"g{k}", _gate_file(tmp_path), rows, {"kind": "lightgbm"}, {})[1]
                        for k in range(2)]
            assert tracker.champion("gate-pg") is None
            for v in versions:
                tracker.promote("gate-pg", v, f"version {v}")
                assert tracker.champion("gate-pg")["version"] == v
            assert tracker.load_gate("gate-pg")["name"] == "g"
