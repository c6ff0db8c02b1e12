"""Is there speech in a clip? Audio with none (a constant offset, stationary noise, near-silence) is
refused before it is captioned: a captioner asked about it would describe a speaker all the same.

The test is deliberately simple and errs towards captioning: a clip holds speech when at least
`MIN_SPEECH_SECONDS` of its 25 ms frames are both audible (within `ACTIVE_RANGE_DB` of its loudest
frame, and above `FLOOR_DBFS`) and far from spectrally flat (Wiener entropy below `MAX_FLATNESS`).
Voiced speech puts its energy into harmonics and formants (flatness well below 0.1 in most voiced
frames); white noise is flat (about 0.5 to 0.6 for a 25 ms frame) and a constant offset leaves nothing
once the mean is removed. Tones and strongly coloured noise (brown noise) pass: they are not speech,
but they are not what this check is for either.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FRAME, HOP = 400, 160  # 25 ms frames every 10 ms at 16 kHz
MAX_FLATNESS = 0.3
ACTIVE_RANGE_DB = 40.0
FLOOR_DBFS = -60.0
MIN_SPEECH_SECONDS = 0.2


@dataclass(frozen=True)
class SpeechCheck:
    speech_seconds: float  # audible frames with a structured spectrum
    offset: float  # the clip's mean (a constant offset)
    level_dbfs: float  # RMS of the clip without its offset
    median_flatness: float  # over the audible frames (nan: none)

    @property
    def has_speech(self) -> bool:
        return self.speech_seconds >= MIN_SPEECH_SECONDS

    def found(self) -> str:
        """What the clip holds instead of speech, in words."""
        if self.level_dbfs < FLOOR_DBFS:
            what = f"a constant offset of {self.offset:+.3f}" if abs(self.offset) > 1e-3 else "near-silence"
            return f"{what} with nothing on it above {FLOOR_DBFS:g} dBFS"
        return (f"a flat, noise-like spectrum (median spectral flatness {self.median_flatness:.2f}, speech is "
                f"below {MAX_FLATNESS:g}) at {self.level_dbfs:.1f} dBFS: {self.speech_seconds:.2f} s of speech-like "
                f"frames, {MIN_SPEECH_SECONDS:g} s needed")


def check_speech(samples: np.ndarray, sample_rate: int = 16000) -> SpeechCheck:
    """Measure how much of `samples` (mono float32) looks like speech."""
    x = np.asarray(samples, dtype=np.float64)
    offset = float(x.mean()) if len(x) else 0.0
    x = x - offset
    level = 10 * np.log10(float(np.mean(x * x)) + 1e-20)
    frame, hop = FRAME * sample_rate // 16000, HOP * sample_rate // 16000
    if len(x) < frame or level < FLOOR_DBFS:
        return SpeechCheck(0.0, offset, level, float("nan"))
    frames = np.lib.stride_tricks.sliding_window_view(x, frame)[::hop]
    energy = 10 * np.log10((frames * frames).mean(axis=1) + 1e-20)  # dBFS per frame
    power = np.abs(np.fft.rfft(frames * np.hanning(frame), axis=1)) ** 2 + 1e-20
    flatness = np.exp(np.log(power).mean(axis=1)) / power.mean(axis=1)
    active = (energy > energy.max() - ACTIVE_RANGE_DB) & (energy > FLOOR_DBFS)
    speech = active & (flatness < MAX_FLATNESS)
    median = float(np.median(flatness[active])) if active.any() else float("nan")
    return SpeechCheck(float(speech.sum()) * hop / sample_rate, offset, level, median)
