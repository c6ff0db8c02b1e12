import copy

import numpy as np
import pytest
import torch

from speccap.config import LinkConfig
from speccap.decoding import packets
from speccap.decoding.cost import CostModel
from speccap.decoding.engine import SpecSettings, cloud_only, edge_only, speculative
from speccap.decoding.gates import make_gate
from speccap.decoding.halves import EdgeHalf
from speccap.decoding.ledger import Ledger
from speccap.decoding.link import Link
from speccap.decoding.policies import Fixed, UGSDAdaptive
from speccap.decoding.qs import lattice_counts
from speccap.decoding.rules import make_rule
from speccap.decoding.stats import Block, token_stats
from speccap.models.generate import draw

MAX = 24


def _spec(gate="entropy", threshold=None, rule="greedy", policy=None, **kw):
    return SpecSettings(gate=make_gate(gate, threshold), rule=make_rule(rule, rank=kw.pop("rank", 3)),
                        policy=policy or Fixed(4), max_new_tokens=MAX, **kw)


def test_gate_never_is_edge_only(pair, audio):
    edge, cloud = pair
    ref = edge_only(edge, audio[1], "en", MAX)
    for policy in (Fixed(1), Fixed(5), UGSDAdaptive()):
        rec = speculative(edge, cloud, audio[1], "en", _spec("never", policy=policy), Link(LinkConfig()))
        assert rec.token_ids == ref.token_ids
        assert rec.rounds == 0 and rec.bytes_up == 0 and rec.transmitted == 0 and rec.drafted == len(ref.token_ids)


@pytest.mark.parametrize("policy", [Fixed(1), Fixed(3), Fixed(7), UGSDAdaptive()])
def test_gate_always_with_greedy_is_cloud_only(pair, audio, policy):
    edge, cloud = pair
    ref = cloud_only(cloud, audio[1], "en", Link(LinkConfig()), MAX)
    rec = speculative(edge, cloud, audio[1], "en", _spec("always", policy=policy), Link(LinkConfig()))
    assert rec.token_ids == ref.token_ids
    assert rec.corrected > 0  # the two models really disagreed
    assert rec.transmitted == rec.drafted and rec.metrics()["rho"] == 1.0


def _entropy_quantile(lm, mel, q):
    """A threshold that splits this (untrained, near-uniform) model's blocks: some stay local."""
    s = lm.start(mel, "en")
    logits, ents = s.prefill_logits, []
    for _ in range(MAX):
        tok = int(logits.argmax())
        ents.append(token_stats(logits, tok)[0].entropy)
        logits = s.extend([tok]).logits[-1]
    return float(np.quantile(ents, q))


def test_caches_equal_a_fresh_prefill_of_the_committed_tokens(pair, audio):
    edge, cloud = pair
    gamma = _entropy_quantile(edge, audio[1], 0.85)
    rec = speculative(edge, cloud, audio[1], "en", _spec("entropy", gamma, "rank", rank=3), Link(LinkConfig()),
                      keep_sessions=True)
    e_sess, c_sess = rec.sessions
    assert 0 < rec.rounds and rec.drafted > rec.transmitted  # some blocks stayed local
    ids = rec.token_ids
    for lm, sess in ((edge, e_sess), (cloud, c_sess)):
        n = sess.length
        assert n <= len(ids)
        fresh = lm.start(audio[1], "en")
        fresh.extend(ids[:n])
        for a, b in zip(sess.cache.layers, fresh.cache.layers):
            torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-4)
    assert e_sess.length == len(ids)  # the edge holds every committed token


def test_bytes_are_the_serialized_packets_and_no_waveform_leaves(pair, audio):
    edge, cloud = pair
    wave, mel = audio
    sent = []
    link = Link(LinkConfig(), tap=lambda d, p: sent.append((d, p)))
    rec = speculative(edge, cloud, mel, "en", _spec("always", rule="rank", rank=3), link)
    assert rec.bytes_up == sum(len(p) for d, p in sent if d == "up")
    assert rec.bytes_down == sum(len(p) for d, p in sent if d == "down")
    bits = packets.id_bits(edge.vocab_size)
    kinds = [packets.parse_header(p)[0] for d, p in sent if d == "up"]
    assert kinds[0] == packets.FEATURES and kinds.count(packets.FEATURES) == 1  # features once per caption
    drafted = 0
    for d, p in sent:
        if d == "up" and packets.parse_header(p)[0] == packets.VERIFY:
            _, _, sync, draft = packets.parse_verify(p)
            assert len(p) == 17 + -(-(len(sync) + len(draft)) * bits // 8)
            drafted += len(draft)
    assert drafted == rec.transmitted
    blob = b"".join(p for _, p in sent)
    for encoded in (wave.astype(np.float32).tobytes(), (wave * 32767).astype(np.int16).tobytes(),
                    wave.astype(np.float16).tobytes()):
        for start in range(0, len(encoded) - 64, len(encoded) // 50):
            assert encoded[start:start + 64] not in blob


def test_accounting_adds_up(pair, audio):
    edge, cloud = pair
    rec = speculative(edge, cloud, audio[1], "en", _spec("always", rule="rank", rank=2, policy=Fixed(4)),
                      Link(LinkConfig(rtt_ms=50.0)))
    m = rec.metrics()
    assert m["accepted"] + m["corrected"] + m["bonus"] >= len(rec.token_ids) - 1
    assert m["total_time"] == pytest.approx(m["edge_compute"] + m["cloud_compute"] + m["link_time"], rel=1e-6)
    assert m["link_time"] >= m["rounds"] * 0.05  # one RTT per round at least
    assert sum(m["position_checked"]) >= m["accepted"] and m["position_checked"][0] == m["rounds"]
    assert 0 < m["ttft"] <= m["total_time"] and m["cpu_percent"] > 0 and m["ram_gb"] > 0
    assert "gpu_percent" not in m or m["gpu_percent"] >= 0


def test_spec_sampling_runs_end_to_end(pair, audio):
    edge, cloud = pair
    rec = speculative(edge, cloud, audio[1], "en", _spec("always", rule="spec_sampling", temperature=1.0), Link(LinkConfig()))
    assert 0 < len(rec.token_ids) <= MAX
    # the draft distributions travel: much more uplink than ids alone
    assert rec.bytes_up > rec.transmitted * edge.vocab_size * 2


def test_a_qs_edge_drafts_at_the_level_its_rule_has_when_it_draws(pair, audio):
    """A Q-S edge's rows are quantised at the level of the extension that made them; when an
    adaptive policy moves the level before the next draft, the token is drawn from the lattice at
    the new level (the row again, alone), not from the one its extension computed."""
    edge, _ = pair
    s = _spec("always", rule="qs", temperature=1.0)
    half = EdgeHalf(edge, audio[1], "en", s, Ledger("ugsd"))
    block = Block(start=0)
    for level in (4, 4, 32, 2):
        s.rule.level = level
        logits = half.logits.clone()
        rng = copy.deepcopy(half.rng)
        tok = half.draft(block, needs_q=True)
        want = lattice_counts(torch.softmax(logits.double(), -1), level)
        assert torch.equal(block.q[-1], torch.from_numpy(want / level))
        assert tok == draw(want / level, rng)
    assert s.rule.nnz[4][1] == 2 and s.rule.nnz[32][1] == 1 and s.rule.nnz[2][1] == 1


EDGES = {"greedy": {}, "greedy, states after each token": {"trace_hidden": True},
         "greedy, states before each token": {}, "speculative sampling": {"rule": "spec_sampling", "temperature": 1.0},
         "Q-S": {"rule": "qs", "temperature": 1.0}}


@pytest.mark.parametrize("kind", list(EDGES))
def test_a_block_drafted_as_one_run_is_the_block_drafted_token_by_token(pair, audio, kind):
    """`draft_block` (the first token drafted, the rest one `extend_run`) drafts, feeds and books
    what drafting token by token does, to the bit: the tokens, statistics and q's, the states WISV
    sends (after each token) or a learned gate reads (before), the cache, a sampling edge's generator
    and every record field; a greedy edge's end token drafted mid-run, unfed."""
    edge, _ = pair
    mel = audio[1]
    ends = copy.copy(edge)  # the same model, its captions ending at a token it drafts mid-block
    caption = edge_only(edge, mel, "en", MAX).token_ids
    ends._eos = next(t for i, t in enumerate(caption) if i >= 5 and t not in caption[:i])
    cost = CostModel({r: {"prefill": [1e-3, 1e-5], "extend": [2e-4, 5e-5, 1e-7]} for r in ("edge", "cloud")})
    greedy = "temperature" not in EDGES[kind]

    def drafted(as_run: bool):
        s = _spec("entropy" if greedy else "always", 1.0 if greedy else None, cost=cost, **EDGES[kind])
        if kind == "greedy, states before each token":
            s.gate.needs_hidden = True  # what a learned gate that reads states says of itself
        books = Ledger("ugsd", cost)
        half = EdgeHalf(ends, mel, "en", s, books)
        blocks = []
        for budget in (3, 1, 3, 5, 4):
            block = Block(start=half.cached)
            if as_run:
                half.draft_block(block, budget, s.rule.needs_q)
            else:
                while len(block) < budget and half.draft(block, s.rule.needs_q) != ends.eos_token_id:
                    pass
            blocks.append(block)
            if block.tokens[-1] == ends.eos_token_id:
                break
        return blocks, books, half, s.rule

    (want, b1, h1, r1), (got, b2, h2, r2) = drafted(False), drafted(True)
    if greedy:
        assert len(got) == 4 and got[-1].tokens[-1] == ends.eos_token_id and len(got[-1]) < 5  # ended mid-run
        assert h1.summary == h2.summary
    else:
        assert h1.rng.bit_generator.state == h2.rng.bit_generator.state and np.array_equal(h1.summary.cdf, h2.summary.cdf)
        assert getattr(r1, "nnz", None) == getattr(r2, "nnz", None)

    def same(a, b):
        return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
    for a, b in zip(want, got, strict=True):
        assert (a.tokens, a.stats) == (b.tokens, b.stats)
        for kept in ("q", "hidden", "context"):
            x, y = getattr(a, kept), getattr(b, kept)
            assert len(x) == len(y) and all(same(u, v) for u, v in zip(x, y))
    assert bool(got[0].q) != greedy
    assert bool(got[0].hidden) == (kind == "greedy, states after each token")
    assert bool(got[0].context) == (kind == "greedy, states before each token")
    assert got[-1].hidden == [] or got[-1].hidden[-1] is None  # the end token is never fed
    assert vars(b1.rec) == vars(b2.rec) and b1.now == b2.now
    assert h1.cached == h2.cached and torch.equal(h1.logits, h2.logits) and same(h1.state, h2.state)
