"""The audio features that may leave the device: Whisper-style log-mel and prosody summaries.

`log_mel` computes what a Qwen-Omni processor's WhisperFeatureExtractor computes (Hann STFT,
power spectrum, Slaney mel filters, log10, floor at max - 8, (x + 4) / 4), without the 30-second
padding; the hop is a parameter (160 for the real processors, 320 doubles the embedded models'
speed). `prosody` summarises pitch, energy, voicing and rate for the gates and reports.
"""

from __future__ import annotations

from functools import cache, lru_cache

import numpy as np

from ..numba_cache import ensure_warm

PROSODY_KEYS = ("f0_mean", "f0_std", "f0_min", "f0_max", "f0_range_st", "f0_slope_st_per_s",
                "f0_half_change_st", "energy_mean_db", "energy_std_db", "energy_half_change_db",
                "voiced_fraction", "onset_rate", "pause_fraction", "duration")


@cache
def _librosa():
    """librosa, imported only once the numba cache is known to load (speccap.numba_cache): some of
    its numba functions compile as their module is imported. Checked once per process, not at each
    of a clip's two calls: the check reads the CPU's name and features each time."""
    ensure_warm()
    import librosa
    return librosa


@lru_cache(maxsize=8)
def _mel_filters(sr: int, n_fft: int, n_mels: int) -> np.ndarray:
    return _librosa().filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=0.0, fmax=sr / 2,
                               htk=False, norm="slaney").astype(np.float32)


@lru_cache(maxsize=8)
def _window(n_fft: int) -> np.ndarray:
    # periodic Hann, as torch.hann_window / Whisper use
    return np.hanning(n_fft + 1)[:-1].astype(np.float32)


def log_mel(samples: np.ndarray, sr: int = 16000, n_mels: int = 128, n_fft: int = 400,
            hop_length: int = 160) -> np.ndarray:
    """(n_mels, frames) float32 log-mel, frames = len(samples) // hop_length (Whisper drops the last)."""
    x = np.asarray(samples, dtype=np.float32)
    pad = n_fft // 2
    # Front: reflect, like a centred STFT. Back: zeros, because the processor pads the clip with
    # silence (to 30 s) before its centred STFT, so the last frames see zeros, not a reflection.
    front = x[1 : pad + 1][::-1] if len(x) > pad else np.zeros(pad, np.float32)
    x = np.concatenate([front, x, np.zeros(pad, np.float32)])
    n_frames = (len(x) - 2 * pad) // hop_length
    frames = np.lib.stride_tricks.as_strided(
        x, shape=(n_frames, n_fft), strides=(x.strides[0] * hop_length, x.strides[0]), writeable=False)
    spec = np.fft.rfft(frames * _window(n_fft), axis=1)
    power = (spec.real**2 + spec.imag**2).astype(np.float32)
    mel = _mel_filters(sr, n_fft, n_mels) @ power.T
    logmel = np.log10(np.maximum(mel, 1e-10))
    logmel = np.maximum(logmel, logmel.max() - 8.0)
    return ((logmel + 4.0) / 4.0).astype(np.float32)


def clip_log_mel(samples: np.ndarray, params) -> np.ndarray:
    """log-mel with the settings of a `FeatureParams` (what featurize stores, what the edge sends)."""
    return log_mel(samples, sr=params.sample_rate, n_mels=params.n_mels, n_fft=params.n_fft,
                   hop_length=params.hop_length)


def _onsets(x: np.ndarray, sr: int, hop: int) -> np.ndarray:
    """Onset times (s): spectral-flux onsets from our 400-point log-mel, not from the 2048-point mel
    spectrogram librosa's `onset_detect(y=...)` builds (that was half of `prosody`'s time).
    The log-mel is mel power in dB with an 80 dB floor (max - 8 in log10 units), as librosa's. The
    flux compares each frame with the one two back, against a 3-band maximum (SuperFlux's
    vibrato suppression): with the finer frames, lag 1 also fired on pitch movement.
    On 300 synthetic test clips its rate correlates with the generator's speaking rate at 0.58
    (librosa's default: 0.50; lag 1 on this log-mel: 0.38)."""
    librosa = _librosa()
    db = 10.0 * (4.0 * log_mel(x, sr=sr, n_fft=400, hop_length=hop) - 4.0)
    # center=False: our frames are centred already (librosa would shift them by a 2048-point half window)
    envelope = librosa.onset.onset_strength(S=db, sr=sr, hop_length=hop, center=False, lag=2, max_size=3)
    return librosa.onset.onset_detect(onset_envelope=envelope, sr=sr, hop_length=hop, units="time")


def _semitones(f0: np.ndarray) -> np.ndarray:
    return 12.0 * np.log2(f0 / 100.0)


def prosody(samples: np.ndarray, sr: int = 16000) -> dict[str, float]:
    """Pitch / energy / voicing / rate summaries of one clip (floats; NaN-free)."""
    librosa = _librosa()
    x = np.asarray(samples, dtype=np.float32)
    hop = 160
    duration = len(x) / sr
    rms = librosa.feature.rms(y=x, frame_length=640, hop_length=hop)[0]
    db = 20 * np.log10(np.maximum(rms, 1e-6))
    active = db > (db.max() - 35.0)
    f0 = librosa.yin(x, fmin=60, fmax=500, sr=sr, frame_length=1024, hop_length=hop)
    n = min(len(f0), len(active))
    f0, active, db_a = f0[:n], active[:n], db[:n]
    voiced = active & (f0 > 61) & (f0 < 499)
    out = dict.fromkeys(PROSODY_KEYS, 0.0)
    out["duration"] = duration
    out["voiced_fraction"] = float(voiced.mean()) if n else 0.0
    out["pause_fraction"] = float(1.0 - active.mean()) if n else 1.0
    if active.any():
        e = db_a[active]
        out["energy_mean_db"] = float(e.mean())
        out["energy_std_db"] = float(e.std())
        idx = np.flatnonzero(active)
        half = idx[len(idx) // 2]
        first, second = db_a[: half][active[: half]], db_a[half:][active[half:]]
        if len(first) and len(second):
            out["energy_half_change_db"] = float(second.mean() - first.mean())
    if voiced.sum() >= 3:
        fv = f0[voiced]
        st = _semitones(fv)
        t = np.flatnonzero(voiced) * hop / sr
        out.update(f0_mean=float(fv.mean()), f0_std=float(fv.std()), f0_min=float(fv.min()),
                   f0_max=float(fv.max()), f0_range_st=float(np.percentile(st, 95) - np.percentile(st, 5)))
        if t.max() > t.min():
            out["f0_slope_st_per_s"] = float(np.polyfit(t, st, 1)[0])
        mid = len(st) // 2
        out["f0_half_change_st"] = float(st[mid:].mean() - st[:mid].mean())
    out["onset_rate"] = float(len(_onsets(x, sr, hop)) / max(duration, 1e-3))
    return {k: float(np.nan_to_num(v)) for k, v in out.items()}
