"""Voice-quality effects added to rendered speech in numpy: tremor, breathiness, harshness, noise.

eSpeak controls pitch, range, rate and volume but has no voice quality; these effects add the
cues MER-style references talk about ("a trembling voice", "breathy", "strained").
"""

from __future__ import annotations

import numpy as np


def envelope(x: np.ndarray, sr: int, ms: float = 20.0) -> np.ndarray:
    """Smoothed amplitude envelope (moving RMS over `ms`)."""
    n = max(1, int(sr * ms / 1000))
    kernel = np.ones(n, np.float32) / n
    return np.sqrt(np.convolve(x * x, kernel, mode="same")).astype(np.float32)


def tremor(x: np.ndarray, sr: int, depth: float, rate_hz: float, phase: float) -> np.ndarray:
    """Amplitude modulation at a few Hz: the quiver of a trembling voice."""
    if depth <= 0:
        return x
    t = np.arange(len(x), dtype=np.float32) / sr
    return x * (1.0 + depth * np.sin(2 * np.pi * rate_hz * t + phase)).astype(np.float32)


def breathiness(x: np.ndarray, sr: int, level: float, rng: np.random.Generator) -> np.ndarray:
    """Aspiration noise that follows the speech envelope (high-passed white noise)."""
    if level <= 0:
        return x
    noise = rng.standard_normal(len(x) + 1).astype(np.float32)
    noise = np.diff(noise) * 0.5  # first difference: tilt towards high frequencies, like breath
    return x + level * envelope(x, sr) * noise * 2.0


def harshness(x: np.ndarray, drive: float) -> np.ndarray:
    """Soft clipping: a strained, rough voice with added harmonics."""
    if drive <= 0:
        return x
    g = 1.0 + 6.0 * drive
    peak = float(np.max(np.abs(x))) or 1.0
    return (np.tanh(g * x / peak) / np.tanh(g) * peak).astype(np.float32)


def background_noise(x: np.ndarray, noise_db: float, rng: np.random.Generator) -> np.ndarray:
    """White noise `noise_db` below the speech RMS (measured over the voiced part)."""
    voiced = x[np.abs(x) > 0.02 * (np.max(np.abs(x)) or 1.0)]
    rms = float(np.sqrt(np.mean(voiced**2))) if len(voiced) else 0.0
    return x + rng.standard_normal(len(x)).astype(np.float32) * rms * 10 ** (noise_db / 20)
