"""The token-level loop: the gate scores each token as it is drafted and verifies at once."""

import math

import pytest

from speccap.config import LinkConfig
from speccap.decoding.engine import SpecSettings, cloud_only, edge_only, speculative
from speccap.decoding.gates import Gate, make_gate
from speccap.decoding.link import Link
from speccap.decoding.policies import Fixed
from speccap.decoding.rules import make_rule

from .test_engine import MAX


def _spec(gate, rule="greedy", rank=1, **kw):
    return SpecSettings(gate=gate, rule=make_rule(rule, rank=rank), policy=Fixed(4), max_new_tokens=MAX, **kw)


@pytest.mark.parametrize("verify", ["alone", "pending"])
def test_threshold_plus_inf_is_edge_only_exactly(pair, audio, verify):
    edge, cloud = pair
    ref = edge_only(edge, audio[1], "en", MAX)
    rec = speculative(edge, cloud, audio[1], "en", _spec(make_gate("entropy", math.inf, "token", verify)),
                      Link(LinkConfig()))
    assert rec.token_ids == ref.token_ids
    assert rec.rounds == 0 and rec.bytes_up == 0 and rec.drafted == len(ref.token_ids)


@pytest.mark.parametrize("verify", ["alone", "pending"])
def test_threshold_minus_inf_with_greedy_is_cloud_only_exactly(pair, audio, verify):
    edge, cloud = pair
    ref = cloud_only(cloud, audio[1], "en", Link(LinkConfig()), MAX)
    rec = speculative(edge, cloud, audio[1], "en", _spec(make_gate("entropy", -math.inf, "token", verify)),
                      Link(LinkConfig()))
    assert rec.token_ids == ref.token_ids
    assert rec.corrected > 0  # the two models really disagreed
    # every token is flagged as it is drafted: one token per round, never more
    assert rec.transmitted == rec.drafted == rec.rounds


class _FlagAt(Gate):
    """Flags the tokens drafted at the given caption positions (records what it was shown)."""

    name = "flag-at"

    def __init__(self, positions):
        self.positions, self.seen = set(positions), []

    def escalate(self, block):
        raise AssertionError("a token gate is asked per token, never per block")

    def flag(self, block):
        pos = block.start + len(block) - 1
        self.seen.append(pos)
        return pos in self.positions


def test_alone_sends_only_the_flagged_token_and_pending_sends_the_rest_too(pair, audio):
    edge, cloud = pair
    ref = edge_only(edge, audio[1], "en", MAX)
    flagged = [3, 7]
    alone = speculative(edge, cloud, audio[1], "en", _spec(_FlagAt(flagged).at_token_level("alone"),
                                                           trace_hidden=False), Link(LinkConfig()))
    pending = speculative(edge, cloud, audio[1], "en", _spec(_FlagAt(flagged).at_token_level("pending")),
                          Link(LinkConfig()))
    # alone: the three unflagged tokens are kept as drafted, only the flagged one is judged
    assert alone.token_ids[:3] == ref.token_ids[:3]
    assert alone.rounds == 2 and alone.transmitted == 2  # one token per round
    # pending: all four tokens since the start are judged in the first round
    assert pending.rounds >= 1 and pending.transmitted >= 4 > alone.transmitted - 2
    # the tokens committed unverified reach the cloud as context, not as draft
    assert alone.synced >= 3


@pytest.mark.parametrize("verify", ["alone", "pending"])
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("rule,rank", [("greedy", 1), ("rank", 2)])
def test_token_gates_in_the_pipelined_loop_give_the_blocking_loops_captions(pair, audio, verify, n, rule, rank):
    # the edge drafts on while a flagged token is verified; a verdict that contradicts it voids what
    # was drafted on top. Greedy rules: the same captions and corrections as the blocking loop,
    # which never drafts past a flagged token
    edge, cloud = pair
    slow = LinkConfig(rtt_ms=400.0, uplink_mbps=2.0, downlink_mbps=10.0)
    for gate in (make_gate("entropy", 0.8, "token", verify), _FlagAt([2, 5, 9, 10]).at_token_level(verify)):
        blocking = speculative(edge, cloud, audio[1], "en", _spec(gate, rule, rank), Link(slow))
        piped = speculative(edge, cloud, audio[1], "en", _spec(gate, rule, rank, in_flight=n), Link(slow))
        assert piped.token_ids == blocking.token_ids, (gate.name, verify, n)
        assert piped.rounds >= blocking.rounds > 0 and piped.corrected >= blocking.corrected
        assert piped.metrics()["in_flight"] == n
        if verify == "alone":  # one token per round, as in the blocking loop
            assert piped.transmitted == piped.rounds + piped.stale


def test_bad_level_or_verify_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown gate level"):
        make_gate("entropy", 1.0, "word")
    with pytest.raises(ValueError, match="unknown token-level verification"):
        make_gate("entropy", 1.0, "token", "some")


def _feeds(monkeypatch, lm):
    """Every extend call of `lm`'s sessions: the token lists fed, in order."""
    calls, start = [], lm.start

    def counting_start(*args, **kw):
        sess = start(*args, **kw)
        extend = sess.extend

        def counted(ids, return_hidden=False, summarize=None):
            calls.append(list(ids))
            return extend(ids, return_hidden, summarize)
        sess.extend = counted
        return sess
    monkeypatch.setattr(lm, "start", counting_start)
    return calls


def test_a_flagged_token_waits_unfed_so_a_correction_costs_the_edge_no_forward(pair, audio, monkeypatch):
    # every token flagged, greedy: the cloud replaces many drafts. The edge's cache only ever takes
    # committed tokens (one forward per round); keeping the state after each draft (as WISV traces
    # do) feeds every draft first and pays again for each correction, with the same caption
    edge, cloud = pair
    calls = _feeds(monkeypatch, edge)
    deferred = speculative(edge, cloud, audio[1], "en", _spec(make_gate("entropy", -math.inf, "token")),
                           Link(LinkConfig()))
    fed = [t for c in calls for t in c]
    assert deferred.corrected > 0
    assert fed == deferred.token_ids[:len(fed)] and len(fed) >= len(deferred.token_ids) - 1
    assert len(calls) <= deferred.rounds and deferred.edge_fed == len(fed)  # the record counts what was fed
    calls.clear()
    eager = speculative(edge, cloud, audio[1], "en", _spec(make_gate("entropy", -math.inf, "token"), trace_hidden=True),
                        Link(LinkConfig()))
    assert eager.token_ids == deferred.token_ids
    assert len(calls) >= len(deferred.token_ids) + deferred.corrected - 1  # the replaced drafts were fed too
    assert eager.edge_fed == sum(len(c) for c in calls) > deferred.edge_fed


def test_a_deferred_token_the_cloud_accepts_goes_in_with_the_clouds_next(pair, audio, monkeypatch):
    # flag position 3 only: if the cloud accepts the draft there, the edge feeds it together with the
    # cloud's bonus token in one forward; either way the caption is the blocking loop's
    edge, cloud = pair
    calls = _feeds(monkeypatch, edge)
    rec = speculative(edge, cloud, audio[1], "en", _spec(_FlagAt([3]).at_token_level("alone")), Link(LinkConfig()))
    fed = [t for c in calls for t in c]
    assert fed == rec.token_ids[:len(fed)]
    assert rec.rounds == 1 and (rec.corrected == 1 or [len(c) for c in calls][3] == 2)


def _oracle(k):
    from speccap.decoding.verify import Rank
    return SpecSettings(gate=make_gate("always", None, "token", "alone"), rule=Rank(1, max_corrections=k),
                        policy=Fixed(4), max_new_tokens=MAX)


def test_the_oracle_at_a_budget_replaces_only_the_first_k_tokens_the_cloud_would(pair, audio):
    edge, cloud = pair
    ref_edge = edge_only(edge, audio[1], "en", MAX).token_ids
    ref_cloud = cloud_only(cloud, audio[1], "en", Link(LinkConfig()), MAX).token_ids
    # k = 0: every token judged, none replaced, no bonus tokens: the edge's caption exactly
    none = speculative(edge, cloud, audio[1], "en", _oracle(0), Link(LinkConfig()))
    assert none.token_ids == ref_edge and none.corrected == 0 and none.bonus == 0
    # (every position is drafted and judged, the end token too unless the caption ran out of tokens)
    assert none.tolerated > 0 and none.drafted == none.rounds and none.drafted - len(ref_edge) in (0, 1)
    # no limit: greedy verification of every edge-drafted token: the cloud's caption exactly, and
    # corrected / drafted is the share of positions the cloud replaced (every position drafted)
    full = speculative(edge, cloud, audio[1], "en", _oracle(MAX), Link(LinkConfig()))
    assert full.token_ids == ref_cloud and full.bonus == 0 and full.tolerated == 0
    assert full.drafted == full.rounds and full.drafted - len(ref_cloud) in (0, 1) and full.corrected > 1
    # k = 1: the edge's caption up to its first disagreement, the cloud's token there, then the edge
    # again (later disagreements kept as drafted); the settings object is reused: the count starts afresh
    settings = _oracle(1)
    one = [speculative(edge, cloud, audio[1], "en", settings, Link(LinkConfig())) for _ in range(2)]
    assert one[0].token_ids == one[1].token_ids and one[0].corrected == one[1].corrected == 1
    p = next(i for i, (a, b) in enumerate(zip(ref_edge, ref_cloud)) if a != b)
    assert one[0].token_ids[:p] == ref_edge[:p] and one[0].token_ids[p] == ref_cloud[p]
    assert one[0].bonus == 0 and one[0].drafted - len(one[0].token_ids) in (0, 1)


def test_a_tuned_entropy_gate_reads_the_entropy_at_its_temperature(pair, audio):
    """With the edge as its own cloud nothing is corrected, so the caption is the edge's own: each
    entropy the gate is shown is that position's entropy at the gate's temperature, as the traces
    keep it for tuning the gate."""
    from speccap.decoding.gates import Entropy
    from speccap.gating.shadow import edge_trajectory

    class Shown(Entropy):
        def flag(self, block):
            self.shown.append((block.start + len(block) - 1, block.stats[-1].entropy))
            return super().flag(block)

    edge = pair[0]
    want = {}
    for t in (0.3, 1.0):
        want[t] = []
        edge_trajectory(edge, audio[1], "en", MAX, (t,), want[t])
        gate = Shown(sorted(e[0] for e in want[t])[len(want[t]) // 2], t).at_token_level("alone")
        gate.shown = []
        rec = speculative(edge, edge, audio[1], "en", _spec(gate), Link(LinkConfig()))
        assert rec.transmitted > 0 and len(gate.shown) == rec.drafted
        for pos, h in gate.shown:
            assert h == pytest.approx(want[t][pos][0], rel=1e-4)
    assert abs(want[0.3][0][0] - want[1.0][0][0]) > 1e-2  # the temperature matters
