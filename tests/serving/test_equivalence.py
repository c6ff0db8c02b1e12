"""The networked loop gives the in-process loop's captions, over a real socket on loopback."""

import copy

import pytest
import torch

from speccap.data.uplink import Uplink
from speccap.decoding import packets
from speccap.decoding.engine import edge_only, speculative
from speccap.models.learned_uplink import EncoderShape, LearnedUplink, UplinkEncoder
from speccap.serving.client import CloudRefused
from speccap.serving.edge import caption_remote, check_compatible

from ..models.conftest import tiny_lm
from .conftest import Fixed, UGSDAdaptive, link, settings

CASES = [
    dict(gate="always", rule="greedy", policy=Fixed(3)),
    dict(gate="always", rule="rank", rank=3, policy=UGSDAdaptive(2, 4, 8)),
    # the random tiny models are near uniform over the ~61 tokens an English caption may hold (entropy
    # about ln 61 = 4.11 nats): 4.105 escalates some blocks and keeps others
    dict(gate="entropy", threshold=4.105, rule="greedy", policy=Fixed(2)),
    dict(gate="always", rule="spec_sampling", temperature=1.0, policy=Fixed(4), seed=5),
    dict(gate="always", rule="qs", temperature=1.0, policy=Fixed(4), seed=6),
    # token level: each flagged token verified as it is drafted, alone or with the pending ones
    dict(gate="entropy", threshold=4.105, rule="rank", rank=2, level="token", verify="alone"),
    dict(gate="entropy", threshold=4.105, rule="greedy", level="token", verify="pending"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['gate']}-{c['rule']}-{c.get('verify', 'block')}")
def test_networked_captions_equal_in_process(pair, clips, serve, client_for, case):
    edge, cloud = pair
    client = client_for(serve())
    info = client.info()
    check_compatible(edge, info)
    verified = 0
    for _, mel in clips:
        # a fresh copy each time: the adaptive length policy learns within a caption
        ref = speculative(edge, cloud, mel, "en", settings(**copy.deepcopy(case)), link())
        got = caption_remote(edge, client, info, mel, "en", settings(**copy.deepcopy(case)), link(), "float32",
                             "float32")
        assert got.token_ids == ref.token_ids
        assert (got.rounds, got.accepted, got.corrected, got.bonus, got.transmitted, got.synced) == \
            (ref.rounds, ref.accepted, ref.corrected, ref.bonus, ref.transmitted, ref.synced)
        # the same VERIFY and VERDICT packets; features go up once, here in float32 inside an OPEN packet
        # (spec_sampling's q rows travel in float32 here, 2 more bytes per probability than in-process)
        q_extra = 2 * cloud.vocab_size * got.transmitted if case["rule"] == "spec_sampling" else 0
        assert [p[:2] for p in _packets(got)] == [p[:2] for p in _packets(ref)]
        assert sum(p[2] for p in _packets(got)) == sum(p[2] for p in _packets(ref)) + q_extra
        opened = [p["bytes"] for p in got.packets if p["kind"] == "features"]
        assert opened == [12 + 16 + 12 + 8 + mel.size * 4]
        net = got.network
        assert net["fallback"] == 0 and net["requests"] == got.rounds + 1  # one OPEN, one VERIFY per round
        # the link model's prediction for exactly these packets sits next to what was measured
        assert net["link_model_time"] == pytest.approx(sum(p["seconds"] for p in got.packets))
        assert net["http_bytes_up"] > got.bytes_up and net["net_rtt"] > 0 and net["server_compute"] > 0
        verified += got.rounds
    assert verified > 0
    assert client.health()["sessions"] == 0  # every caption closed its session


def _packets(rec):
    return [(p["dir"], p["kind"], p["bytes"]) for p in rec.packets if p["kind"] != "features"]


def test_gate_that_keeps_everything_local_opens_no_session(pair, clips, serve, client_for):
    edge, _ = pair
    client = client_for(serve())
    rec = caption_remote(edge, client, client.info(), clips[0][1], "en", settings(gate="never"), link())
    assert rec.token_ids == edge_only(edge, clips[0][1], "en", rec.n_tokens + 1).token_ids[: rec.n_tokens]
    assert rec.network["requests"] == 0 and client.health()["opened_total"] == 0


def test_pipelined_settings_are_refused_clearly(pair, clips, serve, client_for):
    client = client_for(serve())
    with pytest.raises(ValueError, match="blocking loop only"):
        caption_remote(pair[0], client, client.info(), clips[0][1], "en", settings(in_flight=2), link())


def test_client_side_link_emulation_waits_the_link_models_time(pair, clips, serve, client_for):
    edge, cloud = pair
    client = client_for(serve())
    info = client.info()
    mel = clips[0][1]
    # once unmeasured first: the first caption pays warm-up costs that would blur the wall-time comparison
    caption_remote(edge, client, info, mel, "en", settings(), link(rtt_ms=40.0))
    plain = caption_remote(edge, client, info, mel, "en", settings(), link(rtt_ms=40.0))
    slowed = caption_remote(edge, client, info, mel, "en", settings(), link(rtt_ms=40.0), emulate=True)
    assert slowed.token_ids == plain.token_ids and slowed.rounds == plain.rounds > 0
    predicted = slowed.network["link_model_time"]
    assert predicted >= 0.04 * slowed.rounds  # one RTT per round at least
    # the emulated delays were really waited: their sleeps alone take the predicted seconds (a lower
    # bound a busy machine cannot break, unlike a comparison of two measured times)
    assert slowed.wall_time >= predicted
    assert slowed.total_time == pytest.approx(slowed.edge_compute + slowed.network["net_rtt"] + predicted, rel=0.05)


@pytest.mark.parametrize("bits", [16, 4])
def test_a_cloud_on_a_coarse_uplink_gets_the_same_view_over_the_network(pair, clips, serve, client_for, bits):
    """The served cloud's /v1/info names its uplink; the edge sends that view of the clip (16 pooled,
    clip-normalised bands, 3 frames merged, float16 or 4-bit codes) and the captions, rounds and bytes
    equal the in-process loop's, whose cloud reads the same view. The plain log-mel, and a view at
    other bits, are refused by name."""
    edge = pair[0]
    cloud = tiny_lm("qwen2_5_omni", seed=2, n_mels=16)
    cloud.uplink = Uplink(16, 3, "clip", bits)
    client = client_for(serve(lm=cloud))
    info = client.info()
    assert info["uplink"] == {"bands": 16, "merge": 3, "normalize": "clip", "bits": bits} and info["n_mels"] == 16
    for case in CASES[:3]:
        for _, mel in clips:
            ref = speculative(edge, cloud, mel, "en", settings(**copy.deepcopy(case)), link())
            got = caption_remote(edge, client, info, mel, "en", settings(**copy.deepcopy(case)), link())
            assert got.token_ids == ref.token_ids and got.rounds == ref.rounds and got.rounds > 0
            assert _packets(got) == _packets(ref)
            wire = cloud.uplink.encode(mel)
            assert wire.shape == (16, -(-mel.shape[1] // 3))
            values = 2 * wire.size if bits == 16 else 1 + 5 * 16 + -(-wire.size * bits // 8)  # codes + lattices
            sent = [p["bytes"] for p in got.packets if p["kind"] == "features"]
            assert sent == [12 + 16 + 12 + 8 + values]  # OPEN + FEATURES headers, then the values
            assert [p["bytes"] for p in ref.packets if p["kind"] == "features"] == [12 + 8 + values]
    plain = caption_remote(edge, client, {**info, "uplink": {}}, clips[0][1], "en", settings(), link())
    assert plain.network["fallback"] > 0 and "128 mel bands, the model takes 16" in plain.network["fallback_reasons"][0]
    other = {**info, "uplink": {**info["uplink"], "bits": 8 if bits == 16 else 16}}
    refused = caption_remote(edge, client, other, clips[0][1], "en", settings(), link())
    assert refused.network["fallback"] > 0 and f"the model reads a {bits}-bit uplink" in \
        refused.network["fallback_reasons"][0]


@pytest.mark.parametrize("bits", [16, 4])
def test_a_learned_uplink_runs_alike_in_process_and_over_the_network(pair, clips, serve, client_for, tmp_path, bits):
    """A cloud reading a learned encoder's output (16 rows, 3 frames merged; float16, or 4-bit codes):
    the edge computes it with the encoder shipped with it, and the captions, rounds and bytes equal the
    in-process loop's. An edge without that encoder refuses to start; features sent through another
    encoder are refused by name."""
    torch.manual_seed(3)
    learned = LearnedUplink.trained(UplinkEncoder(EncoderShape(128, 16, 24, 3, "clip", bits)))
    cloud = tiny_lm("qwen2_5_omni", seed=2, n_mels=16)
    cloud.uplink = learned
    edge = copy.copy(pair[0])
    edge.sends = LearnedUplink.load(*_saved(learned, tmp_path))
    client = client_for(serve(lm=cloud))
    info = client.info()
    assert info["uplink"] == learned.to_dict() and info["n_mels"] == 16
    for case in CASES[:2]:
        for _, mel in clips:
            ref = speculative(edge, cloud, mel, "en", settings(**copy.deepcopy(case)), link())
            got = caption_remote(edge, client, info, mel, "en", settings(**copy.deepcopy(case)), link())
            assert got.token_ids == ref.token_ids and got.rounds == ref.rounds and got.rounds > 0
            assert _packets(got) == _packets(ref)
            sent = [p["bytes"] for p in got.packets if p["kind"] == "features"]
            size = 16 * -(-mel.shape[1] // 3)
            values = 2 * size if bits == 16 else 1 + 5 * 16 + -(-size * bits // 8)  # codes + lattices
            assert sent == [12 + 16 + 12 + 8 + values]
            assert got.edge_compute > 0 and ref.edge_compute > 0  # the encoder ran on the edge, both ways
    check_compatible(edge, info)
    for other in (pair[0], copy.copy(pair[0])):  # no encoder shipped, and another one
        if other is not pair[0]:
            torch.manual_seed(4)
            other.sends = LearnedUplink.trained(UplinkEncoder(EncoderShape(128, 16, 24, 3, "clip")))
        with pytest.raises(ValueError, match=f"reads learned uplink encoder {learned.digest}, this edge ships "):
            check_compatible(other, info)
        with pytest.raises(ValueError, match="deploy the edge and cloud of one `train` run"):
            caption_remote(other, client, info, clips[0][1], "en", settings(), link())
    packet = packets.open_packet(learned.encode(clips[0][1]), "en", "rank", 1, 1.0, 0, "float16", learned.wire_dtype)
    for name in ("", "0123456789ab"):
        with pytest.raises(CloudRefused, match=f"uplink encoder {name or '.none named.'}, the model reads learned "
                                               f"uplink encoder {learned.digest}"):
            client.open(packet, name)


def _saved(uplink: LearnedUplink, folder) -> tuple:
    """What an edge loads its shipped encoder from: the folder and its description, as written."""
    uplink.save(folder)
    return folder, uplink.to_dict()
