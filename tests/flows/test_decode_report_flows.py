"""The decode and report stages as Prefect flows, end to end, against a real MLflow SQLite store."""

import json
import shutil

import pytest
import yaml

from speccap.tracking import Tracker

from .views import check_view

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_server")]


def test_sweep_logs_a_run_per_config_survives_a_failure_and_resumes(tiny_project, tmp_path, monkeypatch):
    from flows.decode import decode_flow
    from flows.report import report_flow
    params, _, params_file = tiny_project
    raw = yaml.safe_load(params_file.read_text())
    proc = tmp_path / "proc"
    shutil.copytree(params.data.processed_dir, proc)
    raw["data"]["processed_dir"] = str(proc)
    raw["sweep"]["runs_dir"] = str(tmp_path / "runs")
    raw["sweep"]["in_flight"] = [2]  # and the pipelined loop next to the blocking one
    raw["tracking"] = {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "flow-test"}
    pfile = tmp_path / "params.yaml"
    pfile.write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    # break one zh test clip's features: every zh configuration fails, the en ones go on
    zh_clip = json.loads((proc / "manifests" / "test.zh.jsonl").read_text().splitlines()[0])["id"]
    feat = proc / "features" / f"{zh_clip}.npz"
    good = feat.read_bytes()
    feat.write_bytes(b"not a numpy file")
    out = decode_flow(str(pfile))
    summary = json.loads((tmp_path / "reports" / "decode_summary.json").read_text())
    names = {c["name"]: c for c in summary["configs"]}
    # edge, cloud, L in {2, adaptive}, margin 0.5 at L = 2, pipelined N = 2 at L = 2
    assert out["configs"] == len(names) == 2 * 6
    assert all(c["status"] == ("FAILED" if c["language"] == "zh" else "FINISHED") for c in names.values())
    tracker = Tracker(raw["tracking"]["uri"], "flow-test")
    runs = tracker.runs()
    nested = [r for r in runs if "config_id" in r["tags"]]
    assert len(nested) == 12 and sum(r["status"] == "FAILED" for r in nested) == 6
    edge_en = next(r for r in nested if r["name"] == "edge-en")
    for key in ("bleu1", "bleu4", "meteor", "rouge_l", "ttft", "itps", "oet", "otps", "total_time", "cpu_percent",
                "ram_gb", "rho", "aal", "rounds", "bytes_up", "bytes_down"):
        assert key in edge_en["metrics"], key
    assert edge_en["params"]["method"] == "edge" and edge_en["params"]["language"] == "en"
    check_view(tracker, "")  # the UI's view of the sweep: its rows, their headline columns
    # every quality figure with its 95% bootstrap interval, in MLflow too
    for key in ("bleu1", "meteor", "rouge_l"):
        m = edge_en["metrics"]
        assert m[f"{key}_ci_low"] <= m[key] <= m[f"{key}_ci_high"], key
    failed = next(r for r in nested if r["name"] == "edge-zh")
    assert "failed" in failed["tags"]["error"]
    piped = next(r for r in nested if r["name"].endswith("-N2") and r["status"] == "FINISHED")
    assert piped["params"]["in_flight"] == "2" and "wasted" in piped["metrics"] and "wait_time" in piped["metrics"]

    # fix the clip and run again: only the failed configurations run; finished ones are not redone
    feat.write_bytes(good)
    en_records = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*.jsonl") if p.name.split("-")[1] == "en"}
    assert len(en_records) == 6
    decode_flow(str(pfile))
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*.jsonl")
            if p.name.split("-")[1] == "en"} == en_records
    nested = [r for r in tracker.runs() if "config_id" in r["tags"]]
    assert sum(r["status"] == "FINISHED" for r in nested) == 12 and len(nested) == 18
    assert len([r for r in tracker.runs() if "config_id" not in r["tags"]]) == 1  # one parent run

    metrics = report_flow(str(pfile))
    assert metrics["en"]["edge"]["bleu1"] >= 0 and metrics["configs"]["failed"] == 0
    ci = metrics["intervals"]["en"]
    edge_b1 = ci["methods"]["edge"]["bleu1"]
    assert edge_b1["value"] == pytest.approx(metrics["en"]["edge"]["bleu1"]) and edge_b1["ci_low"] <= edge_b1["ci_high"]
    diff = ci["differences"]["cloud-edge"]["meteor"]
    assert diff["value"] == pytest.approx(ci["methods"]["cloud"]["meteor"]["value"] - ci["methods"]["edge"]["meteor"]["value"])
    quality = (tmp_path / "reports" / "tables" / "quality.md").read_text()
    assert "95% confidence intervals" in quality and "Cloud-only − Edge-only" in quality and "gap that" in quality
    for f in ("quality.md", "efficiency.md", "privacy.md", "l_sweep.md", "gates.md", "pipelined.md"):
        assert (tmp_path / "reports" / "tables" / f).read_text().count("|") > 10
    piped_table = (tmp_path / "reports" / "tables" / "pipelined.md").read_text()
    assert "| en | blocking |" in piped_table and "| en | pipelined N=2 |" in piped_table
    assert "N2" not in (tmp_path / "reports" / "tables" / "l_sweep.md").read_text()
    for f in ("quality_vs_time.png", "quality_vs_rho.png", "l_sweep.png", "position_acceptance.png"):
        assert (tmp_path / "reports" / "plots" / f).stat().st_size > 5000
