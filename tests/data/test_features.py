import numpy as np
import pytest
from transformers import WhisperFeatureExtractor

from speccap.data.features import PROSODY_KEYS, log_mel, prosody


def test_log_mel_equals_the_qwen_omni_whisper_extractor(tone):
    rng = np.random.default_rng(0)
    x = tone(220, 2.3) + 0.01 * rng.standard_normal(36800).astype(np.float32)
    ref = WhisperFeatureExtractor(feature_size=128)(x, sampling_rate=16000, return_tensors="np")["input_features"][0]
    ours = log_mel(x)
    assert ours.shape == (128, len(x) // 160)
    np.testing.assert_allclose(ours, ref[:, : ours.shape[1]], atol=2e-4)


def test_hop_is_a_parameter(tone):
    x = tone(220, 1.0)
    assert log_mel(x, hop_length=320).shape == (128, 50)
    assert log_mel(x, n_mels=80).shape == (80, 100)


def test_prosody_reads_pitch_level_and_direction(tone):
    low, high = prosody(tone(120, 1.5)), prosody(tone(240, 1.5))
    assert set(low) == set(PROSODY_KEYS)
    assert low["f0_mean"] == pytest.approx(120, rel=0.05) and high["f0_mean"] == pytest.approx(240, rel=0.05)
    sr = 16000
    t = np.arange(2 * sr) / sr
    rising = 0.5 * np.sin(2 * np.pi * (120 * t + 40 * t**2))  # 120 -> 280 Hz
    p = prosody(rising.astype(np.float32))
    assert p["f0_slope_st_per_s"] > 3 and p["f0_half_change_st"] > 3


def test_prosody_of_pauses_and_no_nans(tone):
    x = np.concatenate([tone(200, 0.5), np.zeros(8000, np.float32), tone(200, 0.5)])
    p = prosody(x)
    assert 0.2 < p["pause_fraction"] < 0.5
    assert all(np.isfinite(v) for v in p.values())


def test_onset_rate_counts_bursts_per_second(tone):
    # 3 s: a 100 ms tone burst (smooth rise and fall, like a syllable) every 0.25 s, 4 per second,
    # against a steady tone (no onsets after its start)
    sr = 16000
    bursts = np.zeros(3 * sr, np.float32)
    burst = tone(300, 0.1) * np.hanning(1600).astype(np.float32)
    for start in np.arange(0.1, 2.9, 0.25):
        i = int(start * sr)
        bursts[i: i + len(burst)] += burst
    steady = (0.5 * np.sin(2 * np.pi * 300 * np.arange(3 * sr) / sr)).astype(np.float32)  # `tone` pulses at 8 Hz
    assert prosody(bursts)["onset_rate"] == pytest.approx(4.0, abs=0.7)
    assert prosody(steady)["onset_rate"] <= 1.0
