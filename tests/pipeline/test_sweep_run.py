"""A sweep without Prefect: configurations over the pool, a nested MLflow run each, a failure kept as a
FAILED run while the others go on, a rerun that redoes only what failed, and the hooks a flow lends."""

import dataclasses

import pytest

from speccap.pipeline.splits import eval_clips
from speccap.pipeline.sweep import RunConfig, ugsd_config
from speccap.pipeline.sweep_run import SweepHooks, run_sweep
from speccap.tracking import Tracker

from ..metrics.nvml_standin import Device


@pytest.fixture
def sweep_params(tiny_project, tmp_path):
    params, _, params_file = tiny_project
    params = dataclasses.replace(params, tracking=dataclasses.replace(
        params.tracking, uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="sweep-run"))
    return params, str(params_file)


def test_each_configuration_is_a_run_a_failure_is_kept_and_a_rerun_redoes_only_it(sweep_params, tmp_path):
    params, params_file = sweep_params
    good, bad = RunConfig("edge", "en"), ugsd_config(params, "en", gate="no-such-gate", threshold=0.5, block_len=2)
    wrapped = []

    def task(fn):  # what a flow's Prefect task does: wraps the captioning of each configuration
        def run(cfg, *args):
            wrapped.append(cfg.name)
            return fn(cfg, *args)
        return run

    hooks = SweepHooks(task=task)
    first = run_sweep(params, params_file, "decode", [good, bad], _clips(params),
                      str(tmp_path / "runs"), hooks=hooks)
    rows = {c["name"]: c for c in first["configs"]}
    assert rows[good.name]["status"] == "FINISHED" and rows[good.name]["metrics"]["bleu1"] >= 0
    assert rows[good.name]["clip_stats"]["ids"] == [c["id"] for c in _clips(params)["en"]]
    assert rows[bad.name]["status"] == "FAILED" and "no-such-gate" in rows[bad.name]["error"]
    assert sorted(wrapped) == sorted([good.name, bad.name])
    tracker = Tracker(params.tracking.uri, params.tracking.experiment)
    nested = [r for r in tracker.runs() if "config_id" in r["tags"]]
    assert sorted((r["name"], r["status"]) for r in nested) == sorted([(bad.name, "FAILED"), (good.name, "FINISHED")])

    records = tmp_path / "runs" / f"{rows[good.name]['config_id']}.jsonl"
    written = records.stat().st_mtime_ns
    again = run_sweep(params, params_file, "decode", [good, bad], _clips(params), str(tmp_path / "runs"))
    assert again["sweep_key"] == first["sweep_key"] and again["parent_run_id"] == first["parent_run_id"]
    assert records.stat().st_mtime_ns == written  # its captions were all on disk: none made again
    nested = [r for r in tracker.runs() if "config_id" in r["tags"]]
    assert len(nested) == 3 and sum(r["name"] == good.name for r in nested) == 1  # logged once, not twice


def test_a_sweep_leaves_its_folder_holding_its_own_record_logs(sweep_params, tmp_path):
    params, params_file = sweep_params
    runs = tmp_path / "runs"
    runs.mkdir()
    for stale in ("edge-en-0123456789.jsonl", "extra.en.jsonl", "notes.txt"):  # an earlier run's, and others
        (runs / stale).write_text('{"id": "x"}\n')
    out = run_sweep(params, params_file, "decode", [RunConfig("edge", "en")], _clips(params), str(runs),
                    keep_also=("extra.en.jsonl",))
    key = out["configs"][0]["config_id"]
    assert sorted(p.name for p in runs.iterdir()) == sorted([f"{key}.jsonl", "extra.en.jsonl", "notes.txt"])


def test_a_cluster_sweep_needs_the_runner_a_flow_lends(sweep_params, tmp_path):
    params, params_file = sweep_params
    params = dataclasses.replace(params, cluster=dataclasses.replace(params.cluster, executor="dask"))
    with pytest.raises(ValueError, match="cluster.executor: dask.*flows.decode"):
        run_sweep(params, params_file, "decode", [RunConfig("edge", "en")], _clips(params), str(tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()
    sent = []
    hooks = SweepHooks(cluster=lambda p, path, jobs, runs: sent.extend(jobs) or {k: "lost" for _, k, _ in jobs})
    out = run_sweep(params, params_file, "decode", [RunConfig("edge", "en")], _clips(params), str(tmp_path / "runs"),
                    hooks=hooks)
    assert [cfg for cfg, _, _ in sent] == [RunConfig("edge", "en")]
    assert out["configs"][0]["status"] == "FAILED" and out["configs"][0]["error"] == "lost"


def test_a_sweep_logs_the_gpu_it_ran_on_to_its_own_run_and_nothing_without_one(sweep_params, tmp_path,
                                                                               monkeypatch):
    params, params_file = sweep_params
    cfg = RunConfig("edge", "en")

    def metrics(stage: str, out: dict) -> dict:
        tracker = Tracker.for_stage(params.tracking.uri, params.tracking.experiment, stage)
        return next(r["metrics"] for r in tracker.runs() if r["run_id"] == out["parent_run_id"])

    out = run_sweep(params, params_file, "decode", [cfg], _clips(params), str(tmp_path / "cpu"))
    assert not [k for k in metrics("decode", out) if "gpu" in k]  # no GPU here
    Device(busy=70.0).installed(monkeypatch).busy = True
    out = run_sweep(params, params_file, "gate_eval", [cfg], _clips(params), str(tmp_path / "gpu"))
    logged = metrics("gate_eval", out)
    assert logged["stage_gpu_percent"] == 70.0 and logged["stage_gpu_memory_gb"] >= 1, logged


def _clips(params):
    return {"en": eval_clips(params, "en")[:2]}
