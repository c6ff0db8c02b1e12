"""DVC stage `report`: tables and plots from the decode sweep, as a Prefect flow; the report
files are attached to the sweep's MLflow parent run."""

import json
from pathlib import Path

from prefect import flow, task

from flows import stage_main
from speccap.config import load_params
from speccap.pipeline.report import build_report
from speccap.tracking import Tracker


@task(name="build-report")
def report_task(params_path: str | None) -> dict:
    params = load_params(params_path)
    summary = json.loads(Path("reports/decode_summary.json").read_text())
    metrics = build_report(params, summary, "reports")
    tracker = Tracker.for_stage(params.tracking.uri, params.tracking.experiment, "report")
    with tracker.sweep("report", {}, {"sweep_key": summary["sweep_key"], "stage": "decode"}) as parent:
        tracker.log_artifacts(parent, ["reports/tables", "reports/plots", "reports/metrics.json"])
    return metrics


@flow(name="speccap-report")
def report_flow(params_path: str | None = None) -> dict:
    return report_task(params_path)


if __name__ == "__main__":
    stage_main(report_flow, "report")
