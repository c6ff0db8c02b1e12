import numpy as np
import pytest

from speccap.config import LinkConfig
from speccap.decoding import packets
from speccap.decoding.link import Link
from speccap.decoding.wisv.upload import MismatchRate, choose, expected_seconds, full_hidden, selective_hidden


def test_hidden_and_mismatch_packets_roundtrip_with_exact_sizes():
    h = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    data = packets.hidden_packet(7, 2, [0, 4, 5], h)
    assert len(data) == 12 + 4 + 3 * 2 + 3 * 16 * 2
    sid, seq, pos, back = packets.parse_hidden(data)
    assert (sid, seq, pos) == (7, 2, [0, 4, 5]) and np.array_equal(back, h.astype(np.float16))
    m = packets.mismatch_packet(7, 2, [1, 3])
    assert len(m) == 12 + 2 + 4 and packets.parse_mismatch(m) == (7, 2, [1, 3])
    with pytest.raises(packets.PacketError, match="does not hold"):
        packets.parse_hidden(data[:-1])


def test_protocol_bytes_and_rounds():
    d, draft, bits = 2048, [5, 6, 7, 8, 9], 17
    h = np.zeros((5, d), dtype=np.float32)
    full = full_hidden(1, 1, [3], draft, h, bits)
    sel = selective_hidden(1, 1, [3], draft, h, [2], bits)
    none = selective_hidden(1, 1, [3], draft, h, [], bits)
    verify = len(packets.verify_packet(1, 1, [3], draft, bits))
    verdict = len(packets.verdict_packet(1, 1, 5, 0, bits))
    assert [len(p) for _, _, p in full] == [verify, 12 + 4 + 5 * 2 + 5 * d * 2, verdict]
    assert [(dr, k, len(p)) for dr, k, p in sel] == [("up", "verify", verify), ("down", "mismatch", 12 + 2 + 2),
                                                     ("up", "hidden", 12 + 4 + 2 + d * 2), ("down", "verdict", verdict)]
    assert [k for _, k, _ in none] == ["verify", "verdict"]  # no mismatch: no extra round trip
    # one direction change costs a round trip: full has one exchange, selective with a mismatch two
    assert sum(dr == "down" for dr, _, _ in full) == 1 and sum(dr == "down" for dr, _, _ in sel) == 2


def test_choice_follows_rtt_and_uplink():
    bits, d = 17, 3584  # Qwen2.5-Omni-7B's hidden size
    long_rtt = Link(LinkConfig(uplink_mbps=20.0, downlink_mbps=100.0, rtt_ms=50.0))
    short_slow = Link(LinkConfig(uplink_mbps=2.0, downlink_mbps=100.0, rtt_ms=1.0))
    assert choose(long_rtt, 5, d, 1.0, bits) == "full"
    assert choose(short_slow, 5, d, 1.0, bits) == "selective"
    est = expected_seconds(long_rtt, 5, d, 1.0, bits)
    assert est["selective"] - est["full"] == pytest.approx(0.050 - 8 * 4 * d * 2 / 20e6, abs=2e-3)


def test_seconds_pays_one_propagation_per_direction_change():
    from speccap.decoding.wisv.upload import seconds
    link = Link(LinkConfig(uplink_mbps=8.0, downlink_mbps=8.0, rtt_ms=40.0, overhead_bytes=0))
    ex = [("up", "a", b"x" * 1000), ("up", "b", b"x" * 1000), ("down", "c", b"x" * 1000)]
    assert seconds(ex, link) == pytest.approx(0.020 + 0.002 + 0.020 + 0.001)


def test_the_mismatch_rate_is_what_the_answers_tell_the_edge():
    rate = MismatchRate()
    rate.learn(5, 5)  # all accepted: 5 examined, no mismatch known
    rate.learn(5, 2)  # rejected at 2: 3 examined, one mismatch
    rate.learn(5, 3, [0, 3, 4])  # selective: 0 let through, 3 rejected, 4 never examined
    assert (rate.mismatches, rate.examined) == (0 + 1 + 2, 5 + 3 + 4)
    assert rate.protocol("selective", Link(LinkConfig(rtt_ms=500.0)), 5, 2048, 17) == "selective"
    # `auto` expects more mismatches at a higher rate: on a short RTT and a slow uplink the states of
    # every token cost more than one more round trip for a few
    near = Link(LinkConfig(rtt_ms=1.0, uplink_mbps=0.5))
    assert MismatchRate().protocol("auto", near, 8, 2048, 17) == choose(near, 8, 2048, 0.8, 17)
