import numpy as np

from speccap.config import params_from_dict
from speccap.metrics.bootstrap import ClipStats
from speccap.pipeline.verify_rank import candidate_ranks, choose, default_rank, rank_config, section

IDS = [f"c{i}" for i in range(200)]


def _stats(hit: np.ndarray, match: np.ndarray) -> ClipStats:
    n = len(IDS)
    return ClipStats(IDS, {"bleu1_match": match.astype(float), "bleu1_count": np.full(n, 10.0),
                           "hyp_len": np.full(n, 10.0), "ref_len": np.full(n, 10.0), "emotion_hit": 100.0 * hit})


def test_the_default_rank_stands_unless_another_is_better_with_its_ci_above_zero():
    rng = np.random.default_rng(0)
    match = rng.integers(3, 8, len(IDS))
    hit = rng.random(len(IDS)) < 0.5
    base = _stats(hit, match)
    # R = 1 gets 30% more clips' emotion right and one more word on a third of the clips: clearly better
    better = _stats(hit | (rng.random(len(IDS)) < 0.3), match + (rng.random(len(IDS)) < 0.3))
    r, rows = choose({2: base, 1: better}, default=2)
    assert r == 1 and rows[1]["minus_default"]["ci_low"] > 0 and rows[2]["minus_default"] is None
    assert rows[1]["key"] == "bleu1_emotion"
    # a difference that is noise (clips shuffled between the two: same means, nothing paired) keeps R = 2
    swapped = _stats(hit, np.where(rng.random(len(IDS)) < 0.5, match, np.clip(match + rng.choice([-1, 1], len(IDS)),
                                                                           0, 10)))
    r, rows = choose({2: base, 1: swapped}, default=2)
    assert rows[1]["minus_default"]["ci_low"] <= 0 and r == 2
    # worse: kept too
    r, _ = choose({2: better, 1: base}, default=2)
    assert r == 2


def test_candidates_and_configs_follow_decode_s_rule():
    p = params_from_dict({"decode": {"rule": "rank", "rank": 2}, "gates": {"verify_ranks": [1, 2, 3]}})
    assert default_rank(p) == 2 and candidate_ranks(p) == [2, 1, 3]
    at_default = rank_config(p, "en", "tok-x", 0.5, 2)
    assert (at_default.rule, at_default.rank, at_default.token) == ("rank", 2, "alone")
    assert (rank_config(p, "en", "tok-x", 0.5, 1).rule, rank_config(p, "en", "tok-x", 0.5, 1).rank) == ("rank", 1)
    greedy = params_from_dict({"decode": {"rule": "greedy"}})
    assert default_rank(greedy) == 1 and candidate_ranks(greedy) == [1]


def test_the_report_section_names_the_chosen_rank():
    vr = {"gate": "tok-x", "budget": 0.1, "default": 2, "chosen": {"en": 1},
          "validation": {"en": {"2": {"bleu1": {"value": 60.0}, "emotion_hit_rate": {"value": 50.0},
                                      "minus_default": None, "rho": 0.1, "clips": 150},
                                "1": {"bleu1": {"value": 62.0}, "emotion_hit_rate": {"value": 60.0},
                                      "minus_default": {"value": 6.0, "ci_low": 3.0, "ci_high": 9.0}, "rho": 0.1,
                                      "clips": 150}}}}
    text = section(vr)
    assert "| en | 1 (chosen) | 150 |" in text and "+6.00 [+3.00, +9.00]" in text and "| en | 2 | 150 |" in text
    assert section({"chosen": {"en": 2}, "validation": {}}) == ""
