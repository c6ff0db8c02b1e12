import json

import pytest

from speccap.config import params_from_dict
from speccap.pipeline.gate_names import ORACLE
from speccap.pipeline.gate_pareto import _on_axis
from speccap.pipeline.gate_report import decode_references, gate_configs


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
    assert len(oracle) == 1 and oracle[0].spec.gate == "always" and oracle[0].spec.token == "alone"
    names = {(tags[c]["gate_name"], tags[c]["budget"]) for c in en if c in tags and tags[c]["gate_name"] != ORACLE}
    for b in (0.05, 0.1):
        assert {("entropy", b), ("entropy-block", b), ("tok-lightgbm-critical", b), ("tok-mlp-mismatch", b)} <= names
    pending = [c for c in en if c in tags and tags[c]["gate_name"].endswith("(pending)")]
    assert len(pending) == 1 and pending[0].spec.token == "pending" and pending[0].spec.threshold == 0.7
    block = [c for c in en if c in tags and tags[c]["gate_name"] == "entropy-block"]
    assert all(c.spec.token is None and c.spec.block_len == p.gates.traces.block_len for c in block)
    assert len({c.name for c in configs}) == len(configs)  # every run has its own name (and records)


def test_the_entropy_rows_run_at_the_temperature_tuned_for_their_budget_and_language():
    p = params_from_dict({"gates": {"budgets": [0.05, 0.1], "promote_budget": 0.1}})
    tuned = _gates_json()
    tuned["gates"]["entropy"]["temperature"] = {"0.05": {"en": 0.5, "zh": 1.0}, "0.1": {"en": 2.0, "zh": 1.0}}
    tuned["gates"]["entropy"]["untuned_thresholds"] = {"0.05": {"en": 1.5, "zh": 0.8}, "0.1": {"en": 1.2, "zh": 0.6}}
    configs, tags = gate_configs(p, tuned)
    ent = {(c.language, tags[c]["budget"]): c for c in configs if c in tags and tags[c]["gate_name"] == "entropy"}
    assert ent["en", 0.05].spec.gate_temperature == 0.5 and ent["en", 0.1].spec.gate_temperature == 2.0
    # where tuning moved the temperature, the untuned rule runs beside it at its own threshold
    raw = {(c.language, tags[c]["budget"]): c for c in configs if c in tags and tags[c]["gate_name"] == "entropy (T = 1)"}
    assert set(raw) == {("en", 0.05), ("en", 0.1)}
    assert (raw["en", 0.05].spec.gate_temperature, raw["en", 0.05].spec.threshold) == (None, 1.5)
    plain, plain_tags = gate_configs(p, _gates_json())  # temperature 1: the untuned rows, records and all
    assert {c for c in plain if plain_tags.get(c, {}).get("gate_name") == "entropy" and c.language == "zh"} \
        == {ent["zh", 0.05], ent["zh", 0.1]}
    block = [c for c in configs if c in tags and tags[c]["gate_name"] == "entropy-block"]
    assert all(c.spec.gate_temperature is None for c in block)  # UGSD's block gate stays as published


def test_token_rows_judge_flagged_tokens_by_the_rank_chosen_per_language():
    p = params_from_dict({"decode": {"rule": "rank", "rank": 2}, "gates": {"budgets": [0.1], "promote_budget": 0.1}})
    plain, _ = gate_configs(p, _gates_json())
    configs, tags = gate_configs(p, _gates_json() | {"verify_rank": {"chosen": {"en": 1, "zh": 2}}})
    token = {lang: [c for c in configs if c.language == lang and c.spec and c.spec.token is not None] for lang in ("en", "zh")}
    assert token["en"] and all((c.spec.rule, c.spec.rank) == ("rank", 1) for c in token["en"])  # oracle included
    assert any(tags[c]["gate_name"] == ORACLE for c in token["en"])
    # zh keeps decode's R: the very configurations (and records) of the evaluation without a choice
    assert token["zh"] == [c for c in plain if c.language == "zh" and c.spec and c.spec.token is not None]
    block = [c for c in configs if c in tags and tags[c]["gate_name"] == "entropy-block"]
    assert block and all((c.spec.rule, c.spec.rank) == ("rank", 2) for c in block)  # UGSD's block gate: decode's rule


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


def test_detail_configs_run_on_fewer_clips_and_pair_with_edge_and_cloud_on_those(tmp_path):
    import numpy as np
    import pytest

    from speccap.metrics.bootstrap import ClipStats, gap_closed
    from speccap.pipeline.gate_report import build_gate_report, gate_clips
    p = params_from_dict({"data": {"languages": ["en"]}, "gates": {"budgets": [0.05, 0.1], "promote_budget": 0.1,
                                                                   "detail_clips": 3}})
    configs, tags = gate_configs(p, _gates_json())
    clips = {"en": [{"id": f"c{i}"} for i in range(8)]}
    clips_of = gate_clips(p, tags, clips)
    n = {tags[c]["gate_name"]: len(clips_of(c)) for c in configs if c in tags}
    assert n == {ORACLE: 8, "entropy": 8, "tok-lightgbm-critical": 8, "entropy-block": 3, "tok-mlp-mismatch": 3,
                 "tok-lightgbm-critical (pending)": 3}
    assert len(gate_clips(params_from_dict({}), tags, clips)(configs[-1])) == 8  # 0 = all clips for all

    rng = np.random.default_rng(0)
    ids = [c["id"] for c in clips["en"]]

    def stats(level, k=8):
        return ClipStats(ids[:k], {"bleu1_match": rng.integers(5, 10, k) + level, "bleu1_count": np.full(k, 20.0),
                                   "hyp_len": np.full(k, 20.0), "ref_len": np.full(k, 20.0),
                                   "meteor": rng.normal(50 + level, 1, k), "rouge_l": rng.normal(50 + level, 1, k),
                                   "emotion_hit": 100.0 * (rng.random(k) < 0.3 + 0.05 * level)})
    m = {"total_time": 1.0, "tokens": 20.0, "drafted": 20.0, "rho": 0.05, "rounds": 1.0}
    edge, cloud, gate, detail = stats(0), stats(6), stats(4), stats(2, 3)
    rows = [{"method": "edge", "language": "en", "status": "FINISHED", "metrics": m, "clip_stats": edge.to_json()},
            {"method": "cloud", "language": "en", "status": "FINISHED", "metrics": m, "clip_stats": cloud.to_json()}]
    for name, st in (("tok-lightgbm-critical", gate), ("entropy-block", detail)):
        rows.append({"method": "ugsd", "language": "en", "status": "FINISHED", "metrics": m, "gate_name": name,
                     "budget": 0.1, "threshold": 0.5, "clip_stats": st.to_json()})
    r = build_gate_report(p, {"configs": rows}, tmp_path)
    got = {name: e[0] for name, e in r["languages"]["en"]["gates"].items()}
    assert got["tok-lightgbm-critical"]["clips"] == 8 and got["entropy-block"]["clips"] == 3
    sub = gap_closed(edge.subset(ids[:3]), detail, cloud.subset(ids[:3]), "bleu1")
    assert got["entropy-block"]["gap_closed_bleu1"]["value"] == pytest.approx(sub["value"])
    assert got["tok-lightgbm-critical"]["gap_closed_bleu1"]["value"] == pytest.approx(
        gap_closed(edge, gate, cloud, "bleu1")["value"])
    assert "the first 3 (`gates.detail_clips`" in (tmp_path / "gates.md").read_text()
    # the time ratio comes with its parts, which add up to it, in the record and in the target line
    parts = got["tok-lightgbm-critical"]["papers_x_edge_parts"]
    assert sum(parts.values()) == pytest.approx(got["tok-lightgbm-critical"]["papers_x_edge"])
    line = next(x for x in r["languages"]["en"]["targets"]["lines"] if x.startswith("tok-lightgbm-critical"))
    assert f"edge forwards {parts['edge']:.3f}" in line and f"link {parts['link']:.3f}" in line
    with pytest.raises(ValueError, match="not in these stats"):
        edge.subset(["nope"])


def test_the_dagger_rounds_have_their_section():
    from speccap.pipeline.gate_report import dagger_section
    stats = {"clips": 4, "mismatch_rate": 0.1, "critical_rate": 0.02}
    md = dagger_section([{"round": 1, "gate": "tok-lightgbm-critical", "traces": {"train": stats, "val": stats},
                          "corrected_share_of_val_tokens": 0.015, "chosen_after": "tok-mlp-critical",
                          "val_auc_before": {"critical": 0.71, "mismatch": None},
                          "val_auc_after": {"critical": 0.83, "mismatch": 0.9}}])
    assert "| 1 | tok-lightgbm-critical | 4 / 4 | 0.100 | 0.020 | 0.015 | 0.710 -> 0.830 | – -> 0.900 |" in md


def test_the_oracles_at_a_budget_are_configured_and_a_gate_is_held_against_the_largest_within_it():
    from speccap.pipeline.gate_names import is_oracle, oracle_name
    from speccap.pipeline.gate_report import oracle_at
    p = params_from_dict({"gates": {"budgets": [0.1], "promote_budget": 0.1, "oracle_corrections": [1, 3]}})
    configs, tags = gate_configs(p, _gates_json())
    capped = [c for c in configs if c.language == "en" and c.spec and c.spec.corrections is not None]
    assert [(c.spec.gate, c.spec.token, c.spec.corrections) for c in capped] == [("always", "alone", 1), ("always", "alone", 3)]
    assert [tags[c]["gate_name"] for c in capped] == [oracle_name(1), oracle_name(3)]
    assert all(is_oracle(tags[c]["gate_name"]) for c in capped) and not is_oracle("tok-lightgbm-critical")
    assert len({c.name for c in configs}) == len(configs) and "first3" in capped[1].name
    per_gate = {ORACLE: [{"rho": 0.04}], oracle_name(1): [{"rho": 0.03}], oracle_name(3): [{"rho": 0.09}],
                oracle_name(6): [{"rho": 0.12}], "entropy": [{"rho": 0.1}]}
    assert oracle_at(per_gate, 0.1)[0] == oracle_name(3)   # the most within 0.1; the unlimited one never
    assert oracle_at(per_gate, 0.05)[0] == oracle_name(1)
    assert oracle_at(per_gate, 0.02) is None
    with pytest.raises(Exception, match="oracle_corrections"):
        params_from_dict({"gates": {"oracle_corrections": [0]}})


def test_the_pareto_axis_shows_the_budgets_and_names_a_row_far_beyond_them():
    def e(rho, budget):
        return {"rho": rho, "budget": budget}
    series = {"entropy": [e(0.05, 0.05), e(0.1, 0.1)], "tok-gain (pending)": [e(0.86, 0.1)],
              ORACLE: [e(0.04, None), e(0.28, None)]}  # the oracle's curve is drawn whole
    kept, far, x_max = _on_axis(series)
    assert far == [("tok-gain (pending)", e(0.86, 0.1))] and kept["tok-gain (pending)"] == []
    assert len(kept[ORACLE]) == 2 and x_max == pytest.approx(1.1 * 0.28)


def test_the_ceiling_has_its_rows_its_reach_and_the_gates_distance_to_it_on_its_clips(tmp_path):
    import numpy as np

    from speccap.metrics.bootstrap import ClipStats, gap_closed
    from speccap.pipeline.gate_names import CEILING
    from speccap.pipeline.gate_report import build_gate_report
    p = params_from_dict({"data": {"languages": ["en"]}, "gates": {"budgets": [0.05], "promote_budget": 0.05}})
    ids = [f"c{i}" for i in range(8)]

    def stats(level, hits, k=8):
        return ClipStats(ids[:k], {"bleu1_match": np.full(k, 10.0 + level) + np.arange(k) % 2,
                                   "bleu1_count": np.full(k, 20.0), "hyp_len": np.full(k, 20.0),
                                   "ref_len": np.full(k, 20.0), "meteor": np.full(k, 50.0), "rouge_l": np.full(k, 50.0),
                                   "emotion_hit": 100.0 * (np.arange(k) < hits)})
    m = {"total_time": 1.0, "tokens": 20.0, "drafted": 20.0, "rho": 0.05, "rounds": 1.0}
    edge, cloud, gate = stats(0, 1), stats(6, 7), stats(3, 4)
    rows = [{"method": "edge", "language": "en", "status": "FINISHED", "metrics": m, "clip_stats": edge.to_json()},
            {"method": "cloud", "language": "en", "status": "FINISHED", "metrics": m, "clip_stats": cloud.to_json()},
            {"method": "ugsd", "language": "en", "status": "FINISHED", "metrics": m, "gate_name": "tok-mlp-gain",
             "budget": 0.05, "threshold": 0.5, "clip_stats": gate.to_json()}]
    for b, level, hits in ((0.03, 2, 2), (0.05, 6, 2)):  # the ceiling on the first 4 clips only
        rows.append({"method": "ugsd", "language": "en", "status": "FINISHED", "gate_name": CEILING, "budget": b,
                     "threshold": None, "clip_stats": stats(level, hits, 4).to_json(),
                     "metrics": {"rho": b, "corrected": 2, "drafted": 80, "corrections_per_caption": 0.5}})
    r = build_gate_report(p, {"configs": rows}, tmp_path)["languages"]["en"]
    ceiling = r["gates"][CEILING]
    assert [e["budget"] for e in ceiling] == [0.03, 0.05] and ceiling[0]["clips"] == 4
    assert ceiling[0]["papers_time"] is None  # a search has no clock
    # at 0.05 it closes the whole BLEU-1 gap but not 75% of the emotion hit's: beyond any gate there
    assert ceiling[1]["gap_closed_bleu1"]["value"] == pytest.approx(100.0)
    assert ceiling[1]["gap_closed_emotion_hit_rate"]["value"] < 75
    assert ">= 75% of both gaps at rho* <= 0.05: beyond any gate here (the ceiling at rho* 0.05 closes" in \
        "\n".join(r["ceiling"])
    assert any(line.startswith(">= 90% of both gaps at rho* <= 0.07: beyond") for line in r["ceiling"])
    # the gate is held against it on the ceiling's 4 clips, paired with edge and cloud there
    g = r["gates"]["tok-mlp-gain"][0]
    four = gap_closed(edge.subset(ids[:4]), gate.subset(ids[:4]), cloud.subset(ids[:4]), "bleu1")
    assert g["on_ceiling_clips"]["bleu1"]["value"] == pytest.approx(four["value"])
    line = next(x for x in r["targets"]["lines"] if x.startswith("tok-mlp-gain"))
    assert "on the ceiling's 4 clips the gate closes" in line
    text = (tmp_path / "gates.md").read_text()
    assert "## The ceiling at each budget" in text and "| en | ceiling | 0.03 | 4 |" in text
    assert (tmp_path / "pareto.png").stat().st_size > 0


def test_cross_fitting_leaves_out_the_untuned_entropy_row_that_only_some_folds_would_have(tmp_path):
    from speccap.pipeline.crossfit import crossfit_configs
    from speccap.pipeline.saved import gate_dir
    p = params_from_dict({"models": {"dir": str(tmp_path)}, "data": {"cross_fit": {"folds": 3}},
                          "gates": {"budgets": [0.05, 0.1], "promote_budget": 0.1}})
    for f, t in enumerate((0.5, 1.0, 1.0)):  # fold 0 tuned to 0.5 everywhere, the others kept 1
        own = _gates_json()
        own["gates"]["entropy"] |= {"temperature": {b: {"en": t, "zh": t} for b in ("0.05", "0.1")},
                                    "untuned_thresholds": own["gates"]["entropy"]["thresholds"]}
        gate_dir(p, f).mkdir(parents=True)
        (gate_dir(p, f) / "gates.json").write_text(json.dumps(own))
    configs, tags = crossfit_configs(p, _gates_json())
    names = {tags[c]["gate_name"] for c in configs if c in tags}
    assert "entropy" in names and "entropy (T = 1)" not in names
    folds = {}
    for c in configs:
        if c in tags and tags[c].get("fold") is not None:
            folds.setdefault((tags[c]["gate_name"], tags[c]["budget"], c.language), set()).add(tags[c]["fold"])
    assert folds and all(f == {0, 1, 2} for f in folds.values())  # every gated row in every fold
    tuned = [c for c in configs if c in tags and tags[c]["gate_name"] == "entropy" and tags[c].get("fold") == 0]
    assert tuned and all(c.spec.gate_temperature == 0.5 for c in tuned)
