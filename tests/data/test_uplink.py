"""What the edge sends the cloud: the log-mel untouched, or a pooled (and normalised) view of it."""

import numpy as np
import pytest

from speccap.config import ConfigError, load_params
from speccap.data.features import log_mel
from speccap.data.uplink import Uplink, dequantise, quantise
from speccap.decoding import packets


@pytest.fixture
def mel(tone):
    return log_mel(tone(f0=180.0, seconds=1.3), hop_length=320)  # (128, 65)


def test_the_default_sends_the_log_mel_itself(mel):
    assert Uplink().identity and Uplink().encode(mel) is mel


@pytest.mark.parametrize("bands,merge", [(16, 1), (128, 8), (8, 4), (5, 3)])
def test_shape_and_bytes_on_the_wire(mel, bands, merge):
    u = Uplink(bands, merge)
    wire = u.encode(mel)
    frames = -(-mel.shape[1] // merge)
    assert wire.shape == (bands, frames) == (u.rows(128), u.frames(mel.shape[1]))
    assert wire.dtype == np.float32 and np.array_equal(wire, wire.astype(np.float16).astype(np.float32))
    # the FEATURES packet carries exactly these values, 2 bytes each
    sent = packets.features_packet(1, wire, "en")
    _, back, _ = packets.parse_features(sent)
    assert np.array_equal(back, wire) and len(sent) - len(packets.features_packet(1, wire[:, :0], "en")) == 2 * wire.size
    assert u.bytes_per_second(128, 16000, 320) == pytest.approx(2 * bands * 16000 / (320 * merge))


def test_pooling_averages_power_not_log(mel):
    """A pooled value is the mean power of its bands and frames, on the log-mel's scale."""
    wire = Uplink(4, 5).encode(mel)
    power = 10.0 ** (4.0 * mel.astype(np.float64) - 4.0)
    want = (np.log10(power[32:64, 5:10].mean()) + 4.0) / 4.0
    assert wire[1, 1] == pytest.approx(want, abs=2e-3)  # float16's step near 1
    # the last group of frames holds what is left (65 = 13 x 5 here; 7 leaves 2)
    tail = Uplink(128, 7).encode(mel)[:, -1]
    assert tail == pytest.approx(((np.log10(power[:, 63:].mean(1)) + 4.0) / 4.0).astype(np.float32), abs=2e-3)


def test_clip_normalisation_removes_each_bands_level_and_spread(mel):
    wire = Uplink(16, 2, "clip").encode(mel)
    assert np.abs(wire.mean(1)).max() < 1e-2
    moving = wire.std(1) > 0.5  # bands that move at all come out at unit spread
    assert moving.any() and np.allclose(wire.std(1)[moving], 1.0, atol=0.05)
    # a louder clip (every power x 100: +0.5 on the log-mel scale) sends the same values
    assert np.array_equal(Uplink(16, 2, "clip").encode(mel + 0.5), wire)
    assert not np.array_equal(Uplink(16, 2).encode(mel + 0.5), Uplink(16, 2).encode(mel))


def test_bad_settings_name_the_param(mel):
    with pytest.raises(ValueError, match="uplink.bands"):
        Uplink(0)
    with pytest.raises(ValueError, match="uplink.merge"):
        Uplink(8, 0)
    with pytest.raises(ValueError, match="uplink.normalize"):
        Uplink(8, 1, "speaker")
    with pytest.raises(ValueError, match="uplink.bands: 200 exceeds"):
        Uplink(200).encode(mel)
    with pytest.raises(ValueError, match=r"\(n_mels, frames\)"):
        Uplink(8).encode(mel[:, :0])
    with pytest.raises(ValueError, match="uplink.bits: 12"):
        Uplink(8, 1, "none", 12)


def test_params_refuse_an_uplink_a_real_cloud_cannot_read(tmp_path):
    base = (tmp_path / "params.yaml")
    base.write_text("uplink: {bands: 16, merge: 4, normalize: clip}\n")
    assert load_params(base).uplink.bands == 16
    _refused(base, "uplink: {bands: 16}\nmodels: {cloud: {backend: qwen2_5_omni, path: /nowhere}}\n",
             "params key uplink: a qwen2_5_omni cloud")
    _refused(base, "uplink: {bands: 256}\n", "uplink.bands: 256 is more than")
    _refused(base, "uplink: {normalize: speaker}\n", "uplink")


def _refused(path, text: str, match: str) -> None:
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_params(path)


def test_params_name_what_a_learned_uplink_cannot_be(tmp_path):
    base = tmp_path / "params.yaml"
    base.write_text("uplink: {merge: 8, normalize: clip, learned: {rows: 12, adversary: 0.5}}\n")
    learned = load_params(base).uplink.learned
    assert (learned.rows, learned.hidden, learned.adversary) == (12, 64, 0.5)
    _refused(base, "uplink: {bands: 16, learned: {rows: 12}}\n",
             "uplink.bands: 16 pooled bands and a learned encoder exclude each other")
    _refused(base, "uplink: {learned: {rows: 8}}\nmodels: {cloud: {backend: qwen2_5_omni, path: /nowhere}}\n",
             "params key uplink: a qwen2_5_omni cloud")
    for bad in ("{rows: 0}", "{adversary: -1.0}", "{layers: 2}"):
        _refused(base, f"uplink: {{learned: {bad}}}\n", "uplink.learned")


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_quantised_views_cross_the_link_exactly_at_their_bits(mel, bits):
    """Each row on a lattice of 2^bits values a power-of-two step apart: the packet carries the codes
    and each row's lattice, the cloud reads back exactly what the edge computed (quantising those
    values again changes nothing), and every value is within half a step of the float16 view."""
    u = Uplink(16, 2, "clip", bits)
    wire, fine = u.encode(mel), Uplink(16, 2, "clip").encode(mel)
    assert wire.dtype == np.float32 and wire.shape == fine.shape and not u.identity
    codes, lows, exponents = quantise(wire, bits)
    assert np.array_equal(dequantise(codes, lows, exponents), wire) and codes.max() < 2**bits
    assert all(len(np.unique(row)) <= 2**bits for row in wire)
    steps = np.exp2(quantise(fine, bits)[2].astype(float))
    assert (np.abs(wire - fine) <= steps[:, None] / 2 + 1e-3).all()  # float16's own rounding beside
    assert ((fine.max(1) - fine.min(1)) / steps <= 2**bits - 2).all()  # the smallest step that spans each row
    sent = packets.features_packet(1, wire, "en", u.wire_dtype)
    _, back, _, sent_bits = packets.parse_features_bits(sent)
    assert np.array_equal(back, wire) and sent_bits == bits == int(u.wire_dtype[1:])
    assert len(sent) == 12 + 8 + 1 + 5 * 16 + -(-wire.size * bits // 8)
    assert u.bytes_per_second(128, 16000, 320) == pytest.approx(bits / 8 * 16 * 16000 / 640)
    assert u.name(128, 320).endswith(f"clip-normalised, {bits}-bit")
    with pytest.raises(packets.PacketError, match=f"not values of a {bits}-bit uplink"):
        packets.features_packet(1, fine, "en", u.wire_dtype)


def test_a_row_that_never_moves_or_sits_far_from_zero_is_quantised_exactly():
    rows = np.stack([np.zeros(40), np.full(40, 3.3), 7.0 + 1e-6 * np.arange(40),
                     100.0 * np.sin(np.arange(40))]).astype(np.float32)
    for bits in (2, 3, 8):
        codes, lows, exponents = quantise(rows, bits)
        once = dequantise(codes, lows, exponents)
        assert np.array_equal(dequantise(*quantise(once, bits)), once)
        assert (np.abs(once - rows) <= np.exp2(exponents.astype(float))[:, None] / 2).all()
        assert not once[0].any() and np.abs(once[1] - 3.3).max() < 1e-6  # a constant row: its value, to float32's grain


def test_params_name_what_bits_cannot_be(tmp_path):
    base = tmp_path / "params.yaml"
    base.write_text("uplink: {bands: 16, normalize: clip, bits: 4}\n")
    assert Uplink.from_params(load_params(base).uplink) == Uplink(16, 1, "clip", 4)
    _refused(base, "uplink: {bits: 12}\n", "uplink.bits")
    base.write_text("uplink: {bits: 4, learned: {rows: 8}}\n")  # a learned encoder's values as codes
    assert load_params(base).uplink.bits == 4
    _refused(base, "uplink: {bits: 8}\nmodels: {cloud: {backend: qwen2_5_omni, path: /nowhere}}\n",
             "params key uplink: a qwen2_5_omni cloud")
