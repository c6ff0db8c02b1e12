import numpy as np
import pandas as pd
import pytest

from speccap.decoding.stats import Block, TokenStats
from speccap.gating.features import TOKEN_SCALARS, token_rows
from speccap.gating.token_gates import TOKEN_KINDS, LearnedTokenGate, fit_estimator, fit_token_gate, threshold_for_share
from speccap.pipeline.gates import roc_auc

DIM, EOS = 8, 0


def _data(n, seed):
    """Rows where only the hidden state says which tokens are critical (the scalars are noise)."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, len(TOKEN_SCALARS) + 1 + DIM), np.float32)
    x[:, :len(TOKEN_SCALARS)] = rng.normal(size=(n, len(TOKEN_SCALARS)))
    x[:, len(TOKEN_SCALARS)] = rng.integers(1, 30, n)
    h = rng.normal(size=(n, DIM)).astype(np.float32)
    x[:, len(TOKEN_SCALARS) + 1:] = h
    y = h[:, 0] + 0.5 * h[:, 1] + 0.3 * rng.normal(size=n) > 1.6
    labels = pd.DataFrame({"critical": y, "mismatch": y | (rng.random(n) < 0.1), "clip_id": np.arange(n) // 20})
    return x, labels


@pytest.mark.parametrize("kind", TOKEN_KINDS)
def test_each_classifier_learns_from_the_hidden_state(kind):
    x, labels = _data(3000, 0)
    model = fit_token_gate(x, labels, kind, "critical", DIM, EOS)
    xv, lv = _data(1000, 1)
    assert roc_auc(lv["critical"].to_numpy(), model.token_scores(xv)) > 0.85
    # deterministic for a seed
    again = fit_token_gate(x, labels, kind, "critical", DIM, EOS)
    np.testing.assert_allclose(again.token_scores(xv), model.token_scores(xv), rtol=1e-6)
    # the portable scorer equals the fitted classifier's own prediction (the MLP has no other), one row or many
    if kind != "mlp":
        inputs = xv if kind == "lightgbm" else model._inputs(xv)
        fitted = fit_estimator(x, labels, kind, "critical")
        np.testing.assert_allclose(model.token_scores(xv), fitted.predict_proba(inputs)[:, 1], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(model.token_scores(xv[:1]), model.token_scores(xv)[:1], rtol=1e-5)


@pytest.mark.parametrize("kind", TOKEN_KINDS)
def test_sample_weights_steer_the_gate_toward_the_heavy_positives(kind):
    # two kinds of critical token: those the hidden state's dimension 0 marks and those dimension 2
    # marks; weighting the second kind up must rank it above the first
    x, _ = _data(4000, 0)
    h = x[:, len(TOKEN_SCALARS) + 1:]
    first, second = h[:, 0] > 1.5, h[:, 2] > 1.5
    labels = pd.DataFrame({"critical": first | second, "mismatch": first | second, "clip_id": np.arange(4000) // 20})
    xv, _ = _data(2000, 1)
    hv = xv[:, len(TOKEN_SCALARS) + 1:]
    only_first, only_second = (hv[:, 0] > 1.5) & (hv[:, 2] < 1.5), (hv[:, 2] > 1.5) & (hv[:, 0] < 1.5)
    w = np.where(second & ~first, 20.0, 1.0)
    weighted = fit_token_gate(x, labels, kind, "critical", DIM, EOS, sample_weight=w).token_scores(xv)
    plain = fit_token_gate(x, labels, kind, "critical", DIM, EOS).token_scores(xv)
    from scipy.stats import rankdata
    def gain(scores):  # how far above the first kind the second ranks (in shares of the rows)
        pct = rankdata(scores) / len(scores)
        return pct[only_second].mean() - pct[only_first].mean()
    assert gain(weighted) > gain(plain) + 0.02
    with pytest.raises(ValueError, match="sample weights"):
        fit_token_gate(x, labels, kind, "critical", DIM, EOS, sample_weight=w[:-1])


def test_impact_weights_weigh_critical_tokens_by_their_impact():
    from speccap.gating.token_gates import impact_weights
    labels = pd.DataFrame({"critical": [True, True, False, False], "impact": [10.0, 2.0, 30.0, -5.0]})
    np.testing.assert_allclose(impact_weights(labels, 0.2), [3.0, 1.4, 1.0, 1.0])


def test_one_class_traces_are_a_clear_error():
    x, labels = _data(200, 0)
    labels["critical"] = False
    with pytest.raises(ValueError, match="need both classes"):
        fit_token_gate(x, labels, "logistic", "critical", DIM, EOS)
    with pytest.raises(ValueError, match="unknown token gate classifier"):
        fit_token_gate(x, labels.assign(critical=labels["mismatch"]), "svm", "critical", DIM, EOS)


def test_threshold_for_share_flags_that_share():
    s = np.random.default_rng(0).random(1000)
    for rho in (0.05, 0.1, 0.5):
        assert (s > threshold_for_share(s, rho)).mean() == pytest.approx(rho, abs=0.002)
    assert (s > threshold_for_share(s, 1.0)).all()
    with pytest.raises(ValueError):
        threshold_for_share(s, 0.0)


def test_gate_scores_the_last_token_as_the_traces_did():
    x, labels = _data(3000, 0)
    model = fit_token_gate(x, labels, "lightgbm", "critical", DIM, EOS)
    import torch
    stats = [TokenStats(5, 1.0, 0.5, 0.2, -1.0, 2), TokenStats(7, 0.2, 0.9, 0.8, -0.1, 1)]
    block = Block(start=3, tokens=[5, 7], stats=stats, context=[torch.zeros(DIM), torch.full((DIM,), 3.0)],
                  audio=(0.1,) * 6, language="zh")
    rows = token_rows(block, DIM, EOS)
    expect = model.token_scores(rows)
    gate = LearnedTokenGate(model, {"en": 0.0, "zh": float(expect[1]) - 1e-6})
    assert gate.level == "token" and gate.needs_hidden
    assert gate.token_score(block, 1) == pytest.approx(expect[1])
    assert gate.flag(block)  # zh threshold just below the last token's score
    gate.thresholds["zh"] = float(expect[1]) + 1e-6
    assert not gate.flag(block)
    assert rows[1, TOKEN_SCALARS.index("pos_in_caption")] == 4 and rows[1, TOKEN_SCALARS.index("zh")] == 1


def shadow_table(seed: int, clips: int = 150, per_clip: int = 20) -> pd.DataFrame:
    """A traces table as the `traces` stage writes it (gating.shadow rows + feature columns x0..),
    two languages, each caption ending with the end token."""
    n = clips * per_clip
    x, labels = _data(n, seed)
    pos = np.tile(np.arange(per_clip), clips)
    end = pos == per_clip - 1
    x[:, TOKEN_SCALARS.index("is_end")] = end
    x[:, TOKEN_SCALARS.index("pos_in_caption")] = pos
    x[end, len(TOKEN_SCALARS)] = EOS
    lang = np.where(np.arange(n) // per_clip % 2 == 0, "en", "zh")
    x[:, TOKEN_SCALARS.index("zh")] = lang == "zh"
    df = pd.DataFrame({"clip_id": [f"c{seed}-{i // per_clip}" for i in range(n)], "language": lang, "pos": pos,
                       "token": x[:, len(TOKEN_SCALARS)].astype(int), "eos": EOS, "mismatch": labels["mismatch"],
                       "critical": labels["critical"], "impact": labels["critical"] * 5.0})
    # each token's entropy at the default temperatures (1 alone): the entropy feature itself
    df["entropy_at"] = list(x[:, [TOKEN_SCALARS.index("entropy")]].astype(float))
    return pd.concat([df, pd.DataFrame(x, columns=[f"x{k}" for k in range(x.shape[1])])], axis=1)


@pytest.mark.parametrize("kind", TOKEN_KINDS)
def test_the_gain_target_ranks_big_gains_above_small_ones(kind):
    # critical tokens of two kinds, equally common: dimension 0 marks 2-point gains, dimension 2
    # 30-point ones. The critical target cannot tell them apart; the gain target must rank the
    # big ones first (what a budget smaller than the critical tokens should buy)
    x, _ = _data(4000, 0)
    h = x[:, len(TOKEN_SCALARS) + 1:]
    small, big = h[:, 0] > 1.5, h[:, 2] > 1.5
    impact = np.where(big, 30.0, np.where(small, 2.0, 0.0)) + np.where(small | big, 0.0, -0.5)  # losses count as 0
    labels = pd.DataFrame({"critical": small | big, "mismatch": small | big, "impact": impact,
                           "clip_id": np.arange(4000) // 20})
    xv, _ = _data(2000, 1)
    hv = xv[:, len(TOKEN_SCALARS) + 1:]
    only_small, only_big = (hv[:, 0] > 1.5) & (hv[:, 2] < 1.5), (hv[:, 2] > 1.5) & (hv[:, 0] < 1.5)
    model = fit_token_gate(x, labels, kind, "gain", DIM, EOS)
    assert model.regression and model.meta["train_gain_mean"] == pytest.approx(np.clip(impact, 0, None).mean())
    s = model.token_scores(xv)
    from scipy.stats import rankdata
    pct = rankdata(s) / len(s)
    assert pct[only_big].mean() > pct[only_small].mean() + 0.05 > pct[~(only_small | only_big)].mean() + 0.05
    # in points: the big ones are predicted well above the small ones
    assert np.median(s[only_big]) > np.median(s[only_small]) + 5
    # the portable scorer equals the fitted model's own prediction, one row or many
    if kind != "mlp":
        inputs = xv if kind == "lightgbm" else model._inputs(xv)
        np.testing.assert_allclose(s, fit_estimator(x, labels, kind, "gain").predict(inputs), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(model.token_scores(xv[:1]), s[:1], rtol=1e-5, atol=1e-6)


def test_the_gain_target_needs_the_impact_column():
    x, labels = _data(200, 0)
    with pytest.raises(ValueError, match="impact column.*dvc repro traces"):
        fit_token_gate(x, labels, "lightgbm", "gain", DIM, EOS)


@pytest.mark.parametrize("kind", TOKEN_KINDS)
def test_a_gate_that_says_it_is_exact_in_a_batch_scores_each_row_with_its_own_bits(kind):
    """The batching executor scores the rows of many captions in one call only for a model whose
    row scores do not depend on the rows beside them (`exact_in_batch`)."""
    x, labels = _data(2000, 0)
    model = fit_token_gate(x, labels, kind, "critical", DIM, EOS)
    xv, _ = _data(600, 1)
    alone = np.concatenate([model.token_scores(xv[i:i + 1]) for i in range(len(xv))])
    cuts = np.cumsum(np.random.default_rng(2).integers(1, 40, 40))
    together = np.concatenate([model.token_scores(part) for part in np.split(xv, cuts[cuts < len(xv)])])
    assert model.exact_in_batch == (kind == "lightgbm")
    if model.exact_in_batch:
        assert np.array_equal(alone, together)
    else:
        np.testing.assert_allclose(alone, together, rtol=1e-5)
