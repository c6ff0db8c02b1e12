"""wisv_head -> wisv_eval as Prefect flows on the tiny project, against a real MLflow SQLite store
and registry: hidden-state traces, the head trained, registered and served as a pyfunc, and the
evaluation over channels with its report."""

import contextlib
import io
import json

import mlflow
import numpy as np
import pandas as pd
import pytest

from speccap.tracking import Tracker

from .views import check_view

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_server")]


def test_wisv_chain_end_to_end(own_project, tmp_path):
    from flows.wisv_eval import wisv_eval_flow
    from flows.wisv_head import wisv_head_flow
    # the tiny models barely change a caption by one token: a margin below 0 makes most mismatches critical
    params, raw, pfile = own_project("wisv-test", wisv={
        "labels": "own",
        "traces": {"train_clips": 4, "val_clips": 2, "block_len": 2, "critical_margin": -1.0},
        "epochs": 50, "csi_draws": 3, "block_lens": [3], "eval_clips": 2, "protocol": "auto",
        "channels": {"fast": {"name": "fast", "uplink_mbps": 500, "downlink_mbps": 1000, "rtt_ms": 5},
                     "markov": {"name": "markov", "rtt_ms": 20, "markov": {}}}})

    with pytest.raises(FileNotFoundError, match="wisv_head"):
        wisv_eval_flow(str(pfile))  # no head yet: a clear message, nothing run

    report = wisv_head_flow(str(pfile))
    train = pd.read_parquet(tmp_path / "data/wisv_traces/train.parquet")
    judged = train[train["h_edge"].notna()]
    assert report["train_mismatches"] == len(judged) > 0 and report["train_rows"] == 3 * len(judged)
    assert (train["cloud_rank"][train["mismatch"]] > 1).all()  # rank 1: every greedy mismatch is one
    assert (tmp_path / "models/wisv/head.pt").exists() and (tmp_path / "models/wisv/head_vs_channel.png").exists()
    tracker = Tracker(raw["tracking"]["uri"], "wisv-test-wisv")  # WISV's own experiment
    versions = tracker.model_versions("speccap-wisv-head")
    assert [v["version"] for v in versions] == [report["version"]]
    # the registered pyfunc answers for hidden-state rows
    model = mlflow.pyfunc.load_model(f"models:/speccap-wisv-head/{report['version']}")
    ex = judged.head(2)
    rows = pd.concat([pd.DataFrame(ex["h_edge"].tolist()).add_prefix("e"),
                      pd.DataFrame(ex["h_cloud"].tolist()).add_prefix("c"),
                      pd.DataFrame([[2.0, 2.0, 0.05, 0.0]] * 2).add_prefix("csi"),
                      pd.DataFrame(ex["c_scalars"].tolist()).add_prefix("s")], axis=1).astype("float32")
    out = model.predict(rows)
    # the same numbers as the head itself (low-rank projections, the cloud's scalars)
    import torch

    from speccap.decoding.wisv.head import load_head
    head = load_head(tmp_path / "models/wisv/head.pt")
    assert head.rank == report["rank"] > 0 and head.d_scalar == 4
    # the repository's default: a factored head, its criticality score measured on the raw flags,
    # beside the ceiling of the relabeled targets
    assert head.factored and report["factored"] == (params.wisv.critical_weight > 0)
    assert 0.5 <= report["val_auc_ceiling"] <= 1 and report["val_auc_critical"] is not None
    with torch.no_grad():
        direct = head(*(torch.tensor(rows[[c for c in rows.columns if c.startswith(p) and c[len(p):].isdigit()]].values)
                        for p in ("e", "c", "csi", "s"))).numpy()
    np.testing.assert_allclose(out["p_reject"].to_numpy(), direct, rtol=1e-5)
    assert (tmp_path / "models/wisv/calibration.png").exists() and report["fit_best_epoch"] >= 1
    assert list(out.columns) == ["p_reject", "reject"] and ((out["p_reject"] >= 0) & (out["p_reject"] <= 1)).all()
    with pytest.raises(Exception, match="csi0"):  # the signature names the missing column
        model.predict(rows.drop(columns=["csi0"]))

    # the command line captions with the trained head; a missing head is a clear error
    from speccap.cli import main
    from speccap.data.manifest import manifest_path, read_manifest
    wav = read_manifest(manifest_path(params.data.processed_dir, "test", "en"))[0]["path"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):  # stdout only: Prefect's log handler holds on to stderr
        assert main(["--params", str(pfile), "caption", wav, "--mode", "ugsd", "--gate", "always", "--rule", "wisv",
                     "--tau", "1.0", "--json"]) == 0
        assert main(["--params", str(pfile), "caption", wav, "--mode", "ugsd", "--rule", "wisv",
                     "--wisv-head", str(tmp_path / "none.pt")]) == 2
    out = json.loads(buf.getvalue().strip().splitlines()[0])
    assert out["rounds"] > 0 and out["corrected"] <= out["rounds"] and "tolerated" in out

    result = wisv_eval_flow(str(pfile))
    summary = json.loads((tmp_path / "reports/wisv/summary.json").read_text())
    assert all(c["status"] == "FINISHED" for c in summary["configs"])
    rules = {(c["language"], c.get("channel"), c["rule"]) for c in summary["configs"] if c["method"] == "ugsd"}
    assert rules == {(lang, ch, r) for lang in ("en", "zh") for ch in ("fast", "markov")
                     for r in ("greedy", "rank", "wisv")}
    # greedy and rank on markov are the fast channel's captions relinked, not decoded again
    by_key = {c["config_id"]: c for c in summary["configs"]}
    relinked = [c for c in summary["configs"] if c.get("relinked_from")]
    assert {(c["language"], c["channel"], c["rule"]) for c in relinked} == {
        (lang, "markov", r) for lang in ("en", "zh") for r in ("greedy", "rank")}
    for c in relinked:
        src = by_key[c["relinked_from"]]
        assert (src["channel"], src["rule"], src["language"]) == ("fast", c["rule"], c["language"])
        assert src["metrics"]["bleu1"] == c["metrics"]["bleu1"] and src["metrics"]["bytes_up"] == c["metrics"]["bytes_up"]
        assert c["metrics"]["link_time"] > src["metrics"]["link_time"]  # 4 Mbps and 20 ms against 500 and 5
    # each channel's runs are logged with that channel's link
    runs = [r for r in tracker.runs() if r["params"].get("channel") == "fast"]
    assert runs and {r["params"]["uplink_mbps"] for r in runs} == {"500.0"}
    md = (tmp_path / "reports/wisv/wisv.md").read_text()
    assert "+60.8%" in md and "| en | fast | 3 | wisv |" in md and "selective-hidden ms" in md
    assert (tmp_path / "reports/wisv/wisv.png").stat().st_size > 5000
    assert len(result["deltas"]) == 4
    check_view(tracker, "wisv")
    # a rerun resumes: every configuration's records are reused
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "reports/wisv_runs").iterdir()}
    wisv_eval_flow(str(pfile))
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "reports/wisv_runs").iterdir()} == before
