from speccap.pipeline.promote import decide

CAND = {"lightgbm-critical": {"bleu1": 66.0, "rho": 0.14, "gates_key": "k2"},
        "logistic-mismatch": {"bleu1": 64.0, "rho": 0.15, "gates_key": "k2"}}


def test_first_champion_is_the_best_candidate():
    d = decide(CAND, None, None)
    assert d["promote"] == "lightgbm-critical" and "first champion" in d["reason"]


def test_a_worse_gate_is_not_promoted():
    champ = {"version": "3", "tags": {"gate": "logistic-critical", "gates_key": "k1"}}
    d = decide(CAND, champ, {"bleu1": 67.5, "rho": 0.15})
    assert d["promote"] is None and "does not beat" in d["reason"] and "67.50" in d["reason"]
    # equal is not better: the alias stays
    assert decide(CAND, champ, {"bleu1": 66.0, "rho": 0.15})["promote"] is None


def test_a_better_gate_is_promoted_and_the_reason_says_why():
    champ = {"version": "3", "tags": {"gate": "logistic-critical", "gates_key": "k1"}}
    d = decide(CAND, champ, {"bleu1": 65.0, "rho": 0.15})
    assert d["promote"] == "lightgbm-critical" and "beats the champion" in d["reason"] and "version 3" in d["reason"]


def test_the_champion_itself_is_not_promoted_again():
    champ = {"version": "5", "tags": {"gate": "lightgbm-critical", "gates_key": "k2"}}
    assert decide(CAND, champ, {"bleu1": 66.0, "rho": 0.14})["promote"] is None
    assert decide({}, None, None)["promote"] is None
