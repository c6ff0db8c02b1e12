import json

from speccap.config import params_from_dict
from speccap.pipeline.gate_report import ORACLE, decode_references, gate_configs


def _gates_json():
    thr = {"0.05": {"en": 0.9, "zh": 0.8}, "0.1": {"en": 0.7, "zh": 0.6}}
    return {"chosen": {"critical": "tok-lightgbm-critical", "mismatch": "tok-mlp-mismatch"},
            "gates": {"entropy": {"thresholds": thr}, "entropy-block": {"thresholds": thr},
                      "tok-lightgbm-critical": {"thresholds": thr}, "tok-mlp-mismatch": {"thresholds": thr}}}


def test_configs_hold_the_oracle_both_entropy_levels_the_chosen_gates_and_the_other_variant():
    p = params_from_dict({"gates": {"budgets": [0.05, 0.1], "promote_budget": 0.1}})
    configs, tags = gate_configs(p, _gates_json())
    en = [c for c in configs if c.language == "en"]
    assert [c.method for c in en[:2]] == ["edge", "cloud"]
    oracle = [c for c in en if tags.get(c, {}).get("gate_name") == ORACLE]
    assert len(oracle) == 1 and oracle[0].gate == "always" and oracle[0].token == "alone"
    names = {(tags[c]["gate_name"], tags[c]["budget"]) for c in en if c in tags and tags[c]["gate_name"] != ORACLE}
    for b in (0.05, 0.1):
        assert {("entropy", b), ("entropy-block", b), ("tok-lightgbm-critical", b), ("tok-mlp-mismatch", b)} <= names
    pending = [c for c in en if c in tags and tags[c]["gate_name"].endswith("(pending)")]
    assert len(pending) == 1 and pending[0].token == "pending" and pending[0].threshold == 0.7
    block = [c for c in en if c in tags and tags[c]["gate_name"] == "entropy-block"]
    assert all(c.token is None and c.block_len == p.gates.traces.block_len for c in block)
    assert len({c.name for c in configs}) == len(configs)  # every run has its own name (and records)


def test_decode_references_are_reused_only_for_the_same_clips(tmp_path):
    clips = {"en": [{"id": "a"}, {"id": "b"}], "zh": [{"id": "c"}]}
    rows = [{"method": "edge", "language": "en", "status": "FINISHED", "clip_stats": {"ids": ["a", "b"]}},
            {"method": "cloud", "language": "en", "status": "FINISHED", "clip_stats": {"ids": ["a"]}},
            {"method": "ugsd", "language": "en", "status": "FINISHED", "clip_stats": {"ids": ["a", "b"]}},
            {"method": "edge", "language": "zh", "status": "FAILED"}]
    path = tmp_path / "decode_summary.json"
    assert decode_references(path, clips) == []  # no decode summary: caption them here
    path.write_text(json.dumps({"configs": rows}))
    assert decode_references(path, clips) == rows[:1]
