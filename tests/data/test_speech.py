"""What counts as speech: real (eSpeak) speech and a voiced-like tone pass; a constant offset,
white noise at any level and near-silence do not, and the reason says what was found."""

import numpy as np
import pytest

from speccap.data.speech import MIN_SPEECH_SECONDS, check_speech
from speccap.data.tts import Prosody, Speaker

SR = 16000
RNG = np.random.default_rng(0)


def test_real_speech_and_a_voiced_tone_are_speech(tone):
    import soxr
    speaker = Speaker()
    for text, voice in (("I cannot believe you did that again.", "en+f3"), ("我真的不敢相信。", "cmn+m1")):
        x = soxr.resample(speaker.say(text, voice, Prosody()), speaker.sample_rate, SR).astype(np.float32)
        noisy = x + 0.01 * RNG.standard_normal(len(x)).astype(np.float32)  # speech in background noise
        for clip in (x, noisy):
            found = check_speech(clip, SR)
            assert found.has_speech and found.speech_seconds >= MIN_SPEECH_SECONDS, (text, found)
    assert check_speech(tone(), SR).has_speech


@pytest.mark.parametrize("name, samples, says", [
    ("offset", np.full(2 * SR, 0.3, np.float32), "a constant offset of +0.300 with nothing on it"),
    ("offset and hiss", 0.3 + 1e-5 * RNG.standard_normal(2 * SR), "a constant offset of +0.300 with nothing on it"),
    ("near-silence", 1e-5 * RNG.standard_normal(2 * SR), "near-silence"),
    ("white noise", 0.1 * RNG.standard_normal(2 * SR), "a flat, noise-like spectrum"),
    ("loud white noise", np.clip(0.5 * RNG.standard_normal(2 * SR), -1, 1), "a flat, noise-like spectrum"),
    ("quiet white noise", 0.003 * RNG.standard_normal(2 * SR), "a flat, noise-like spectrum"),
])
def test_no_speech_is_found_in_offsets_noise_and_silence(name, samples, says):
    found = check_speech(np.asarray(samples, np.float32), SR)
    assert not found.has_speech and says in found.found(), (name, found)
