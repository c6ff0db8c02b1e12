import numpy as np
import pytest
import torch

from speccap.config import TrainParams
from speccap.models import train as train_mod
from speccap.models.aux_targets import cue_vector
from speccap.models.generate import generate
from speccap.models.train import Example, fingerprint, train_captioner

from .conftest import TINY, tiny_lm

# two "emotions": energy in the low or the high mel bins; each has its own caption, made of tokens
# an English caption may hold (the sessions forbid special and CJK tokens there)
_OK = sorted(set(range(12, 40)) - set(tiny_lm("qwen2_5_omni").blocked_ids("en").tolist()))
CAPS = {0: [_OK[0:4]], 1: [_OK[4:7] + [_OK[3]]]}


def _examples(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        label = i % 2
        mel = rng.standard_normal((128, int(rng.integers(80, 140)))).astype(np.float32) * 0.3
        mel[:64 if label == 0 else 128][64 * label:] += 2.0
        out.append(Example(f"c{i}", torch.from_numpy(mel).half(), CAPS[label], "en"))
    return out


SETTINGS = TrainParams(max_steps=40, batch_size=8, lr=3e-3, warmup_steps=5, eval_every=10, patience=10, threads=1)


def _weights(lm):
    return torch.cat([p.detach().flatten() for p in lm.model.parameters()])


def test_learns_audio_dependent_captions_deterministically(tmp_path):
    train, val = _examples(32, 0), _examples(8, 1)
    fp = fingerprint(TINY, SETTINGS, 0, "qwen2_5_omni", [e.clip_id for e in train])
    lm = tiny_lm("qwen2_5_omni", seed=0)
    settings = TrainParams(max_steps=120, batch_size=8, lr=1e-2, warmup_steps=10, eval_every=20, patience=10, threads=1)
    report = train_captioner(lm, train, val, settings, 0, tmp_path / "a", fp, progress=False)
    hist = report["history"]
    assert hist[-1]["val_loss"] < 0.5 * hist[0]["val_loss"]
    for e in val:
        g = generate(lm, e.mel.float().numpy(), "en", max_new_tokens=6)
        assert g.token_ids[:3] == e.captions[0][:3]  # the caption follows the audio
    again = tiny_lm("qwen2_5_omni", seed=0)
    train_captioner(again, train, val, settings, 0, tmp_path / "b", fp, progress=False)
    assert torch.equal(_weights(lm), _weights(again))


def test_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path, monkeypatch):
    train, val = _examples(24, 0), _examples(6, 1)
    fp = fingerprint(TINY, SETTINGS, 0, "qwen2_5_omni", [e.clip_id for e in train])
    full = tiny_lm("qwen2_5_omni", seed=0)
    train_captioner(full, train, val, SETTINGS, 0, tmp_path / "full", fp, progress=False)

    real_make_batch = train_mod.make_batch
    calls = {"n": 0}

    def crashing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 25:  # training step 25 (after the step-20 checkpoint)
            raise KeyboardInterrupt
        return real_make_batch(*args, **kwargs)

    monkeypatch.setattr(train_mod, "make_batch", crashing)
    crashed = tiny_lm("qwen2_5_omni", seed=0)
    with pytest.raises(KeyboardInterrupt):
        train_captioner(crashed, train, val, SETTINGS, 0, tmp_path / "resumed", fp, progress=False)
    monkeypatch.setattr(train_mod, "make_batch", real_make_batch)
    assert (tmp_path / "resumed" / "checkpoint.pt").exists()
    resumed = tiny_lm("qwen2_5_omni", seed=7)  # different init: everything must come from the checkpoint
    report = train_captioner(resumed, train, val, SETTINGS, 0, tmp_path / "resumed", fp, progress=False)
    assert report["steps"] == 40
    assert torch.equal(_weights(full), _weights(resumed))
    # a changed setting does not resume from a foreign checkpoint
    other = fingerprint(TINY, SETTINGS, 1, "qwen2_5_omni", [e.clip_id for e in train])
    assert other != fp


# a clip's label for each auxiliary target, by its caption (0 or 1)
_AUX_LABELS = {"emotion": lambda k: k, "sentence": lambda k: k,
               "cues": lambda k: cue_vector({"pitch": 40 + 30 * k, "pitch_range": 50, "rate": 160, "volume": 100,
                                             "tremor": k, "breathiness": 0, "harshness": 0, "pauses": 0,
                                             "contour": ("steady", "rising")[k]})}


@pytest.mark.parametrize("target", ["emotion", "sentence", "cues"])
def test_aux_loss_trains_the_audio_side_and_leaves_a_plain_model(tmp_path, target):
    import dataclasses
    train, val = _examples(16, 0), _examples(4, 1)
    for e in train + val:
        setattr(e, target, _AUX_LABELS[target](0 if e.captions == CAPS[0] else 1))
    fp = fingerprint(TINY, SETTINGS, 0, "qwen2_5_omni", [e.clip_id for e in train])
    settings = TrainParams(max_steps=6, batch_size=4, lr=1e-2, warmup_steps=1, eval_every=3, patience=10, threads=1)
    plain, aided = tiny_lm("qwen2_5_omni", seed=0), tiny_lm("qwen2_5_omni", seed=0)
    train_captioner(plain, train, val, settings, 0, tmp_path / "plain", fp, progress=False)
    train_captioner(aided, train, val, dataclasses.replace(settings, **{f"{target}_aux": 1.0}), 0, tmp_path / "aided",
                    fp + "a", progress=False)
    # the probe is a training aid: the saved model has exactly the plain model's parameters ...
    assert set(aided.model.state_dict()) == set(plain.model.state_dict())
    assert not any("_probe" in k for k in aided.model.state_dict())
    # ... and the auxiliary loss reached the weights
    assert not torch.equal(_weights(plain), _weights(aided))
