import os

import numpy as np
import pytest
import soundfile as sf

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@pytest.fixture
def tone():
    """A voiced-like test signal: harmonic tone at f0 with a syllable-rate envelope."""
    def make(f0=200.0, seconds=1.0, sr=16000, amp=0.5):
        t = np.arange(int(seconds * sr)) / sr
        x = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 6))
        env = 0.6 + 0.4 * np.sin(2 * np.pi * 4 * t) ** 2
        return (amp * x * env / np.max(np.abs(x))).astype(np.float32)
    return make


@pytest.fixture
def write_audio(tmp_path):
    def write(name, samples, sr=16000, subtype="PCM_16"):
        path = tmp_path / name
        sf.write(str(path), samples, sr, subtype=subtype)
        return path
    return write
