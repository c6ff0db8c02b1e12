import numpy as np
import pandas as pd
import pytest

from speccap.gating.features import FEATURES
from speccap.gating.learned import block_table, fit_gate, rule_token_scores, threshold_for_budget


def _traces(n_blocks=300, seed=0):
    """Fake traces where the cloud disagrees with high-entropy tokens, and only the ones late in
    the caption matter (critical)."""
    rng = np.random.default_rng(seed)
    rows = []
    for b in range(n_blocks):
        for i in range(5):
            f = {k: 0.0 for k in FEATURES}
            f.update(entropy=rng.exponential(1.0), pos_in_caption=rng.integers(0, 60), pos_in_block=i)
            mismatch = rng.random() < 1 / (1 + np.exp(-3 * (f["entropy"] - 1.5)))
            critical = float(f["pos_in_caption"] > 30) if mismatch else 0.0
            rows.append(f | {"clip_id": f"c{b // 10}", "block": b % 10, "mismatch": mismatch,
                             "first_reject": mismatch, "critical": critical, "language": ("en", "zh")[b // 10 % 2]})
    return pd.DataFrame(rows)


def test_threshold_spends_the_budget():
    blocks = pd.DataFrame({"score": np.linspace(0, 1, 101), "size": 5})
    for rho in (0.05, 0.15, 0.5):
        thr = threshold_for_budget(blocks, rho)
        share = blocks.loc[blocks.score > thr, "size"].sum() / blocks["size"].sum()
        assert abs(share - rho) <= 0.011
    assert (blocks.score > threshold_for_budget(blocks, 1.0)).all()
    with pytest.raises(ValueError, match="budget"):
        threshold_for_budget(blocks, 0)


@pytest.mark.parametrize("kind", ["logistic", "lightgbm"])
def test_gates_learn_which_tokens_the_cloud_rejects(kind):
    train, val = _traces(seed=0), _traces(seed=1)
    model = fit_gate(train, kind, "mismatch")
    s = model.token_scores(val[list(FEATURES)].to_numpy(np.float32))
    from sklearn.metrics import roc_auc_score
    assert roc_auc_score(val["mismatch"], s) > 0.75
    # the critical target also learns WHICH mismatches matter: late ones here
    crit = fit_gate(train, kind, "critical")
    sc = crit.token_scores(val[list(FEATURES)].to_numpy(np.float32))
    assert roc_auc_score(val["critical"] > 0.5, sc) > roc_auc_score(val["critical"] > 0.5, s)


def test_one_class_traces_are_refused():
    t = _traces()
    t["mismatch"] = False
    with pytest.raises(ValueError, match="need both classes"):
        fit_gate(t, "logistic", "mismatch")


def test_block_score_is_the_max_over_tokens():
    t = _traces(n_blocks=20)
    blocks = block_table(t, rule_token_scores(t, "entropy"))
    assert len(blocks) == 20 and (blocks["size"] == 5).all()
    first = t[(t.clip_id == "c0") & (t.block == 0)]
    assert blocks.loc[("c0", 0), "score"] == pytest.approx(first["entropy"].max())


def test_learned_gate_uses_the_threshold_of_the_block_language():
    from speccap.decoding.stats import Block, TokenStats
    from speccap.gating.learned import LearnedGate
    model = fit_gate(_traces(), "logistic", "mismatch")
    block = Block(start=0, language="zh")
    block.tokens.append(1)
    block.stats.append(TokenStats(1, 2.0, 0.3, 0.1, -1.2, 2))
    score = LearnedGate(model, 0.5).score(block)
    gate = LearnedGate(model, {"en": score - 0.01, "zh": score + 0.01})
    assert not gate.escalate(block)
    block.language = "en"
    assert gate.escalate(block)
