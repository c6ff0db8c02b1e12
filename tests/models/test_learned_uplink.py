"""The learned uplink (models.learned_uplink): what the encoder sends, how it is named, saved and
refused, and what its training adds."""

import json

import numpy as np
import pytest
import torch

from speccap.data.uplink import Uplink, dequantise, quantise
from speccap.decoding.ledger import Ledger
from speccap.models.learned_uplink import (
    ENCODER_FILE,
    UPLINK_FILE,
    EncoderShape,
    LearnedUplink,
    SpeakerAdversary,
    TrainingFront,
    UplinkEncoder,
)
from speccap.models.loading import ModelLoadError, read_uplink
from speccap.models.train import Example
from speccap.pipeline.privacy import clip_statistics

SHAPE = EncoderShape(n_mels=32, rows=6, hidden=8, merge=4, normalize="clip")


def _learned(seed: int = 0, shape: EncoderShape = SHAPE) -> LearnedUplink:
    torch.manual_seed(seed)
    return LearnedUplink.trained(UplinkEncoder(shape))


def _mel(frames: int = 37, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((32, frames)).astype(np.float32)


def test_the_encoder_sends_rows_per_merged_frame_as_float16_values():
    up = _learned()
    for frames in (1, 4, 37):
        sent = up.encode(_mel(frames))
        assert sent.shape == (6, -(-frames // 4)) and sent.dtype == np.float32
        assert np.array_equal(sent, sent.astype(np.float16).astype(np.float32))
    sent = up.encode(_mel(40))
    # clip-normalised: every row's level and spread over the clip removed (up to float16 rounding)
    assert np.abs(sent.mean(1)).max() < 1e-3 and np.abs(sent.std(1) - 1).max() < 0.05  # NORM_EPS
    assert up.bytes_per_second(32, 16000, 320) == 2 * 6 * 16000 / (320 * 4)
    assert up.name(32, 320) == f"learned 6 rows, hop 1280, clip-normalised ({up.digest})"
    with pytest.raises(ValueError, match="reads 32 mel bands, the features have 128"):
        up.encode(np.zeros((128, 10), np.float32))
    with pytest.raises(ValueError, match="with frames"):
        up.encode(np.zeros((32, 0), np.float32))


def test_the_digest_names_the_weights():
    a, b = _learned(0), _learned(1)
    assert a == _learned(0) and a != b and a.digest != b.digest and len(a.digest) == 12
    assert a.learned and not Uplink().learned and Uplink().digest == ""
    assert a.to_dict() == {"learned": {"n_mels": 32, "rows": 6, "hidden": 8, "merge": 4, "normalize": "clip"},
                           "digest": a.digest}


def test_saved_and_read_back_as_the_same_encoder(tmp_path):
    up = _learned()
    up.save(tmp_path)
    back = read_uplink(tmp_path)
    assert back == up and np.array_equal(back.encode(_mel()), up.encode(_mel()))
    # weights that are not the ones described are refused, naming both
    _learned(1).save(tmp_path / "other")
    (tmp_path / ENCODER_FILE).write_bytes((tmp_path / "other" / ENCODER_FILE).read_bytes())
    with pytest.raises(ModelLoadError, match=f"names {up.digest}"):
        read_uplink(tmp_path)
    (tmp_path / ENCODER_FILE).unlink()
    with pytest.raises(ModelLoadError, match="missing"):
        read_uplink(tmp_path)
    (tmp_path / UPLINK_FILE).write_text(json.dumps({"learned": {"rows": 3}, "digest": "x"}))
    with pytest.raises(ModelLoadError, match="not an uplink description"):
        read_uplink(tmp_path)


def test_the_adversary_reverses_its_gradient_into_the_encoder():
    """The classifier learns to name the voice (its own gradient as usual); what it sends back to the
    encoder is that gradient times -weight."""
    torch.manual_seed(0)
    sent = [torch.randn(6, 5, requires_grad=True) for _ in range(3)]
    adv = SpeakerAdversary(6, 2, weight=0.5)
    adv.loss(sent, [0, 1, 0]).backward()
    reversed_grads = [z.grad.clone() for z in sent]
    plain = [z.detach().clone().requires_grad_(True) for z in sent]
    who = torch.tensor([0, 1, 0])
    frames = torch.stack([adv.net(z.T).log_softmax(-1).mean(0) for z in plain])
    clips = torch.stack([adv.clip(adv.statistics(z)).log_softmax(-1) for z in plain])
    (torch.nn.functional.nll_loss(frames, who) + torch.nn.functional.nll_loss(clips, who)).backward()
    for r, p in zip(reversed_grads, plain):
        assert torch.allclose(r, -0.5 * p.grad)
    assert all(p.grad is not None for p in adv.parameters())
    assert adv.loss(sent, [-1, -1, -1]) is None  # no known voice: nothing to learn from
    # the clip statistics are the privacy stage's voice classifier's
    z = torch.randn(6, 9)
    assert np.allclose(adv.statistics(z).numpy(), clip_statistics(z.numpy()), atol=1e-5)


def test_a_front_needs_two_voices_to_hide_one():
    with pytest.raises(ValueError, match="fewer than two voices"):
        TrainingFront.build(SHAPE, 0.5, ["en+f1", None, "en+f1"], seed=0)
    front = TrainingFront.build(SHAPE, 0.5, ["en+f2", "en+m1", None], seed=0)
    assert front.speaker_index == {"en+f2": 0, "en+m1": 1}
    examples = [Example(str(i), torch.from_numpy(_mel(20 + i)).half(), [[1]], "en", speaker=s)
                for i, s in enumerate(["en+m1", "zh+f1", "en+f2"])]
    sent = front.features(examples)
    assert [z.shape for z in sent] == [(6, 5), (6, 6), (6, 6)]
    assert front.loss(sent, examples) is not None  # an unknown voice (zh+f1) is left out
    assert TrainingFront.build(SHAPE, 0.0, [], seed=0).loss(sent, examples) is None


def test_the_edge_pays_for_a_learned_encoder_not_for_a_pooled_view():
    mel = _mel(400)
    books = Ledger("cloud")
    assert np.array_equal(books.sent(Uplink(8, 4), mel), Uplink(8, 4).encode(mel))
    assert books.rec.edge_compute == 0.0 and books.now == 0.0
    sent = books.sent(_learned(), mel)
    assert np.array_equal(sent, _learned().encode(mel))
    assert books.rec.edge_compute > 0 and books.now == books.rec.edge_compute


def test_a_coded_encoder_sends_lattice_values_and_trains_straight_through(tmp_path):
    """bits below 16: what is sent is the hand-made views' codes (data.uplink.quantise: coding it again
    gives the same values), named and priced by its bits; in training the cloud reads those values
    while the encoder gets the gradient of the uncoded output (straight through the rounding)."""
    coded_shape = EncoderShape(n_mels=32, rows=6, hidden=8, merge=4, normalize="clip", bits=4)
    up, plain = _learned(0, coded_shape), _learned(0)
    sent = up.encode(_mel(40))
    assert np.array_equal(dequantise(*quantise(sent, 4)), sent)
    assert all(len(np.unique(row)) <= 16 for row in sent) and not np.array_equal(sent, plain.encode(_mel(40)))
    assert np.abs(sent - plain.encode(_mel(40))).max() < 0.5  # the same encoding, coarser
    assert up.wire_dtype == "q4" and plain.wire_dtype == "float16" and up.bits == 4
    assert up.bytes_per_second(32, 16000, 320) == plain.bytes_per_second(32, 16000, 320) / 4
    assert up.name(32, 320) == f"learned 6 rows, hop 1280, clip-normalised, 4-bit ({up.digest})"
    assert up.to_dict()["learned"]["bits"] == 4 and up.digest != plain.digest  # same weights, another uplink
    up.save(tmp_path)
    back = read_uplink(tmp_path)
    assert back == up and back.bits == 4 and np.array_equal(back.encode(_mel(40)), sent)
    # training: the forward gives the coded values, the weights the uncoded output's gradient
    mel = torch.from_numpy(_mel(40))
    weights = torch.randn(6, 10, generator=torch.Generator().manual_seed(1))
    grads = {}
    for name, enc in (("coded", up.encoder), ("plain", plain.encoder)):
        enc.zero_grad()
        z = enc(mel)
        if name == "coded":
            assert torch.allclose(z.detach(), torch.from_numpy(sent), atol=1e-6)
        (z * weights).sum().backward()
        grads[name] = [p.grad.clone() for p in enc.parameters()]
    assert all(torch.equal(a, b) and a.abs().sum() > 0 for a, b in zip(grads["coded"], grads["plain"]))
