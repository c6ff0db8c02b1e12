"""The MLflow UI over the project's runs, opened where they can be compared: the experiment's runs
page in the UI's model-training views (it would otherwise open on its GenAI overview of traces).

    python scripts/mlflow_ui.py [--port 5000]     # after `make repro`; Ctrl-C stops it

Starts `mlflow server` on the store of params (`tracking.uri`, or $MLFLOW_TRACKING_URI when that is a
database), prints the link to the runs of each experiment (`tracking.experiment` for the decode sweep,
its "-gates" and "-wisv" twins: speccap.run_views.STAGE_EXPERIMENTS), and serves until stopped.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.request

from speccap.config import load_params
from speccap.run_views import STAGE_EXPERIMENTS, runs_page
from speccap.tracking import Tracker, resolve_uri


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=5000)
    ap.add_argument("--host", default="127.0.0.1")
    args = ap.parse_args()
    params = load_params()
    store = resolve_uri(params.tracking.uri)
    if store.startswith("http"):
        sys.exit(f"the runs are on a tracking server already: {store} (open it in a browser)")
    base = params.tracking.experiment
    trackers = (Tracker.for_stage(store, base, stage) for stage in ("decode", *STAGE_EXPERIMENTS))
    experiments = {t.experiment: t.experiment_id for t in trackers}  # each with its view (run_views)
    env = os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store,
                               "--host", args.host, "--port", str(args.port), "--workers", "1"], env=env)
    ui = f"http://{args.host}:{args.port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{ui}/health", timeout=2)
                break
            except OSError:
                if server.poll() is not None:
                    sys.exit(f"mlflow server exited ({server.returncode})")
                time.sleep(0.5)
        for name, experiment in experiments.items():
            print(f"MLflow, the runs of experiment {name!r}: {runs_page(ui, experiment)}", flush=True)
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
