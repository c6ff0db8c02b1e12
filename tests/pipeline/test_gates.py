import pickle

import pytest

from speccap.config import params_from_dict
from speccap.pipeline.gates import is_learned, learned_names, load_gate, train_gates

from ..gating.test_learned import _traces


def test_train_gates_saves_each_gate_with_thresholds_per_budget(tmp_path):
    p = params_from_dict({"models": {"dir": str(tmp_path)}, "gates": {"budgets": [0.05, 0.15, 0.5]}})
    result = train_gates(p, _traces(seed=0), _traces(seed=1))
    assert set(result["gates"]) == set(learned_names(p)) | {"entropy", "margin"}
    for name in learned_names(p):
        g = result["gates"][name]
        for lang in ("en", "zh"):  # calibrated per language
            thr = [g["thresholds"][str(b)][lang] for b in (0.05, 0.15, 0.5)]
            assert thr == sorted(thr, reverse=True)  # a bigger budget lowers the bar
        assert g["auc_mismatch" if name.endswith("mismatch") else "auc_critical"] > 0.7
        saved = pickle.loads((tmp_path / "gates" / f"{name}.pkl").read_bytes())
        assert saved["threshold"] == g["thresholds"]["0.15"] or p.gates.promote_budget != 0.15
        assert (tmp_path / "gates" / f"{name}.importance.csv").exists()
    # margin thresholds come back in the gate's own units (delta), growing with the budget
    m = [result["gates"]["margin"]["thresholds"][str(b)]["en"] for b in (0.05, 0.15, 0.5)]
    assert m == sorted(m)
    assert (tmp_path / "gates" / "calibration.png").stat().st_size > 5000
    gate = load_gate(p, "lightgbm-critical", 0.3)
    assert gate.threshold == 0.3 and gate.name == "lightgbm-critical"
    default = load_gate(p, "lightgbm-critical")  # the promote budget's thresholds, one per language
    assert set(default.thresholds) == {"en", "zh"}
    assert default.threshold_for("zh") == result["gates"]["lightgbm-critical"]["thresholds"]["0.15"]["zh"]
    assert is_learned("logistic-mismatch") and not is_learned("entropy")
    with pytest.raises(FileNotFoundError, match="dvc repro gates"):
        load_gate(p, "lightgbm-nothing")


def test_missing_gates_json_names_the_file_and_the_stage(tmp_path):
    from speccap.pipeline.gates import read_gates_json
    p = params_from_dict({"models": {"dir": str(tmp_path)}})
    with pytest.raises(FileNotFoundError, match=r"gates\.json.*dvc repro gates"):
        read_gates_json(p)
