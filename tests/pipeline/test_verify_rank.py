import numpy as np

from speccap.config import params_from_dict
from speccap.metrics.bootstrap import ClipStats
from speccap.pipeline.verify_rank import candidate_ranks, choose, default_rank, rank_config, section

IDS = [f"c{i}" for i in range(200)]


def _stats(hit: np.ndarray, match: np.ndarray) -> ClipStats:
    n = len(IDS)
    return ClipStats(IDS, {"bleu1_match": match.astype(float), "bleu1_count": np.full(n, 10.0),
                           "hyp_len": np.full(n, 10.0), "ref_len": np.full(n, 10.0), "emotion_hit": 100.0 * hit})


def test_the_rank_with_the_best_validation_mean_wins_and_the_default_on_a_tie():
    rng = np.random.default_rng(0)
    match = rng.integers(3, 8, len(IDS))
    hit = rng.random(len(IDS)) < 0.5
    base = _stats(hit, match)
    # R = 1 gets 30% more clips' emotion right and one more word on a third of the clips: clearly better
    better = _stats(hit | (rng.random(len(IDS)) < 0.3), match + (rng.random(len(IDS)) < 0.3))
    r, rows = choose({2: base, 1: better}, default=2)
    assert r == 1 and rows[1]["minus_default"]["ci_low"] > 0 and rows[2]["minus_default"] is None
    assert rows[1]["key"] == "bleu1_emotion"
    # a small gain whose CI reaches 0 still wins: R is a hyperparameter chosen on validation, like a threshold
    slightly = _stats(hit | (rng.random(len(IDS)) < 0.02), match)
    r, rows = choose({2: base, 1: slightly}, default=2)
    assert rows[1]["minus_default"]["value"] > 0 and rows[1]["minus_default"]["ci_low"] <= 0 and r == 1
    # worse: the default is kept
    r, rows = choose({2: better, 1: base}, default=2)
    assert r == 2 and rows[1]["minus_default"]["value"] < 0
    # the same numbers: the default is kept, whichever comes first
    r, _ = choose({1: base, 2: base}, default=2)
    assert r == 2
    # of several better ones, the best
    r, _ = choose({2: base, 1: slightly, 3: better}, default=2)
    assert r == 3


def test_candidates_and_configs_follow_decode_s_rule():
    p = params_from_dict({"decode": {"rule": "rank", "rank": 2}, "gates": {"verify_ranks": [1, 2, 3]}})
    assert default_rank(p) == 2 and candidate_ranks(p) == [2, 1, 3]
    at_default = rank_config(p, "en", "tok-x", 0.5, 2)
    assert (at_default.spec.rule, at_default.spec.rank, at_default.spec.token) == ("rank", 2, "alone")
    assert (rank_config(p, "en", "tok-x", 0.5, 1).spec.rule, rank_config(p, "en", "tok-x", 0.5, 1).spec.rank) == ("rank", 1)
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
