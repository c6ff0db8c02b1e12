"""Relinking: a caption decoded on one channel, put on another's clock, equals the caption decoded there."""

import dataclasses

import pytest

from speccap.config import LinkConfig, MarkovParams
from speccap.decoding.engine import speculative
from speccap.decoding.link import Link
from speccap.decoding.policies import Fixed
from speccap.decoding.relink import link_log, relink

from .test_engine import _entropy_quantile, _spec

FAST = LinkConfig("fast", uplink_mbps=500.0, downlink_mbps=1000.0, rtt_ms=5.0)
SLOW_LOSSY = LinkConfig("slow", uplink_mbps=2.0, downlink_mbps=10.0, rtt_ms=120.0, packet_error_rate=0.2)
MARKOV = LinkConfig("markov", uplink_mbps=4.0, downlink_mbps=4.0, rtt_ms=20.0,
                    markov=MarkovParams(good_mbps=4.0, bad_mbps=0.35, p_good_to_bad=0.3, p_bad_to_good=0.3))
# compute scaled to nothing: the virtual clock is the link model alone, so two decodes compare exactly
NO_COMPUTE = dict(edge_time_scale=1e-12, cloud_time_scale=1e-12)


def _record(edge, cloud, mel, spec_kw, link: LinkConfig) -> dict:
    rec = speculative(edge, cloud, mel, "en", _spec(**spec_kw, **NO_COMPUTE), Link(link, seed=3))
    return {"id": "x", "caption": rec.caption, **rec.metrics(), "link_log": link_log(rec.packets)}


@pytest.mark.parametrize("rule,rank", [("greedy", 1), ("rank", 2)])
@pytest.mark.parametrize("gated", [False, True])
def test_relinked_equals_decoded_on_the_other_channel(pair, audio, rule, rank, gated):
    edge, cloud = pair
    kw = dict(gate="always", rule=rule, rank=rank, policy=Fixed(3))
    if gated:  # some blocks stay local: the first token can come before any packet
        kw.update(gate="entropy", threshold=_entropy_quantile(edge, audio[1], 0.7))
    source = _record(edge, cloud, audio[1], kw, FAST)
    assert source["rounds"] > 0
    for target in (SLOW_LOSSY, MARKOV):
        direct = _record(edge, cloud, audio[1], kw, target)
        moved = relink(source, Link(target, seed=3))
        assert moved["caption"] == direct["caption"] and moved["bytes_up"] == direct["bytes_up"]
        for k in ("total_time", "link_time", "ttft", "oet", "otps"):
            assert moved[k] == pytest.approx(direct[k], rel=1e-6, abs=1e-9), (target.name, k)
        assert moved["retransmissions"] == direct["retransmissions"]
        assert moved["link_log"]["charged"] == pytest.approx(direct["link_log"]["charged"])
        assert moved["total_time"] != pytest.approx(source["total_time"])  # the channel did matter
        if target is SLOW_LOSSY:  # losses drawn from the same stream as the decode's
            assert direct["retransmissions"] > 0


def test_relinking_onto_its_own_channel_changes_nothing(pair, audio):
    edge, cloud = pair
    rec = speculative(edge, cloud, audio[1], "en", _spec("always", policy=Fixed(4)), Link(MARKOV, seed=5))
    source = {"id": "x", **rec.metrics(), "link_log": link_log(rec.packets)}  # measured compute this time
    same = relink(source, Link(MARKOV, seed=5))
    for k in ("total_time", "link_time", "ttft"):
        assert same[k] == pytest.approx(source[k], rel=1e-12)
    # the compute part stays the source's on another channel: only the link time moves
    other = relink(source, Link(FAST, seed=5))
    assert other["total_time"] - other["link_time"] == pytest.approx(source["total_time"] - source["link_time"])


def test_what_cannot_be_relinked_says_so(pair, audio):
    edge, cloud = pair
    with pytest.raises(ValueError, match="no link_log"):
        relink({"id": "clip-7", "ttft": 0.0}, Link(FAST))
    piped = speculative(edge, cloud, audio[1], "en", dataclasses.replace(_spec("always"), in_flight=2), Link(FAST))
    with pytest.raises(ValueError, match="pipelined"):
        link_log(piped.packets)
