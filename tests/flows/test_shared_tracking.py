"""Two sweep processes at once against ONE MLflow tracking server and ONE Prefect server: no run lost."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from speccap.tracking import Tracker

ROOT = Path(__file__).resolve().parents[2]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _decode_runs() -> int:
    """Flow runs of the decode flow the test's Prefect server holds."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    async def count():
        async with get_client() as client:
            return len(await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["speccap-decode"]))))
    return asyncio.run(count())


def test_two_sweeps_at_once_lose_no_run(tiny_project, tmp_path):
    from prefect.settings import PREFECT_API_URL
    before = _decode_runs()
    port = _port()
    url = f"http://127.0.0.1:{port}"
    env = os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("PREFECT_API_URL", None)  # the sweep processes find the Prefect server through params only
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                               "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp_path / 'shared.db'}",
                               "--artifacts-destination", str(tmp_path / "artifacts")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "MLflow server did not start"
                time.sleep(0.5)
        _, _, params_file = tiny_project
        procs = []
        for name, lens in (("a", [2]), ("b", [3])):  # two different sweeps (two parent runs)
            work = tmp_path / name
            work.mkdir()
            raw = yaml.safe_load(params_file.read_text())
            raw["sweep"] |= {"runs_dir": str(work / "runs"), "block_lens": lens}
            raw["tracking"] = {"uri": "sqlite:///ignored.db", "experiment": "shared",
                               "prefect_api_url": PREFECT_API_URL.value()}
            (work / "params.yaml").write_text(yaml.safe_dump(raw))
            # every process is pointed at the one MLflow server through the environment (it wins
            # over params) and at the one Prefect server through tracking.prefect_api_url
            procs.append(subprocess.Popen(
                [sys.executable, "-c", "import sys; from flows.decode import decode_flow; "
                                       "print(decode_flow('params.yaml'))"],
                cwd=work, env=env | {"MLFLOW_TRACKING_URI": url, "SPECCAP_PARAMS": str(work / "params.yaml")},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=600)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], [o[-2000:] for o in outs]
        assert _decode_runs() == before + 2  # both flow runs went to the one Prefect server
        summaries = [json.loads((tmp_path / n / "reports" / "decode_summary.json").read_text()) for n in "ab"]
        runs = Tracker(url, "shared").runs()
        parents = [r for r in runs if "sweep_key" in r["tags"] and "config_id" not in r["tags"]]
        nested = [r for r in runs if "config_id" in r["tags"]]
        # two parent runs, and every configuration of each logged, finished, with metrics
        assert len(parents) == 2
        assert len(nested) == sum(len(s["configs"]) for s in summaries)
        assert all(r["status"] == "FINISHED" and "bleu1" in r["metrics"] for r in nested)
        for s in summaries:
            mine = [r for r in nested if r["tags"].get("mlflow.parentRunId") == s["parent_run_id"]]
            assert sorted(r["tags"]["config_id"] for r in mine) == sorted(c["config_id"] for c in s["configs"])
            assert s["tracking_uri"] == url
    finally:
        server.terminate()
        server.wait(timeout=30)
