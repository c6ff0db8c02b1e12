import numpy as np
import pytest
import torch

from speccap.decoding.wisv.head import CSI
from speccap.decoding.wisv.training import (
    channel_quality,
    draw_csi,
    relabel,
    repair_budget,
    repair_probability,
    repair_threshold,
    smoothed_importance,
    train_head,
)


def test_smoothed_importance_formula():
    pos, crit = [2, 3, 10], [1, 0, 1]
    s = smoothed_importance(pos, crit, kappa=0.5)
    assert s == pytest.approx([1 + 0.5 ** 8, 0.5 + 0.5 ** 7, 0.5 ** 8 + 1])
    assert smoothed_importance(pos, [0, 0, 0]).tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="kappa"):
        smoothed_importance(pos, crit, kappa=1.0)


def test_channel_quality_is_monotone():
    base = CSI(20.0, 100.0, 20.0, 0.01)
    q = channel_quality(base)
    assert 0 < q < 1
    assert channel_quality(CSI(200.0, 100.0, 20.0, 0.01)) > q  # faster uplink
    assert channel_quality(CSI(20.0, 500.0, 20.0, 0.01)) > q  # faster downlink
    assert channel_quality(CSI(20.0, 100.0, 80.0, 0.01)) < q  # longer RTT
    assert channel_quality(CSI(20.0, 100.0, 20.0, 0.05)) < q  # more loss
    assert repair_budget(0.0) == 0.2 and repair_budget(1.0) == 1.0
    with pytest.raises(ValueError):
        CSI(0.0, 1.0, 1.0)


def test_relabeling_only_relaxes_and_repairs_more_on_better_channels():
    rng = np.random.default_rng(0)
    episodes = []
    for _ in range(300):  # mismatch positions and critical flags of many captions
        n = rng.integers(2, 12)
        episodes.append((np.sort(rng.choice(60, n, replace=False)), rng.random(n) < 0.4))
    channels = [CSI(0.35, 1.0, 150.0, 0.03), CSI(4.0, 20.0, 50.0, 0.01), CSI(100.0, 500.0, 5.0, 0.0)]
    quality = [channel_quality(c) for c in channels]
    assert quality == sorted(quality)
    kept = []
    for csi in channels:
        n_kept = n_crit = 0
        for pos, crit in episodes:
            labels = relabel(pos, crit, csi, rng)
            assert not (labels.astype(bool) & ~crit).any()  # a tolerable mismatch never becomes critical
            n_kept += labels.sum()
            n_crit += crit.sum()
        kept.append(n_kept / n_crit)
    assert kept[0] < kept[1] < kept[2] <= 1.0  # more repairs as the channel improves
    for share, q in zip(kept, quality):  # and about the budget the channel affords
        assert share == pytest.approx(repair_budget(q), abs=0.05)
    # the hard rule (T -> 0) repairs exactly the most important mismatches
    s = np.array([0.1, 0.5, 0.9, 1.3])
    lam = repair_threshold(s, 0.5, 1e-6)
    assert (repair_probability(s, lam, 1e-6) > 0.5).tolist() == [False, False, True, True]


def test_head_learns_on_a_tiny_trace_set():
    rng = np.random.default_rng(1)
    n, d = 400, 8
    h_edge, h_cloud = rng.standard_normal((n, d)), rng.standard_normal((n, d))
    csis = draw_csi(rng, n)
    csi = np.stack([c.vector() for c in csis])
    # labels: a mismatch is repaired when the two states disagree along one direction AND the channel is good
    disagree = (h_edge[:, 0] - h_cloud[:, 0]) > 0
    good = np.array([channel_quality(c) for c in csis]) > 0.3
    labels = (disagree & good).astype(int)
    head = train_head(h_edge[:300], h_cloud[:300], csi[:300], labels[:300], epochs=300)
    with torch.no_grad():
        p = head(torch.tensor(h_edge[300:], dtype=torch.float32), torch.tensor(h_cloud[300:], dtype=torch.float32),
                 torch.tensor(csi[300:]))
    from sklearn.metrics import roc_auc_score
    assert roc_auc_score(labels[300:], p.numpy()) > 0.9
    with pytest.raises(ValueError, match="both"):
        train_head(h_edge[:10], h_cloud[:10], csi[:10], np.zeros(10))


def test_low_rank_head_reads_the_scalars_and_stops_early_on_held_out_captions():
    rng = np.random.default_rng(2)
    n, d = 1200, 24
    h_edge, h_cloud = rng.standard_normal((n, d)), rng.standard_normal((n, d))
    csi = np.stack([c.vector() for c in draw_csi(rng, n)])
    scalars = rng.standard_normal((n, 4)).astype(np.float32)
    groups = np.repeat(np.arange(n // 6), 6)
    # repaired when the cloud finds the token unlikely (scalar 0), more so along one hidden direction
    labels = (scalars[:, 0] + 0.4 * (h_edge[:, 3] + h_cloud[:, 5]) < -0.5).astype(int)
    tr, te = slice(0, 900), slice(900, n)
    head = train_head(h_edge[tr], h_cloud[tr], csi[tr], labels[tr], epochs=400, lr=1e-2, scalars=scalars[tr],
                      rank=4, weight_decay=1e-3, groups=groups[tr], patience=25)
    assert head.rank == 4 and head.d_scalar == 4 and head.proj_edge.weight.shape == (4, d)
    assert head.history["held_out_rows"] > 0 and head.history["best_epoch"] <= head.history["epochs_run"]
    x = [torch.tensor(a[te], dtype=torch.float32) for a in (h_edge, h_cloud, csi, scalars)]
    with torch.no_grad():
        p = head(*x).numpy()
    from sklearn.metrics import roc_auc_score
    blind = train_head(h_edge[tr], h_cloud[tr], csi[tr], labels[tr], epochs=400, lr=1e-2, rank=4, weight_decay=1e-3,
                       groups=groups[tr], patience=25)
    with torch.no_grad():
        p_blind = blind(*x[:3]).numpy()
    # half of the rule is in the scalars: the head that reads them ranks far better than one that cannot
    assert roc_auc_score(labels[te], p) > 0.9 > roc_auc_score(labels[te], p_blind) + 0.15
    with pytest.raises(ValueError, match="scalars"):
        head(*x[:3])
    # labels that nothing predicts: the held-out loss stops improving early and training ends there
    noise = rng.integers(0, 2, n)
    idle = train_head(h_edge, h_cloud, csi, noise, epochs=400, lr=3e-2, scalars=scalars, rank=4, groups=groups,
                      patience=10)
    assert idle.history["epochs_run"] < 400 and idle.history["best_epoch"] < idle.history["epochs_run"]


def test_factored_head_learns_criticality_from_the_raw_flags_and_the_channel_apart():
    """Labels as the relabeling makes them: a critical mismatch (one hidden direction) is repaired
    on a good channel and, on a poor one, only when a random draw keeps it. The factored head's
    criticality score ranks the raw flags; its network never sees the channel."""
    from sklearn.metrics import roc_auc_score
    rng = np.random.default_rng(3)
    n, d = 1600, 12
    h_edge, h_cloud = rng.standard_normal((n, d)), rng.standard_normal((n, d))
    csis = draw_csi(rng, n)
    csi = np.stack([c.vector() for c in csis])
    quality = np.array([channel_quality(c) for c in csis])
    critical = (h_edge[:, 2] + 0.5 * h_cloud[:, 7] > 0.3).astype(int)
    labels = critical * (rng.random(n) < np.array([repair_budget(q) for q in quality]))
    groups = np.repeat(np.arange(n // 4), 4)
    tr, te = slice(0, 1200), slice(1200, n)
    opts = dict(epochs=300, lr=1e-2, hidden=16, rank=4, weight_decay=1e-3, groups=groups[tr], patience=25)
    head = train_head(h_edge[tr], h_cloud[tr], csi[tr], labels[tr], critical=critical[tr], critical_weight=1.0,
                      **opts)
    plain = train_head(h_edge[tr], h_cloud[tr], csi[tr], labels[tr], **opts)
    assert head.factored and not plain.factored and head.channel.weight.shape == (1, 4)
    x = [torch.tensor(a[te], dtype=torch.float32) for a in (h_edge, h_cloud, csi)]
    with torch.no_grad():
        crit, p = head.criticality(*x).numpy(), head(*x).numpy()
        # the criticality score does not move with the channel; P(reject) does
        other = torch.tensor(np.stack([c.vector() for c in draw_csi(rng, n - 1200)]), dtype=torch.float32)
        assert torch.equal(head.criticality(x[0], x[1], other), head.criticality(*x))
        assert not torch.allclose(head(x[0], x[1], other), head(*x))
        p_plain = plain(*x).numpy()
    assert roc_auc_score(critical[te], crit) > 0.9
    assert roc_auc_score(critical[te], crit) > roc_auc_score(critical[te], p_plain)
    assert roc_auc_score(labels[te], p) > 0.75
    # unfactored, criticality is the decision itself
    with torch.no_grad():
        assert torch.equal(plain.criticality(*x), plain(*x))
    with pytest.raises(ValueError, match="raw critical flag"):
        train_head(h_edge[tr], h_cloud[tr], csi[tr], labels[tr], critical_weight=1.0)


def test_head_dataset_relabels_each_episode_under_several_channels():
    import pandas as pd

    from speccap.decoding.wisv.training import head_dataset
    rng = np.random.default_rng(0)
    rows = [{"clip_id": c, "pos": p, "critical": float(k), "h_edge": rng.standard_normal(6).tolist(),
             "h_cloud": rng.standard_normal(10).tolist()}
            for c in ("a", "b") for p, k in zip((2, 5, 9, 30), (1, 1, 0, 1))]
    ds = head_dataset(pd.DataFrame(rows), np.random.default_rng(1), csi_draws=3)
    assert ds["h_edge"].shape == (24, 6) and ds["h_cloud"].shape == (24, 10) and ds["csi"].shape == (24, 4)
    assert ds["scalars"].shape == (24, 0) and sorted(set(ds["group"])) == [0, 1]
    with_scalars = head_dataset(pd.DataFrame([r | {"c_scalars": [float(r["pos"])] * 4} for r in rows]),
                                np.random.default_rng(1), csi_draws=3)
    assert with_scalars["scalars"].shape == (24, 4) and with_scalars["scalars"][0, 0] == 2.0
    assert (ds["label"] <= ds["critical"]).all()  # labels only relax
    assert ds["critical"].sum() == 18 and len(np.unique(ds["quality"])) == 6  # 3 channels per episode
    with pytest.raises(ValueError, match="no judged mismatches"):
        head_dataset(pd.DataFrame(rows).iloc[0:0], np.random.default_rng(1))


def test_saved_head_loads_back_and_bad_files_are_named(tmp_path):
    from speccap.decoding.wisv.head import DecisionHead, load_head, save_head
    head = DecisionHead(6, 10, hidden=16, dropout=0.2).eval()
    save_head(head, tmp_path / "wisv/head.pt", {"tau": 0.4})
    back = load_head(tmp_path / "wisv/head.pt")
    x = [torch.randn(5, 6), torch.randn(5, 10), torch.randn(5, 4)]
    assert torch.equal(head(*x), back(*x)) and back.dims == (6, 10, 4)
    # a low-rank head with the cloud's scalars keeps its projections and input statistics
    rng = np.random.default_rng(0)
    low = DecisionHead(6, 10, hidden=16, rank=3, d_scalar=4)
    low.standardize_with(rng.standard_normal((50, 6)) * 3 + 1, rng.standard_normal((50, 10)), rng.random((50, 4)))
    low.eval()
    save_head(low, tmp_path / "wisv/low.pt", {"tau": 0.5})
    back = load_head(tmp_path / "wisv/low.pt")
    x4 = x + [torch.randn(5, 4)]
    assert (back.rank, back.d_scalar) == (3, 4) and torch.equal(low(*x4), back(*x4))
    assert torch.equal(back.edge_mean, low.edge_mean) and not torch.all(back.edge_mean == 0)
    # a factored head keeps its channel term
    fac = DecisionHead(6, 10, hidden=16, rank=3, factored=True).eval()
    save_head(fac, tmp_path / "wisv/fac.pt", {"tau": 0.5})
    back = load_head(tmp_path / "wisv/fac.pt")
    assert back.factored and torch.equal(fac(*x), back(*x)) and torch.equal(fac.channel.weight, back.channel.weight)
    assert '"tau": 0.4' in (tmp_path / "wisv/head.json").read_text()
    with pytest.raises(FileNotFoundError, match="wisv_head"):
        load_head(tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a head")
    with pytest.raises(ValueError, match="junk.pt: not a WISV decision head"):
        load_head(tmp_path / "junk.pt")
