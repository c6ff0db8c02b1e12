import pytest

from speccap.config import params_from_dict
from speccap.fanout import usable_cores
from speccap.gating.gate_file import read_gate
from speccap.gating.token_gates import LearnedTokenGate
from speccap.pipeline.gates import learned_names, train_gates
from speccap.pipeline.saved import load_gate

from ..gating.test_token_gates import shadow_table


def test_train_gates_saves_each_gate_with_thresholds_per_budget(tmp_path):
    p = params_from_dict({"models": {"dir": str(tmp_path)}, "gates": {"budgets": [0.05, 0.15, 0.5],
                                                                      "promote_budget": 0.15}})
    train, val = shadow_table(0), shadow_table(1)
    result = train_gates(p, train, val)
    assert set(result["gates"]) == set(learned_names(p)) | {"entropy", "entropy-block"}
    assert set(result["chosen"]) == {"critical", "mismatch"}
    for name in learned_names(p):
        g = result["gates"][name]
        for lang in ("en", "zh"):  # calibrated per language
            thr = [g["thresholds"][str(b)][lang] for b in (0.05, 0.15, 0.5)]
            assert thr == sorted(thr, reverse=True)  # a bigger budget lowers the bar
        assert g["auc_critical" if name.endswith("critical") else "auc_mismatch"] > 0.7
        saved = read_gate(tmp_path / "gates" / f"{name}.gate.json")
        assert saved["threshold"] == g["thresholds"]["0.15"] and saved["verify"] == "alone"
        assert saved["thresholds"] == g["thresholds"] and saved["promote_budget"] == 0.15
    # the chosen one per target has the best validation AUC on that target
    crit = [n for n in learned_names(p) if n.endswith("critical")]
    assert result["chosen"]["critical"] == max(crit, key=lambda n: result["gates"][n]["auc_critical"])
    assert (tmp_path / "gates" / "tok-lightgbm-critical.importance.csv").exists()
    assert (tmp_path / "gates" / "calibration.png").stat().st_size > 5000
    # the block baseline's budget counts blocks of L tokens: a bigger budget lowers its bar too
    blk = [result["gates"]["entropy-block"]["thresholds"][str(b)]["en"] for b in (0.05, 0.15, 0.5)]
    assert blk == sorted(blk, reverse=True)
    gate = load_gate(p, "tok-lightgbm-critical", 0.3)
    assert isinstance(gate, LearnedTokenGate) and gate.level == "token" and gate.threshold == 0.3
    default = load_gate(p, "tok-lightgbm-critical")  # the promote budget's thresholds, one per language
    assert default.threshold_for("zh") == result["gates"]["tok-lightgbm-critical"]["thresholds"]["0.15"]["zh"]
    with pytest.raises(FileNotFoundError, match="dvc repro gates"):
        load_gate(p, "tok-lightgbm-nothing")


def test_traces_without_an_end_token_are_a_clear_error(tmp_path):
    p = params_from_dict({"models": {"dir": str(tmp_path)}})
    train = shadow_table(0).drop(columns="eos")
    with pytest.raises(ValueError, match="end token"):
        train_gates(p, train, shadow_table(1))


def test_missing_gates_json_names_the_file_and_the_stage(tmp_path):
    from speccap.pipeline.gates import read_gates_json
    p = params_from_dict({"models": {"dir": str(tmp_path)}})
    with pytest.raises(FileNotFoundError, match=r"gates\.json.*dvc repro gates"):
        read_gates_json(p)


def test_impact_weight_changes_the_critical_gates_only(tmp_path):
    import numpy as np

    from speccap.pipeline.traces import features_of
    train, val = shadow_table(0), shadow_table(1)
    train["impact"] = np.where(train["critical"], np.arange(len(train)) % 40, 0.0)  # from 0 to 39 points
    scores = {}
    for w in (0.0, 0.5):
        p = params_from_dict({"models": {"dir": str(tmp_path / str(w))}, "gates": {"kinds": ["lightgbm"],
                                                                                  "impact_weight": w}})
        train_gates(p, train, val)
        scores[w] = {n: load_gate(p, n).model.token_scores(features_of(val)) for n in learned_names(p)}
    assert not np.allclose(scores[0.0]["tok-lightgbm-critical"], scores[0.5]["tok-lightgbm-critical"])
    np.testing.assert_array_equal(scores[0.0]["tok-lightgbm-mismatch"], scores[0.5]["tok-lightgbm-mismatch"])


def test_the_gain_target_is_chosen_by_the_gain_it_captures_and_leads_as_the_first_target(tmp_path):
    import numpy as np

    from speccap.pipeline.dagger import round_gate
    from speccap.pipeline.gates import captured, main_gate
    p = params_from_dict({"models": {"dir": str(tmp_path)}, "gates": {
        "targets": ["gain", "critical"], "kinds": ["logistic", "lightgbm"], "budgets": [0.05, 0.15],
        "promote_budget": 0.15}})
    train, val = shadow_table(0), shadow_table(1)
    result = train_gates(p, train, val)
    assert list(result["chosen"]) == ["gain", "critical"]
    assert main_gate(result["chosen"]) == result["chosen"]["gain"] == round_gate(result)
    gain = [n for n in learned_names(p) if n.endswith("-gain")]
    share = {n: np.mean(list(result["gates"][n]["captured"]["0.15"].values())) for n in gain}
    assert result["chosen"]["gain"] == max(gain, key=share.get)
    for n in learned_names(p):
        cap = result["gates"][n]["captured"]
        for lang in ("en", "zh"):  # a share, and a bigger budget buys at least as much
            assert 0 <= cap["0.05"][lang] <= cap["0.15"][lang] <= 1
    # captured against an independent count: flag everything, capture everything; flag nothing, nothing
    scores = np.arange(len(val), dtype=float)
    assert captured(val, scores, [1.0])["1.0"] == {"en": 1.0, "zh": 1.0}
    # a budget of 10%: the highest-scoring tenth of each language's tokens, counted here by sorting
    gain_val = np.clip(val["impact"].to_numpy(float), 0, None)
    en = (val["language"] == "en").to_numpy()
    top = np.argsort(-scores[en])[:int(np.ceil(0.1 * en.sum()))]
    expect = gain_val[en][top].sum() / gain_val[en].sum()
    assert captured(val, scores, [0.1])["0.1"]["en"] == pytest.approx(expect)


def _with_temperatures(df, seed):
    """entropy_at at T = 0.5, 1, 2: noise at 0.5, the table's entropy at 1, and at 2 a score that
    follows the tokens' gain (the temperature tuning must find it)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    gain = df["impact"].to_numpy(float)
    ent = np.stack(df["entropy_at"].to_numpy())[:, 0]
    df = df.copy()
    df["entropy_at"] = list(np.stack([rng.random(len(df)), ent, gain + rng.random(len(df))], axis=1))
    return df


def test_the_entropy_baseline_takes_the_temperature_whose_flags_capture_most_gain(tmp_path):
    import numpy as np

    from speccap.pipeline.gates import entropy_section
    p = params_from_dict({"models": {"dir": str(tmp_path)}, "gates": {
        "budgets": [0.05, 0.1], "entropy_temperatures": [0.5, 1.0, 2.0], "kinds": ["logistic"]}})
    val = _with_temperatures(shadow_table(1), 1)
    result = train_gates(p, _with_temperatures(shadow_table(0), 0), val)
    ent = result["gates"]["entropy"]
    at = np.stack(val["entropy_at"].to_numpy())
    for b in ("0.05", "0.1"):
        for lang in ("en", "zh"):
            assert ent["temperature"][b][lang] == 2.0
            assert ent["captured_by_temperature"]["2"][b][lang] > ent["captured_by_temperature"]["1"][b][lang]
            mask = (val["language"] == lang).to_numpy()
            flagged = (at[mask, 2] > ent["thresholds"][b][lang]).mean()  # the budget's share, at T = 2
            assert abs(flagged - float(b)) < 0.01
    # the thresholds at temperature 1 kept beside: the budget's share of the entropy feature
    from speccap.gating.features import TOKEN_SCALARS
    from speccap.pipeline.traces import features_of
    raw = features_of(val)[:, TOKEN_SCALARS.index("entropy")]
    for b in ("0.05", "0.1"):
        mask = (val["language"] == "zh").to_numpy()
        assert abs((raw[mask] > ent["untuned_thresholds"][b]["zh"]).mean() - float(b)) < 0.01
    text = entropy_section(ent)
    assert "| en | 0.05 | 2 |" in text and "0.5, 1, 2" in text


def test_entropy_tuning_names_the_traces_when_they_lack_the_temperatures(tmp_path):
    p = params_from_dict({"models": {"dir": str(tmp_path)}, "gates": {"entropy_temperatures": [0.5, 1.0],
                                                                      "kinds": ["logistic"]}})
    with pytest.raises(ValueError, match=r"val\.parquet keeps the entropy at 1 temperatures.*names 2"):
        train_gates(p, shadow_table(0), shadow_table(1))
    with pytest.raises(ValueError, match=r"val\.parquet has no column entropy_at.*dvc repro traces"):
        train_gates(p, shadow_table(0), shadow_table(1).drop(columns="entropy_at"))


@pytest.mark.skipif(usable_cores() < 2, reason="the LightGBM fits go to a worker only beside another core")
def test_gates_fitted_in_a_worker_are_the_bytes_fitted_here(tmp_path, monkeypatch):
    from speccap.pipeline import gates
    made = {}
    for where, rows in (("here", 10**9), ("worker", 0)):
        monkeypatch.setattr(gates, "ASIDE_ROWS", rows)
        p = params_from_dict({"models": {"dir": str(tmp_path / where)}})
        train_gates(p, shadow_table(0), shadow_table(1))
        made[where] = {f.name: f.read_bytes() for f in sorted((tmp_path / where / "gates").iterdir())
                       if f.suffix in (".json", ".csv")}
    assert any(name.startswith("tok-lightgbm") for name in made["here"])
    assert made["worker"] == made["here"]
