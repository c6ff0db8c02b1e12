import numpy as np
import pytest

from speccap.config import LinkConfig, MarkovParams
from speccap.decoding import packets
from speccap.decoding.link import Link


def test_id_bits_and_packing_roundtrip():
    assert packets.id_bits(1000) == 10 and packets.id_bits(151936) == 18 and packets.id_bits(2) == 1
    ids = [0, 1, 1023, 517, 3]
    data = packets.pack_ids(ids, 10)
    assert len(data) == 7 and packets.unpack_ids(data, 5, 10) == ids
    with pytest.raises(packets.PacketError, match="does not fit"):
        packets.pack_ids([1024], 10)
    with pytest.raises(packets.PacketError, match="token id -1 does not fit"):
        packets.pack_ids([3, -1], 10)
    # fields big-endian one after another, the last byte zero-padded: 0b1 0b10 0b11 0b100 in 3 bits
    assert packets.pack_ids([1, 2, 3, 4], 3) == bytes([0b00101001, 0b11000000])
    rng = np.random.default_rng(0)
    for bits in (1, 7, 8, 9, 18):
        for n in (1, 2, 5, 8, 40):
            ids = rng.integers(0, 1 << bits, n).tolist()
            data = packets.pack_ids(ids, bits)
            assert len(data) == -(-n * bits // 8) and packets.unpack_ids(data, n, bits) == ids


def test_packets_roundtrip_with_exact_sizes():
    up = packets.verify_packet(7, 3, [5, 6], [7, 8, 9], 18)
    assert len(up) == 12 + 5 + int(np.ceil(5 * 18 / 8))
    assert packets.parse_verify(up) == (7, 3, [5, 6], [7, 8, 9])
    down = packets.verdict_packet(7, 3, 2, 151000, 18)
    assert packets.parse_verdict(down) == (7, 3, 2, 151000)
    assert packets.parse_verdict(packets.verdict_packet(7, 4, 3, None, 18)) == (7, 4, 3, None)
    mel = np.random.default_rng(0).standard_normal((128, 50)).astype(np.float32)
    f = packets.features_packet(7, mel, "zh")
    assert len(f) == 12 + 8 + 128 * 50 * 2
    sid, back, lang = packets.parse_features(f)
    assert sid == 7 and lang == "zh" and np.allclose(back, mel, atol=1e-2)


def test_malformed_packets():
    with pytest.raises(packets.PacketError, match="shorter than"):
        packets.parse_header(b"SC")
    with pytest.raises(packets.PacketError, match="bad magic"):
        packets.parse_header(b"XX" + bytes(10))
    bad = bytearray(packets.verify_packet(1, 1, [], [1], 10))
    bad[2] = 9
    with pytest.raises(packets.PacketError, match="version 9"):
        packets.parse_verify(bytes(bad))
    with pytest.raises(packets.PacketError, match="expected a VERDICT"):
        packets.parse_verdict(packets.verify_packet(1, 1, [], [1], 10))


def test_open_packet_roundtrip_and_float32_features():
    mel = np.random.default_rng(0).standard_normal((128, 50)).astype(np.float32)
    for dtype, size in (("float16", 2), ("float32", 4)):
        data = packets.open_packet(mel, "zh", "rank", 7, 1.0, 2**40 + 3, "float32", dtype)
        assert len(data) == 12 + 16 + 12 + 8 + 128 * 50 * size  # header, OPEN body, FEATURES header+body
        req = packets.parse_open(data)
        assert (req.rule, req.rank, req.seed, req.q_dtype, req.language) == ("rank", 7, 2**40 + 3, "float32", "zh")
        exact = mel if dtype == "float32" else mel.astype(np.float16)
        assert np.array_equal(req.features, exact)
    assert packets.parse_open(packets.open_packet(mel, "en", "greedy")).rank == 1  # greedy is rank 1
    with pytest.raises(packets.PacketError, match="cannot be verified"):
        packets.open_packet(mel, "en", "pipelined")
    # wisv: its tau in the temperature field, a probability
    assert packets.parse_open(packets.open_packet(mel, "en", "wisv", 1, 0.3)).rule == "wisv"
    with pytest.raises(packets.PacketError, match="bad rule settings"):
        packets.parse_open(packets.open_packet(mel, "en", "wisv", 1, 1.5))
    csi = packets.csi_payload(20.0, 100.0, 50.0, 0.01)
    values, rest = packets.parse_csi(csi + b"xy")
    assert values == pytest.approx((20.0, 100.0, 50.0, 0.01)) and rest == b"xy"
    with pytest.raises(packets.PacketError, match="channel state"):
        packets.parse_csi(csi[:10])
    bad = bytearray(packets.open_packet(mel, "en", "greedy"))
    bad[12] = 9  # unknown rule code
    with pytest.raises(packets.PacketError, match="rule code"):
        packets.parse_open(bytes(bad))
    nan = mel.copy()
    nan[0, 0] = np.nan
    with pytest.raises(packets.PacketError, match="NaN"):
        packets.parse_open(packets.open_packet(nan, "en", "greedy", features_dtype="float32"))


def test_q_rows_travel_after_verify_and_are_checked():
    import torch
    q = [torch.softmax(torch.randn(40, dtype=torch.float64), 0).float() for _ in range(3)]
    data = packets.verify_packet(1, 1, [5], [1, 2, 3], 6) + packets.q_payload(q, "float32")
    assert packets.parse_verify(data)[3] == [1, 2, 3]
    tail = packets.verify_tail(data)
    assert len(tail) == 3 * 40 * 4
    rows = packets.parse_q(tail, 3, 40, "float32")
    assert np.array_equal(rows, np.stack([x.numpy() for x in q]).astype(np.float64))
    with pytest.raises(packets.PacketError, match="expected 3 x 41"):
        packets.parse_q(tail, 3, 41, "float32")
    with pytest.raises(packets.PacketError, match="sum to 1"):
        packets.parse_q(np.full((3, 40), 0.5, np.float32).tobytes(), 3, 40, "float32")



def test_link_time_formula_and_retransmissions():
    link = Link(LinkConfig(uplink_mbps=1.0, downlink_mbps=2.0, rtt_ms=40.0, overhead_bytes=40))
    assert link.send(bytes(960), "up") == pytest.approx(0.02 + 8 * 1000 / 1e6)
    assert link.send(bytes(960), "down") == pytest.approx(0.02 + 8 * 1000 / 2e6)
    lossy = [Link(LinkConfig(rtt_ms=50.0, packet_error_rate=0.3), seed=s) for s in (1, 1)]
    a = [lossy[0].send(bytes(100), "up") for _ in range(200)]
    b = [lossy[1].send(bytes(100), "up") for _ in range(200)]
    assert a == b and lossy[0].retransmissions > 30  # seeded, and about 0.3/0.7 per packet
    with pytest.raises(ValueError, match="packet_error_rate"):
        Link(LinkConfig(packet_error_rate=1.0))


def test_markov_channel_switches_between_rates():
    link = Link(LinkConfig(rtt_ms=0.0, overhead_bytes=0, markov=MarkovParams(4.0, 0.35, 0.2, 0.2)), seed=0)
    times = {round(link.send(bytes(1000), "up"), 6) for _ in range(100)}
    assert times == {round(8000 / 4e6, 6), round(8000 / 350e3, 6)}


def test_tap_sees_every_payload():
    seen = []
    link = Link(LinkConfig(), tap=lambda d, p: seen.append((d, p)))
    link.send(b"abc", "up")
    assert seen == [("up", b"abc")]


def test_a_peaked_q_travels_as_numpy_casts_it_to_float16():
    """Most of a peaked law's values are float16 subnormals (or round to 0): the payload holds the
    bits numpy's cast gives each float32 value, whichever library casts."""
    import torch
    g = torch.Generator().manual_seed(3)
    q = [torch.softmax(20 * torch.randn(300, generator=g, dtype=torch.float64), 0).float() for _ in range(4)]
    expected = np.stack([x.numpy() for x in q]).astype(np.float16)
    assert (expected[expected > 0] < 6.1e-5).any()  # subnormal float16 values are in the block
    assert packets.q_payload(q) == expected.tobytes()
    assert packets.q_payload(q, "float32") == np.stack([x.numpy() for x in q]).tobytes()
