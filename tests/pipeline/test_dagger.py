import pytest

from speccap.config import params_from_dict
from speccap.pipeline.dagger import round_settings
from speccap.pipeline.gates import train_gates

from ..gating.test_token_gates import shadow_table


def test_a_round_runs_its_gate_at_the_promote_budget_or_at_the_budget_asked(tmp_path):
    p = params_from_dict({"models": {"dir": str(tmp_path)}, "gates": {"budgets": [0.05, 0.15],
                                                                      "promote_budget": 0.15}})
    result = train_gates(p, shadow_table(0), shadow_table(1))
    name = result["chosen"]["critical"]
    thresholds = result["gates"][name]["thresholds"]
    settings, model = round_settings(p, name)
    assert settings.threshold == thresholds["0.15"] and settings.gate == name and model is not None
    low, _ = round_settings(p, name, 0.05)
    assert low.threshold == thresholds["0.05"] != settings.threshold
    assert low.gate_sha == settings.gate_sha  # the same gate file: only where it flags differs
    with pytest.raises(ValueError, match=r"no thresholds for budget 0.2 \(it has 0.05, 0.15"):
        round_settings(p, name, 0.2)
