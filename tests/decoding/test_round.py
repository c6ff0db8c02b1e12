"""A round's bytes: what the edge writes (`Round.packet`) the cloud reads back (`read_payload`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from speccap.decoding import packets
from speccap.decoding.round import MismatchedRound, Round, read_payload
from speccap.decoding.rules import make_rule
from speccap.decoding.stats import Block
from speccap.decoding.verify import Verdict
from speccap.decoding.wisv.head import CSI
from speccap.decoding.wisv.rule import WISV

VOCAB = 50
BITS = packets.id_bits(VOCAB)
CHANNEL = CSI(uplink_mbps=20.0, downlink_mbps=100.0, rtt_ms=50.0, per=0.0)


def _block(n: int = 3, d: int = 8, eos_last: bool = False) -> Block:
    g = torch.Generator().manual_seed(n)
    block = Block(start=4)
    for i in range(n):
        block.tokens.append(49 if eos_last and i == n - 1 else 10 + i)
        p = torch.softmax(torch.randn(VOCAB, generator=g), -1)
        block.q.append(p)
        # an end token is never fed back, so it has no state after it
        block.hidden.append(None if eos_last and i == n - 1 else torch.randn(d, generator=g).half().float())
    return block


def _read(rule, rnd: Round, cloud_rule=None):
    """Write the round with the edge's `rule`; read it with the cloud's (default: the same)."""
    body = rnd.packet(rule)
    sid, seq, sync, draft = packets.parse_verify(body)
    assert (sid, seq, sync, draft) == (rnd.session_id, rnd.seq, rnd.sync, rnd.block.tokens)
    return read_payload(cloud_rule or rule, packets.verify_tail(body), sid, seq, len(draft), VOCAB)


def test_a_greedy_round_is_its_token_ids_alone():
    rnd = Round(7, 2, [5, 6], [1, 5, 6], _block(), BITS)
    assert _read(make_rule("greedy"), rnd) == (None, None, None)


def test_speculative_sampling_reads_back_the_draft_distributions_at_float16():
    block = _block()
    q, csi, hidden = _read(make_rule("spec_sampling", temperature=1.0), Round(1, 1, [], [], block, BITS))
    assert csi is None and hidden is None and len(q) == 3
    for got, sent in zip(q, block.q):
        assert torch.equal(got, sent.half().float())


def test_qs_reads_back_its_lattice_level_and_points():
    rule = make_rule("qs", temperature=1.0, level=8)
    block = _block()
    block.q[:] = [rule.edge_distribution(p.double()) for p in block.q]
    cloud_rule = make_rule("qs", temperature=1.0, level=16)  # the level travels with the block
    q, _, _ = _read(rule, Round(1, 1, [], [], block, BITS), cloud_rule)
    assert cloud_rule.level == 8
    for got, sent in zip(q, block.q):
        assert torch.allclose(got.double(), sent, atol=1e-12)


@pytest.mark.parametrize("protocol", ["full", "selective"])
def test_wisv_reads_back_the_channel_state_and_the_full_protocols_states(protocol):
    block = _block(eos_last=True)
    q, csi, hidden = _read(WISV(None, 0.5, protocol), Round(3, 4, [9], [9], block, BITS, protocol, CHANNEL))
    assert q is None and dataclasses.astuple(csi) == pytest.approx(dataclasses.astuple(CHANNEL))
    if protocol == "selective":
        assert hidden is None  # the cloud asks for the states it needs after its forward
    else:
        assert [h is None for h in hidden] == [False, False, True]
        assert all(torch.equal(h, s) for h, s in zip(hidden[:2], block.hidden[:2]))


def test_a_payload_that_does_not_fit_is_refused_by_kind():
    greedy, wisv = make_rule("greedy"), WISV(None, 0.5, "full")
    with pytest.raises(packets.PacketError, match="unexpected bytes"):
        read_payload(greedy, b"xx", 1, 1, 2, VOCAB)
    with pytest.raises(packets.PacketError, match="channel state"):
        read_payload(wisv, b"\x01", 1, 1, 2, VOCAB)
    block = _block()
    other_round = Round(1, 2, [], [], block, BITS, "full", CHANNEL).packet(wisv)
    with pytest.raises(MismatchedRound, match="does not belong"):
        read_payload(wisv, packets.verify_tail(other_round), 1, 3, 3, VOCAB)
    sampled = Round(1, 1, [], [], block, BITS).packet(make_rule("spec_sampling"))
    with pytest.raises(MismatchedRound, match="vocabulary"):
        read_payload(make_rule("spec_sampling"), packets.verify_tail(sampled), 1, 1, 3, VOCAB * 2)


def test_a_pipelined_round_carries_its_epoch_and_guess_before_the_blocking_rounds_payload():
    rule = make_rule("spec_sampling", temperature=1.0)
    blocking = Round(3, 4, [5], [1, 5], _block(), BITS)
    piped = dataclasses.replace(blocking, epoch=2, guess=7)
    body = piped.packet(rule)
    assert packets.parse_header(body)[0] == packets.PIPELINED
    assert packets.parse_pipelined(body) == (3, 4, 2, [5], blocking.block.tokens, 7)
    tail = packets.verify_tail(blocking.packet(rule))
    ids = 1 + 3 + 1  # sync, draft, guess
    assert body[-len(tail):] == tail and len(body) == 12 + 8 + -(-ids * BITS // 8) + len(tail)
    # no guess (the block ends the caption): one id fewer, said by the header
    assert packets.parse_pipelined(dataclasses.replace(piped, guess=None).packet(rule))[-1] is None


def test_a_rounds_verdict_packet_names_its_session_and_sequence():
    rnd = Round(3, 4, [], [], _block(), BITS, epoch=0, guess=7)
    assert packets.parse_verdict(rnd.verdict_packet(Verdict(2, 9, True))) == (3, 4, 2, 9)
    assert packets.parse_verdict(rnd.verdict_packet(Verdict(3, None, False))) == (3, 4, 3, None)
