import json

import pytest

from speccap.pipeline import workers
from speccap.pipeline.ceiling import CeilingSettings, ceiling_one, ceiling_rows, objective, search
from speccap.pipeline.gate_names import CEILING
from speccap.pipeline.splits import eval_clips

REFS = ["the speaker sounds calm and steady", "a calm steady voice, she sounds neutral"]


def _point(plan, caption, drafted, corrected, score):
    return {"plan": plan, "caption": caption, "drafted": drafted, "corrected": corrected, "score": score}


def test_each_budget_row_scores_the_captions_its_allocation_picks():
    clips = [{"id": "a", "references": REFS, "emotion": "neutral"}, {"id": "b", "references": REFS, "emotion": "neutral"}]
    curves = [{"id": "a", "curve": [_point([], "a loud shout", 10, 0, 0.0), _point([0], "a calm steady voice", 10, 1, 9.0)]},
              {"id": "b", "curve": [_point([], "loud", 10, 0, 0.0), _point([1], "calm", 10, 1, 2.0)]}]
    rows = ceiling_rows(curves, clips, "en", (0.05, 0.1))
    assert [r["budget"] for r in rows] == [0.05, 0.1] and all(r["gate_name"] == CEILING for r in rows)
    # 0.05 of 20 tokens: one correction, where it buys the most (clip a); 0.1: both
    assert [r["metrics"]["corrected"] for r in rows] == [1, 2] and rows[0]["metrics"]["rho"] == 0.05
    stats = [r["clip_stats"] for r in rows]
    assert stats[0]["ids"] == ["a", "b"] and stats[0]["bleu1_match"][1] == 0 < stats[1]["bleu1_match"][1]
    assert rows[1]["metrics"]["bleu1"] > rows[0]["metrics"]["bleu1"]


def test_the_objective_weighs_a_point_of_either_gap_alike():
    s = CeilingSettings(rank=1, steps=2, max_new_tokens=8, bleu1_gap=10.0, emotion_gap=50.0)
    caption = REFS[1]  # BLEU-1 100 against itself, and it names the emotion
    assert objective(s, REFS, "neutral", "en")(caption) == pytest.approx(100 / 10 + 100 / 50)
    assert objective(s, REFS, "sad", "en")(caption) == pytest.approx(100 / 10)  # the hit: 2 of 10 BLEU-1 points
    assert objective(s, REFS, "neutral", "en")("") == 0.0


def test_the_search_keeps_each_clip_as_it_comes_and_searches_only_those_missing(tiny_project, tmp_path):
    params, _, params_file = tiny_project
    clips = eval_clips(params, "en")[:2]
    asked = []

    class Counting(workers.Pool):
        def imap(self, jobs):
            jobs = list(jobs)
            asked.append([j[0] for j in jobs])
            return super().imap(jobs)
    pool = Counting(str(params_file), 0, 1, fn=ceiling_one)
    s = CeilingSettings(1, 2, params.models.max_new_tokens, 10.0, 50.0)
    first = search(params, pool, "en", clips[:1], s, "models-a", tmp_path)
    both = search(params, pool, "en", clips, s, "models-a", tmp_path)
    assert asked == [[clips[0]["id"]], [clips[1]["id"]]] and both[0] == first[0]
    curve = both[1]["curve"]
    assert curve[0]["plan"] == [] and curve[0]["corrected"] == 0 and len(curve) >= 1
    assert all(p["corrected"] <= k for k, p in enumerate(curve))
    search(params, pool, "en", clips, s, "models-b", tmp_path)  # other models: searched again
    assert asked[-1] == [c["id"] for c in clips]
    lines = (tmp_path / f"{CEILING}.en.jsonl").read_text().splitlines()  # models-a's curves are no longer kept
    assert [json.loads(line)["id"] for line in lines] == [c["id"] for c in clips]
    assert all(json.loads(line)["curve"] for line in lines)


def test_a_target_is_within_reach_when_the_ceiling_at_its_largest_budget_reaches_it():
    from speccap.pipeline.ceiling import ceiling_lines

    def row(b, bleu, emo):
        share = lambda v: {"value": v, "ci_low": v - 5, "ci_high": v + 5, "significant_gap": True}  # noqa: E731
        return {"budget": b, "rho": b, "clips": 10, "corrections_per_caption": 1.0,
                "gap_closed_bleu1": share(bleu), "gap_closed_emotion_hit_rate": share(emo)}
    # 0.03 misses 75%, but a gate may spend up to 0.05 on it; 0.07's 90% fails on the emotion hit
    lines = ceiling_lines({CEILING: [row(0.03, 60, 50), row(0.05, 80, 76), row(0.07, 95, 89)]},
                          ["bleu1", "emotion_hit_rate"])
    assert lines[3] == ">= 75% of both gaps at rho* <= 0.05: within reach (the ceiling at rho* 0.05 closes 80 / 76%)"
    assert lines[4].startswith(">= 90% of both gaps at rho* <= 0.07: beyond any gate here")
    assert ceiling_lines({}, ["bleu1"]) == []
