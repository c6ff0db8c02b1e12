from speccap.pipeline.promote import decide, score_of

CAND = {"lightgbm-critical": {"score": 66.0, "bleu1": 70.0, "emotion_hit_rate": 62.0, "rho": 0.14, "gates_key": "k2"},
        "logistic-mismatch": {"score": 64.0, "bleu1": 72.0, "emotion_hit_rate": 56.0, "rho": 0.15, "gates_key": "k2"}}


def _score(score: float, rho: float = 0.15) -> dict:
    return {"score": score, "bleu1": score, "rho": rho}


def test_the_score_weighs_bleu1_and_the_emotion_hit_alike():
    assert score_of(70.0, 62.0) == 66.0
    assert score_of(70.0, None) == 70.0  # clips without emotion labels: BLEU-1 alone


def test_with_edge_and_cloud_the_score_is_the_mean_share_of_both_gaps_closed():
    ends = {"edge": {"bleu1": 60.0, "emotion_hit_rate": 30.0}, "cloud": {"bleu1": 70.0, "emotion_hit_rate": 80.0}}
    # half the BLEU-1 gap (5 of 10 points) and 80% of the emotion gap (40 of 50): 65%, where the
    # mean of the raw numbers would weigh the emotion's wider gap five times as much
    assert score_of(65.0, 70.0, ends) == 65.0
    assert score_of(70.0, 55.0, ends) > score_of(63.0, 78.0, ends)  # the raw mean says the opposite
    assert score_of(70.0, 55.0) < score_of(63.0, 78.0)
    flat = {"edge": {"bleu1": 60.0, "emotion_hit_rate": 50.0}, "cloud": {"bleu1": 70.0, "emotion_hit_rate": 50.0}}
    assert score_of(65.0, 90.0, flat) == 50.0  # no emotion gap on these clips: BLEU-1's share alone
    none = {"edge": {"bleu1": 70.0, "emotion_hit_rate": None}, "cloud": {"bleu1": 70.0, "emotion_hit_rate": None}}
    assert score_of(65.0, None, none) == 65.0  # nothing to close: BLEU-1 itself


def test_first_champion_is_the_best_candidate_by_score_not_bleu1():
    d = decide(CAND, None, None)
    # logistic-mismatch has the higher BLEU-1 but the lower mean of BLEU-1 and emotion hit
    assert d["promote"] == "lightgbm-critical" and "first champion" in d["reason"]
    assert "score 66.00" in d["reason"] and "emotion hit 62.0%" in d["reason"]


def test_a_worse_gate_is_not_promoted():
    champ = {"version": "3", "tags": {"gate": "logistic-critical", "gates_key": "k1"}}
    d = decide(CAND, champ, _score(67.5))
    assert d["promote"] is None and "does not beat" in d["reason"] and "67.50" in d["reason"]
    # equal is not better: the alias stays
    assert decide(CAND, champ, _score(66.0))["promote"] is None


def test_a_better_gate_is_promoted_and_the_reason_says_why():
    champ = {"version": "3", "tags": {"gate": "logistic-critical", "gates_key": "k1"}}
    d = decide(CAND, champ, _score(65.0))
    assert d["promote"] == "lightgbm-critical" and "beats the champion" in d["reason"] and "version 3" in d["reason"]


def test_the_champion_itself_is_not_promoted_again():
    champ = {"version": "5", "tags": {"gate": "lightgbm-critical", "gates_key": "k2"}}
    assert decide(CAND, champ, _score(66.0, 0.14))["promote"] is None
    assert decide({}, None, None)["promote"] is None
