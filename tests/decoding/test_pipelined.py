"""The pipelined loop: same captions as the blocking loop for greedy rules, honest overlap on the clock."""

import copy
import dataclasses

import pytest
import torch

from speccap.config import LinkConfig
from speccap.decoding import packets
from speccap.decoding.cost import CostModel
from speccap.decoding.engine import speculative
from speccap.decoding.link import Link
from speccap.decoding.pipelined import _Loop, pipelined
from speccap.decoding.policies import Fixed, UGSDAdaptive

from .test_engine import MAX, _entropy_quantile, _spec

SLOW = LinkConfig(rtt_ms=400.0, uplink_mbps=2.0, downlink_mbps=10.0)


def _both(edge, cloud, mel, spec_kw, n, link=SLOW):
    # a fresh copy each: a length policy keeps state
    blocking = speculative(edge, cloud, mel, "en", _spec(**copy.deepcopy(spec_kw)), Link(link))
    piped = speculative(edge, cloud, mel, "en", dataclasses.replace(_spec(**copy.deepcopy(spec_kw)), in_flight=n),
                        Link(link), keep_sessions=True)
    return blocking, piped


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("policy", [Fixed(1), Fixed(3), Fixed(6), "adaptive"])
@pytest.mark.parametrize("rule,rank", [("greedy", 1), ("rank", 3)])
def test_same_captions_as_the_blocking_loop(pair, audio, n, policy, rule, rank):
    edge, cloud = pair
    gamma = _entropy_quantile(edge, audio[1], 0.7)
    for gate, thr in (("always", None), ("entropy", gamma)):
        kw = dict(gate=gate, threshold=thr, rule=rule, rank=rank,
                  policy=UGSDAdaptive() if policy == "adaptive" else Fixed(policy.length))
        blocking, piped = _both(edge, cloud, audio[1], kw, n)
        assert piped.token_ids == blocking.token_ids, (gate, policy, n)
        # the verdicts that settled the caption are the blocking loop's; extra rounds were discarded work
        assert piped.corrected >= blocking.corrected and piped.rounds >= blocking.rounds
        assert piped.metrics()["in_flight"] == n


def test_contradictions_discard_the_work_drafted_on_top(pair, audio):
    edge, cloud = pair  # two different random models: the cloud rejects often
    blocking, piped = _both(edge, cloud, audio[1], dict(gate="always", rule="greedy", policy=Fixed(2)), 4)
    assert piped.token_ids == blocking.token_ids and blocking.corrected > 0
    assert piped.wasted > 0  # drafted past a block that was then rejected
    assert piped.stale > 0  # blocks sent on top of a rejected one, dropped by the cloud unverified
    # what the cloud verified: the rounds it answered; each dropped block was still sent
    up = [p for p in piped.packets if p["dir"] == "up" and p["kind"] == "verify"]
    assert len(up) == piped.rounds + piped.stale
    assert piped.bytes_up == sum(p["bytes"] for p in piped.packets if p["dir"] == "up")
    # both caches were cropped back to the caption: each equals a fresh prefill of what it holds
    # (the edge every token, bar a last cloud token at the length limit, which it never needs)
    ids = piped.token_ids
    for lm, sess in zip((edge, cloud), piped.sessions):
        n = sess.length
        assert n <= len(ids) and (lm is cloud or n >= len(ids) - (len(ids) == MAX))
        fresh = lm.start(audio[1], "en")
        fresh.extend(ids[:n])
        for a, b in zip(sess.cache.layers, fresh.cache.layers):
            torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-4)


def test_round_trips_hide_behind_drafting_when_the_drafts_hold(pair, audio):
    edge, _ = pair  # the edge verifying itself: every block holds, every guess is the bonus
    rtt = SLOW.rtt_ms / 1000
    kw = dict(gate="always", rule="greedy", policy=Fixed(3))
    blocking, piped = _both(edge, edge, audio[1], kw, 64)
    assert piped.token_ids == blocking.token_ids and piped.wasted == 0 and piped.stale == 0
    assert blocking.rounds >= 4
    assert blocking.total_time >= blocking.rounds * rtt  # a round trip per block
    # pipelined: the round trips overlap; the edge waits about one of them (plus queueing on the
    # 2 Mbps uplink), not one per block. Compared net of compute: compute is measured wall time and
    # swells on a loaded machine, the network part is the emulated link's
    blocking_network = blocking.total_time - blocking.edge_compute - blocking.cloud_compute
    assert blocking_network >= blocking.rounds * rtt
    assert piped.wait_time < blocking_network / 2
    assert piped.total_time < piped.edge_compute + 2 * rtt + piped.cloud_compute + 0.2
    assert 0 < piped.wait_time <= piped.total_time
    # at most one block in flight: the edge stalls at every escalation after the first
    one = speculative(edge, edge, audio[1], "en", dataclasses.replace(_spec(**kw), in_flight=1), Link(SLOW))
    assert one.token_ids == blocking.token_ids and one.total_time > piped.total_time + rtt


def test_gate_never_needs_no_cloud(pair, audio):
    edge, cloud = pair
    blocking, piped = _both(edge, cloud, audio[1], dict(gate="never", policy=Fixed(4)), 2)
    assert piped.token_ids == blocking.token_ids and piped.rounds == 0 and piped.bytes_up == 0
    assert piped.wait_time == 0


def test_packets_carry_epoch_and_guess(pair, audio):
    edge, cloud = pair
    sent = []
    link = Link(SLOW, tap=lambda d, p: sent.append((d, p)))
    rec = pipelined(edge, cloud, audio[1], "en", dataclasses.replace(
        _spec("always", rule="greedy", policy=Fixed(2)), in_flight=3), link)
    bits = packets.id_bits(edge.vocab_size)
    epochs = []
    for d, p in sent:
        if d == "up" and packets.parse_header(p)[0] == packets.PIPELINED:
            _, _, epoch, sync, draft, guess = packets.parse_pipelined(p)
            n_ids = len(sync) + len(draft) + (guess is not None)
            assert len(p) == 12 + 8 + -(-n_ids * bits // 8)
            epochs.append(epoch)
    # the epoch counts the contradicting verdicts the edge has heard of: it only grows, from 0
    assert epochs == sorted(epochs) and epochs[0] == 0 and 1 <= epochs[-1] <= rec.corrected + rec.bonus
    assert len(epochs) == rec.rounds + rec.stale


def test_needs_blocks_in_flight(pair, audio):
    edge, cloud = pair
    with pytest.raises(ValueError, match="in_flight >= 1"):
        pipelined(edge, cloud, audio[1], "en", _spec("always"), Link(SLOW))


@pytest.mark.parametrize("rtt_ms", [5.0, 20.0, 400.0])  # 20 ms: the draft-ahead rule stops runs
@pytest.mark.parametrize("draft_ahead", ["adaptive", "always"])
def test_drafting_in_runs_books_what_drafting_token_by_token_books(pair, audio, monkeypatch, rtt_ms, draft_ahead):
    """With a cost model the edge knows each forward's charge ahead, so it drafts as one run the
    tokens before the next verdict arrives or the draft-ahead rule would wait: the same caption,
    clock and record as checking between every token."""
    edge, cloud = pair
    cost = CostModel({r: {"prefill": [1e-3, 1e-5], "extend": [2e-3, 5e-5, 1e-7]} for r in ("edge", "cloud")})
    link = LinkConfig(rtt_ms=rtt_ms, uplink_mbps=2.0, downlink_mbps=10.0)
    spec = dataclasses.replace(_spec(gate="entropy", threshold=_entropy_quantile(edge, audio[1], 0.7), rule="rank",
                                     rank=3, policy=Fixed(6)), in_flight=2, draft_ahead=draft_ahead, cost=cost)
    runs = []
    draft_run = _Loop._draft_run
    monkeypatch.setattr(_Loop, "_draft_run",
                        lambda self, block, n: (runs.append(n), draft_run(self, block, n)))
    in_runs = pipelined(edge, cloud, audio[1], "en", copy.deepcopy(spec), Link(link))
    assert runs and max(runs) > 1
    monkeypatch.setattr(_Loop, "_run_length", lambda self, block: 1)
    alone = pipelined(edge, cloud, audio[1], "en", copy.deepcopy(spec), Link(link))
    measured = {"wall_time", "model_time", "resources"}
    assert {k: v for k, v in vars(in_runs).items() if k not in measured} == \
           {k: v for k, v in vars(alone).items() if k not in measured}
