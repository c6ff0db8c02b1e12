import numpy as np
import pytest

from speccap.metrics.bootstrap import ClipStats, difference, gap_closed, interval, with_intervals
from speccap.metrics.caption import score_captions

REFS = [["a woman speaks angrily with a loud voice"], ["a man speaks sadly and slowly"],
        ["the speaker sounds happy and excited"], ["a calm neutral voice speaks"]] * 10
GOOD = [r[0] for r in REFS]
MID = ["a woman speaks with a loud voice", "a man speaks slowly", "the speaker sounds happy", "a calm voice"] * 10
BAD = ["a voice", "someone talks", "the speaker speaks", "a man"] * 10
IDS = [f"c{i}" for i in range(40)]


def _stats(hyps, emotions=None):
    s = score_captions(hyps, REFS, "en", emotions)
    return s, ClipStats.from_records(IDS, s.per_caption)


def test_point_estimates_equal_the_corpus_scores():
    for hyps in (GOOD, MID, BAD):
        s, st = _stats(hyps)
        for key, value in (("bleu1", s.bleu1), ("meteor", s.meteor), ("rouge_l", s.rouge_l)):
            ci = interval(st, key)
            assert ci["value"] == pytest.approx(value, abs=1e-9)
            assert ci["ci_low"] <= value + 1e-9 and ci["ci_high"] >= value - 1e-9


def test_paired_difference_separates_methods_and_is_zero_for_the_same_method():
    _, good = _stats(GOOD)
    _, bad = _stats(BAD)
    d = difference(good, bad, "bleu1")
    assert d["ci_low"] > 0 and d["value"] > 30
    same = difference(good, good, "meteor")
    assert same == {"value": 0.0, "ci_low": 0.0, "ci_high": 0.0}
    with pytest.raises(ValueError, match="same clips in the same order"):
        difference(good, ClipStats(IDS[::-1], good.columns), "bleu1")


def test_gap_closed_and_when_the_gap_is_noise():
    _, good = _stats(GOOD)
    _, mid = _stats(MID)
    _, bad = _stats(BAD)
    g = gap_closed(bad, mid, good, "rouge_l")
    assert g["significant_gap"] and 0 < g["ci_low"] <= g["value"] <= g["ci_high"] < 100
    assert gap_closed(bad, good, good, "rouge_l")["value"] == pytest.approx(100)
    # an edge and a cloud that differ only by noise: the gap's CI holds 0 and the share is flagged
    rng = np.random.default_rng(0)
    cols = lambda: {"meteor": rng.normal(50, 10, 40)}  # noqa: E731
    noisy = gap_closed(ClipStats(IDS, cols()), ClipStats(IDS, cols()), ClipStats(IDS, cols()), "meteor")
    assert not noisy["significant_gap"] and noisy["gap"]["ci_low"] < 0 < noisy["gap"]["ci_high"]


def test_intervals_narrow_with_more_clips_and_emotion_hit_is_bootstrapped():
    rng = np.random.default_rng(1)
    small = ClipStats([str(i) for i in range(30)], {"meteor": rng.normal(50, 10, 30)})
    large = ClipStats([str(i) for i in range(3000)], {"meteor": rng.normal(50, 10, 3000)})
    w = lambda s: interval(s, "meteor")["ci_high"] - interval(s, "meteor")["ci_low"]  # noqa: E731
    assert w(large) < 0.25 * w(small)
    s, st = _stats(GOOD, ["angry", "sad", "happy", "neutral"] * 10)
    m = with_intervals({"emotion_hit_rate": s.emotion_hit_rate}, st)
    assert m["emotion_hit_rate_ci_low"] <= s.emotion_hit_rate <= m["emotion_hit_rate_ci_high"]
    assert {"bleu1_ci_low", "meteor_ci_high", "rouge_l_ci_low"} <= set(m)
    with pytest.raises(KeyError, match="no per-clip 'emotion_hit_rate'"):
        interval(_stats(GOOD)[1], "emotion_hit_rate")
    # the gates' combined figure: the mean of BLEU-1 and the emotion hit rate
    s_mid, mid = _stats(MID, ["angry", "sad", "happy", "neutral"] * 10)
    assert interval(mid, "bleu1_emotion")["value"] == pytest.approx((s_mid.bleu1 + s_mid.emotion_hit_rate) / 2)


def test_relative_quality_change_over_pairs_and_pooled_over_languages():
    from speccap.metrics.bootstrap import mean_relative_change, pooled_mean
    s_mid, mid = _stats(MID)
    s_good, good = _stats(GOOD)
    q = lambda s: (s.bleu1 + s.meteor + s.rouge_l) / 3  # noqa: E731
    assert interval(mid, "quality")["value"] == pytest.approx(q(s_mid))
    one = mean_relative_change([(mid, good)], "quality")
    assert one["value"] == pytest.approx(100 * (q(s_mid) - q(s_good)) / q(s_good))
    assert one["ci_low"] <= one["value"] <= one["ci_high"] < 0  # MID is clearly worse than GOOD
    # the mean over pairs: (MID vs GOOD) and (GOOD vs GOOD) average to half the change
    two = mean_relative_change([(mid, good), (good, good)], "quality", keep_draws=True)
    assert two["value"] == pytest.approx(one["value"] / 2)
    assert len(two["draws"]) > 100
    # two languages' estimates pooled: the mean of the values, an interval at least as narrow as either
    other = mean_relative_change([(mid, good)], "quality", seed=1, keep_draws=True)
    pooled = pooled_mean([two, other])
    assert pooled["value"] == pytest.approx((two["value"] + other["value"]) / 2)
    width = lambda d: d["ci_high"] - d["ci_low"]  # noqa: E731
    assert width(pooled) <= max(width(two), width(other)) + 1e-9
    with pytest.raises(ValueError, match="same clips"):
        mean_relative_change([(mid, ClipStats(IDS[::-1], good.columns))], "quality")


def test_a_time_shared_mix_scores_the_weighted_figure_of_its_parts():
    from speccap.metrics.bootstrap import Mix, mean_relative_change
    s_mid, mid = _stats(MID)
    s_good, good = _stats(GOOD)
    q = lambda s: (s.bleu1 + s.meteor + s.rouge_l) / 3  # noqa: E731
    mix = Mix([(mid, 0.25), (good, 0.75)])
    assert interval(mix, "quality")["value"] == pytest.approx(0.25 * q(s_mid) + 0.75 * q(s_good))
    # GOOD against a mix leaning on MID gains more than against one leaning on GOOD
    lean_mid = mean_relative_change([(good, Mix([(mid, 0.75), (good, 0.25)]))], "quality")
    lean_good = mean_relative_change([(good, mix)], "quality")
    assert lean_mid["value"] > lean_good["value"] > 0 and lean_good["ci_low"] > 0
    with pytest.raises(ValueError, match="summing to 1"):
        Mix([(mid, 0.5), (good, 0.6)])
    with pytest.raises(ValueError, match="same clips"):
        Mix([(mid, 0.5), (ClipStats(IDS[::-1], good.columns), 0.5)])
