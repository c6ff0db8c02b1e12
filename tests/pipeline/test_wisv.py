"""WISV's pipeline pieces without models: head training from trace rows, and the report's numbers."""

import numpy as np
import pandas as pd
import pytest

from speccap.config import params_from_dict
from speccap.pipeline.wisv import build_wisv_report, wisv_configs
from speccap.pipeline.wisv_head import train_wisv_head


def _traces(n_clips, rng, d_edge=6, d_cloud=10):
    rows = []
    for c in range(n_clips):
        for pos in sorted(rng.choice(40, 4, replace=False)):
            he = rng.standard_normal(d_edge)
            rows.append({"clip_id": f"c{c}", "pos": int(pos), "critical": float(he[0] > 0), "h_edge": he.tolist(),
                         "h_cloud": rng.standard_normal(d_cloud).tolist(),
                         "c_scalars": rng.standard_normal(4).tolist()})
        rows.append({"clip_id": f"c{c}", "pos": 41, "critical": np.nan, "h_edge": None, "h_cloud": None,
                     "c_scalars": None})
    return pd.DataFrame(rows)


def test_head_trains_on_relabeled_traces_and_repairs_more_on_good_channels(tmp_path):
    rng = np.random.default_rng(0)
    params = params_from_dict({"wisv": {"epochs": 200, "csi_draws": 6}})
    report = train_wisv_head(params, _traces(60, rng), _traces(20, rng), tmp_path)
    assert report["train_mismatches"] == 240 and report["train_rows"] == 240 * 6
    assert report["val_auc"] > 0.75  # the critical direction and the channel are learnable
    assert report["label_repair_good"] > report["label_repair_poor"]  # relabeling follows channel quality
    assert report["head_reject_good"] > report["head_reject_poor"]  # and the head learned it
    assert (tmp_path / "head.pt").exists() and (tmp_path / "head_vs_channel.png").stat().st_size > 5000
    assert (tmp_path / "calibration.png").stat().st_size > 5000 and report["fit_best_epoch"] >= 1
    assert set(report) >= {"val_auc_critical_cloud_logp_draft", "val_auc_critical_cloud_log_rank"}
    with pytest.raises(ValueError, match="validation traces hold no judged mismatches"):
        train_wisv_head(params, _traces(5, rng), _traces(2, rng).iloc[[4]], tmp_path)
    with pytest.raises(ValueError, match="lack the cloud's scalars"):
        train_wisv_head(params, _traces(5, rng).drop(columns="c_scalars"), _traces(2, rng), tmp_path)


def test_shadow_labels_come_from_the_traces_stage_and_old_traces_are_named(tmp_path, monkeypatch):
    from speccap.pipeline.wisv_head import shadow_traces
    monkeypatch.chdir(tmp_path)
    params = params_from_dict({})
    assert params.wisv.labels == "shadow"
    with pytest.raises(FileNotFoundError, match="dvc repro traces"):
        shadow_traces(params)
    (tmp_path / "data/traces").mkdir(parents=True)
    rng = np.random.default_rng(0)
    _traces(4, rng).to_parquet(tmp_path / "data/traces/train.parquet")
    _traces(2, rng).drop(columns=["h_edge"]).to_parquet(tmp_path / "data/traces/val.parquet")
    with pytest.raises(ValueError, match="val.parquet: these traces keep no WISV inputs"):
        shadow_traces(params)
    _traces(2, rng).to_parquet(tmp_path / "data/traces/val.parquet")
    tables = shadow_traces(params)
    assert len(tables["train"]) == 20 and len(tables["val"]) == 10


def test_report_compares_each_rule_with_greedy_on_its_channel_and_window(tmp_path):
    params = params_from_dict({"data": {"languages": ["en"]}, "wisv": {"block_lens": [4]}})
    base = {"bleu1": 60.0, "meteor": 40.0, "rouge_l": 50.0, "tokens": 30.0, "total_time": 1.0, "accepted": 20.0,
            "corrected": 5.0, "rounds": 10.0, "aal": 2.0}
    configs = []
    for cfg in wisv_configs(params):
        m = dict(base)
        if cfg.to_dict()["rule"] == "wisv":
            m.update(aal=3.0, rounds=8.0, total_time=0.8, bleu1=57.0, tolerated=2.0)
        configs.append({"status": "FINISHED", "metrics": m, **cfg.to_dict()})
    r = build_wisv_report(params, {"configs": configs}, {"val_auc": 0.8, "tau": 0.5}, tmp_path)
    assert len(r["deltas"]) == 5  # one per channel
    d = r["deltas"][0]
    assert d["aal_pct"] == pytest.approx(50.0) and d["rounds_pct"] == pytest.approx(-20.0)
    assert d["latency_pct"] == pytest.approx(-20.0) and d["quality_pct"] == pytest.approx(-2.0)
    assert r["mean"]["aal_pct"] == pytest.approx(50.0)
    # 30 tokens in windows of 4 take at least 6 rounds: 40% below greedy's 10, whatever a rule tolerates
    assert d["rounds_floor_pct"] == pytest.approx(-40.0) and r["mean"]["rounds_floor_pct"] == pytest.approx(-40.0)
    md = (tmp_path / "wisv.md").read_text()
    assert "| ours (mean over languages, channels, windows) | +50.0% | -20.0% | -2.0% |" in md
    assert "that floor is -40.0% on average" in md and "| en | markov | 4 | 50.0 | -20.0 | -40.0 |" in md
    assert "| en | markov | 4 | wisv | 3.000 |" in md
    assert r["quality_pct_ci"] is None  # no per-clip numbers, no interval (and no crash)
    # the 7B protocol table: selective wins only on a short RTT
    choice = {(p["channel"]): p["choice"] for p in r["protocols"]}
    assert choice["up20-rtt50"] == "full" and choice["up20-rtt5"] == "selective"


def test_the_rank_frontier_time_shares_the_neighbouring_r():
    from speccap.pipeline.wisv import frontier_point
    pts = [(2.0, "greedy"), (4.0, "rank3"), (3.0, "rank2")]
    assert frontier_point(pts, 2.25) == ([("greedy", 0.75), ("rank2", 0.25)], False)
    assert frontier_point(pts, 3.5) == ([("rank2", 0.5), ("rank3", 0.5)], False)
    assert frontier_point(pts, 1.5) == ([("greedy", 1.0)], False)  # below greedy: greedy itself
    assert frontier_point(pts, 5.0) == ([("rank3", 1.0)], True)  # past the highest R: flagged


def test_report_intervals_come_from_the_clips(tmp_path):
    from speccap.metrics.bootstrap import ClipStats
    params = params_from_dict({"data": {"languages": ["en"]}, "wisv": {"block_lens": [4], "eval_clips": 30}})
    rng = np.random.default_rng(0)
    n = 30
    ids = [f"c{i}" for i in range(n)]

    def clip_stats(shift):
        cols = {"bleu1_match": rng.integers(8, 12, n).astype(float) + shift, "bleu1_count": np.full(n, 20.0),
                "hyp_len": np.full(n, 20.0), "ref_len": np.full(n, 20.0),
                "meteor": rng.normal(50 + shift, 2, n), "rouge_l": rng.normal(50 + shift, 2, n)}
        return ClipStats(ids, cols).to_json()
    configs = []
    for cfg in wisv_configs(params):
        m = {"bleu1": 50.0, "meteor": 50.0, "rouge_l": 50.0, "tokens": 30.0, "total_time": 1.0, "accepted": 20.0,
             "corrected": 5.0, "rounds": 10.0, "aal": 2.0, "bleu1_ci_low": 48.0, "bleu1_ci_high": 52.0}
        # WISV clearly worse than greedy on every clip; rank-R accepts more as R grows and loses more
        row = cfg.to_dict()
        label = f"rank{row['rank']}" if row["rule"] == "rank" else row["rule"]
        stats = clip_stats({"wisv": -2.0, "rank2": -6.0, "rank3": -9.0}.get(label, 0.0))
        m = dict(m, aal={"greedy": 2.0, "wisv": 2.5, "rank2": 3.0, "rank3": 4.0}.get(label, 2.0))
        configs.append({"status": "FINISHED", "metrics": m, "clip_stats": stats, **cfg.to_dict()})
    r = build_wisv_report(params, {"configs": configs}, None, tmp_path)
    lo, hi = r["quality_pct_ci"]
    assert lo < hi < 0
    for d in r["deltas"]:
        assert d["quality_pct_ci"][1] < 0
    # against rank-R at WISV's AAL (2.5: half greedy, half rank-2, about 3 points below greedy):
    # WISV keeps more quality, the interval above 0
    (vs_rank,) = r["against_rank"]
    assert vs_rank["aal_ratio"] == pytest.approx(1.0) and vs_rank["separated"] and vs_rank["beyond"] == 0
    assert set(vs_rank["mixes"]) == {"0.50 greedy+0.50 rank2"}
    assert 0 < vs_rank["quality_pct_ci"][0] < vs_rank["quality_pct"] < vs_rank["quality_pct_ci"][1]
    md = (tmp_path / "wisv.md").read_text()
    assert "30 clips, not all" in md and "50.0 [48.0, 52.0]" in md and "x 4 rules per language" in md
    assert "## WISV against rank-R at equal AAL" in md and "| en | 2.500 | 2.500 | 0.50 greedy+0.50 rank2" in md
    assert "| en | markov | 4 | rank3 |" in md
    assert f"[{lo:+.1f}, {hi:+.1f}]" in md
