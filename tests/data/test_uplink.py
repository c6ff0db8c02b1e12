"""What the edge sends the cloud: the log-mel untouched, or a pooled (and normalised) view of it."""

import numpy as np
import pytest

from speccap.config import ConfigError, load_params
from speccap.data.features import log_mel
from speccap.data.uplink import Uplink
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
