import pytest

from speccap.config import LinkConfig
from speccap.decoding.engine import SpecSettings, speculative
from speccap.decoding.gates import make_gate
from speccap.decoding.link import Link
from speccap.decoding.policies import Fixed
from speccap.decoding.verify import Rank
from speccap.gating.ceiling import PlanWalker, _hull_steps, allocate, greedy_curve

MAX = 14


def _loop(edge, cloud, mel, plan, rank=1):
    """What the blocking loop writes with every token judged and the rank rule holding `plan`."""
    settings = SpecSettings(gate=make_gate("always", None, "token", "alone"), rule=Rank(rank, plan=frozenset(plan)),
                            policy=Fixed(4), max_new_tokens=MAX)
    return speculative(edge, cloud, mel, "en", settings, Link(LinkConfig()))


def test_a_plans_caption_is_the_blocking_loops_whatever_the_walker_held_before(pair, audio):
    edge, cloud = pair
    walker = PlanWalker(edge, cloud, audio[1], "en", 1, MAX)
    base = walker.walk(frozenset())
    assert len(base.mismatches) >= 3  # two random models disagree: plans to choose from
    plans = [(), (1,), (0, 2), tuple(range(MAX))]
    for plan in plans + plans[::-1]:  # each walk starts from what the previous one left in the sessions
        t = walker.walk(frozenset(plan))
        rec = _loop(edge, cloud, audio[1], plan)
        assert (list(t.tokens), t.drafted, t.corrected) == (rec.token_ids, rec.drafted, rec.corrected), plan
    # a walk continuing another caption from one of its mismatches writes what a fresh walk writes
    for j in (0, 2):
        fresh = PlanWalker(edge, cloud, audio[1], "en", 1, MAX).walk(frozenset({j}))
        assert walker.walk(frozenset({j}), base, j) == fresh
    with pytest.raises(ValueError, match="R >= 1"):
        PlanWalker(edge, cloud, audio[1], "en", 0, MAX)


def test_the_greedy_curve_keeps_the_best_caption_within_each_number_of_corrections(pair, audio):
    edge, cloud = pair
    target = set(_loop(edge, cloud, audio[1], range(MAX)).token_ids)  # the cloud's own caption's tokens

    def score(t):
        return len(set(t.tokens) & target) - 0.01 * len(t.tokens)
    curve = greedy_curve(PlanWalker(edge, cloud, audio[1], "en", 1, MAX), score, steps=3, patience=3)
    assert curve[0].plan == frozenset() and len(curve) == 4
    values = [score(t) for t in curve]
    assert values == sorted(values) and values[-1] > values[0]  # corrections toward the cloud's caption pay
    assert all(t.corrected <= k for k, t in enumerate(curve))
    # nothing ever better: the search stops after `patience` steps
    assert len(greedy_curve(PlanWalker(edge, cloud, audio[1], "en", 1, MAX), lambda t: 0.0, 6, patience=1)) == 2


def test_the_budget_is_spent_where_a_correction_buys_the_most():
    values = [[0.0, 8.0, 9.0], [0.0, 2.0, 20.0]]  # clip 1's second correction is what pays
    corrected = [[0, 1, 2], [0, 1, 2]]
    drafted = [[10, 10, 10], [10, 10, 10]]
    assert _hull_steps(values[1], corrected[1]) == [(0, 2)]  # the hull skips the dip
    assert _hull_steps(values[0], corrected[0]) == [(0, 1), (1, 2)]
    assert allocate(values, drafted, corrected, 0.1) == [0, 2]   # 2 corrections of 20 tokens: clip 1's pair
    assert allocate(values, drafted, corrected, 0.15) == [1, 2]  # a third: clip 0's first
    assert allocate(values, drafted, corrected, 0.01) == [0, 0]
    # what a plan drafts counts: a correction that lengthens the caption makes room for itself
    assert allocate([[0.0, 5.0]], [[9, 10]], [[0, 1]], 0.1) == [1]
    assert allocate([[0.0, 5.0]], [[11, 9]], [[0, 1]], 0.1) == [0]
    # no gain, no spending
    assert allocate([[3.0, 3.0, 2.0]], [[10, 10, 10]], [[0, 1, 2]], 1.0) == [0]
