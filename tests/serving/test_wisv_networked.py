"""WISV over the network: the server holds the head, each VERIFY carries the edge's channel state,
and the selective protocol's mid-round exchange (MISMATCH down, HIDDEN up) runs over HTTP. The
networked captions are the in-process ones, for every upload protocol."""

import copy
import dataclasses

import pytest
import torch

from speccap.decoding.engine import speculative
from speccap.decoding.wisv.head import DecisionHead
from speccap.decoding.wisv.rule import WISV
from speccap.serving.edge import caption_remote, check_compatible

from .conftest import Fixed, link, settings

D = 32  # the tiny models' hidden size
TAU = 0.5


class SignHead(DecisionHead):
    """A head with a known answer: repair when the edge's state leans one way, tolerate otherwise
    (the tiny random models' states lean both ways), more readily on a fast uplink."""

    def __init__(self):
        super().__init__(D, D)

    def forward(self, h_edge, h_cloud, csi):
        return torch.sigmoid(20 * h_edge[:, 0] + csi[:, 0])


class LenientHead(DecisionHead):
    """Lets every mismatch through: the full protocol's rounds then tell the edge of no mismatch
    (nothing is rejected, nothing asked), though the cloud met many."""

    def __init__(self):
        super().__init__(D, D)

    def forward(self, h_edge, h_cloud, csi):
        return torch.zeros(len(h_edge))


@pytest.fixture(scope="module")
def head():
    return SignHead().eval()


def _wisv_settings(rule, **kw):
    return dataclasses.replace(settings(gate="always", rule="greedy", policy=Fixed(4), **kw), rule=rule)


def _packets(rec, kind):
    return [p["bytes"] for p in rec.packets if p["kind"] == kind]


# a slow uplink at 15 ms RTT: `auto` sends the states of the one mismatch it expects at first, and every
# state with the ids once the caption's rate says two or more: the choice turns on the rate itself. With
# the lenient head, the rate an in-process cloud could count (every mismatch it met) and the one the
# edge learns from the answers part: the rounds are equal only if both sides count what the edge learns
RATE_BOUND = {"rtt_ms": 15.0, "uplink_mbps": 0.1}


@pytest.mark.parametrize("protocol,max_rank,channel,lenient", [
    ("full", 0, {}, False), ("selective", 0, {}, False), ("auto", 0, {}, False), ("auto", 0, RATE_BOUND, False),
    ("auto", 0, RATE_BOUND, True), ("full", 10, {}, False)])
def test_networked_wisv_captions_equal_in_process(pair, clips, serve, client_for, head, protocol, max_rank, channel,
                                                  lenient):
    edge, cloud = pair
    head = LenientHead().eval() if lenient else head
    longer = {"max_new_tokens": 48} if lenient else {}  # rounds enough for the two rates to part
    rounds = {"full": 0, "selective": 0}
    client = client_for(serve(wisv_head=head))
    info = client.info()
    check_compatible(edge, info)
    tolerated = asked = capped = 0
    for _, mel in clips:
        ref = speculative(edge, cloud, mel, "en",
                          _wisv_settings(WISV(copy.deepcopy(head), TAU, protocol, max_rank), **longer), link(**channel))
        if max_rank:  # the cap binds on these clips: without it the captions differ
            free = speculative(edge, cloud, mel, "en", _wisv_settings(WISV(copy.deepcopy(head), TAU, protocol)), link(**channel))
            capped += free.token_ids != ref.token_ids
        # the rank cap travels in the OPEN packet: the server applies it
        got = caption_remote(edge, client, info, mel, "en", _wisv_settings(WISV(None, TAU, protocol, max_rank), **longer),
                             link(**channel), "float32", "float32")
        assert got.token_ids == ref.token_ids
        assert (got.rounds, got.accepted, got.corrected, got.bonus) == (ref.rounds, ref.accepted, ref.corrected,
                                                                       ref.bonus)
        net = got.network
        assert net["fallback"] == 0
        # one OPEN, one VERIFY per round, and one HIDDEN request per round whose mismatches the head judged
        assert net["requests"] == 1 + got.rounds + got.hidden_requests
        tolerated += ref.tolerated
        # the same exchange as the in-process accounting, under every protocol (`auto` chooses each
        # round from what the answers told the edge, the same on both sides): the channel state and
        # the states ride with the ids, or the MISMATCH names the positions and the HIDDEN packet
        # holds exactly those states
        assert _packets(got, "verify") == _packets(ref, "verify")
        assert got.hidden_requests == ref.hidden_requests
        assert _packets(got, "mismatch") == _packets(ref, "mismatch")
        assert _packets(got, "hidden") == _packets(ref, "hidden")
        if protocol == "full":
            assert got.hidden_requests == 0
        asked += got.hidden_requests
        rounds["selective"] += sum(p["kind"] == "mismatch" for p in got.packets)
        # a VERIFY with the states rides over 100 bytes (each 32 float16 values), with the ids alone under
        rounds["full"] += sum(p["kind"] == "verify" and p["bytes"] > 100 for p in got.packets)
        assert net["link_model_time"] == pytest.approx(sum(p["seconds"] for p in got.packets))
    assert tolerated > 0  # the head let mismatches through: the captions are not greedy verification's
    assert capped > 0 or not max_rank
    if protocol == "selective":
        assert asked > 0
    if channel is RATE_BOUND:  # both protocols ran: the rate decided
        assert rounds["full"] > 0 and rounds["selective"] > 0, rounds
    assert client.health()["sessions"] == 0


def test_a_server_without_a_head_refuses_wisv_and_the_edge_keeps_the_caption(pair, clips, serve, client_for):
    edge, _ = pair
    client = client_for(serve())
    info = client.info()
    mel = clips[0][1]
    got = caption_remote(edge, client, info, mel, "en", _wisv_settings(WISV(None, TAU, "full")), link())
    assert got.caption and got.network["fallback"] > 0
    assert "no WISV head" in got.network["fallback_reasons"][0]


def test_the_hidden_states_must_answer_the_question(pair, clips, serve, client_for, head):
    # a HIDDEN packet that was not asked for, or with other positions, is refused clearly
    from speccap.decoding import packets
    from speccap.serving.client import CloudRefused
    edge, _ = pair
    client = client_for(serve(wisv_head=head))
    mel = clips[0][1]
    sid, _ = client.open(packets.open_packet(mel, "en", "wisv", 1, TAU, 0, "float32", "float32"))
    import numpy as np
    with pytest.raises(CloudRefused, match="asked for no hidden states"):
        client.hidden(sid, packets.hidden_packet(sid, 1, [0], np.zeros((1, D), np.float16)))
    with pytest.raises(CloudRefused, match="channel state"):
        client.verify(sid, packets.verify_packet(sid, 1, [], [5, 6], packets.id_bits(info_vocab(client))))


def info_vocab(client) -> int:
    return client.info()["vocab_size"]
