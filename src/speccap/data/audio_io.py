"""Reading and writing clips: every input becomes 16 kHz mono float32, or a clear `AudioError`.

Reading streams the file in blocks (downmix + streaming resample per block) and stops at
`max_seconds`, so a ten-minute 48 kHz stereo file costs no more memory than the cap.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

TARGET_SR = 16000
_BLOCK_FRAMES = 1 << 16
# Peak below this (about -66 dBFS) is treated as silence: nothing to caption.
SILENCE_PEAK = 5e-4
# Share of samples at full scale above which a clip is flagged as clipped (kept, but noted).
CLIPPED_SHARE = 0.01
# Shorter clips are refused: under half a second there is no utterance to caption (the corpus's
# shortest clips last about a second), and the models would only produce noise.
MIN_SECONDS = 0.5


class AudioError(ValueError):
    """An audio file that cannot be used; the message names the file and the problem."""

    def __init__(self, path: str | os.PathLike, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{path}: {problem}")


@dataclass
class Clip:
    """A clip as the pipeline sees it: 16 kHz mono float32 in [-1, 1]."""

    samples: np.ndarray
    sample_rate: int
    source_rate: int
    source_channels: int
    source_seconds: float
    # Notes about what was done to the input (resampled, downmixed, trimmed, clipped).
    notes: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.sample_rate


def _check_wav_header(path: Path) -> None:
    """Catch truncated RIFF/WAVE files, which libsndfile reads short without complaint."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(12)
        if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            return  # not a RIFF WAVE: leave it to libsndfile
        offset = 12
        while True:
            chunk = fh.read(8)
            if len(chunk) < 8:
                raise AudioError(path, "truncated WAV: no 'data' chunk before end of file")
            cid, csize = chunk[:4], struct.unpack("<I", chunk[4:])[0]
            offset += 8
            if cid == b"data":
                have = size - offset
                # 0xFFFFFFFF / 0 mean "unknown length" (streamed writers): accept what is there
                if csize not in (0, 0xFFFFFFFF) and have < csize:
                    raise AudioError(
                        path, f"truncated WAV: header declares {csize} bytes of audio, file holds {have}"
                    )
                return
            offset += csize + (csize & 1)
            fh.seek(offset)


def read_audio(path: str | os.PathLike, max_seconds: float | None = None,
               target_sr: int = TARGET_SR, min_seconds: float = MIN_SECONDS) -> Clip:
    """Load any libsndfile-readable file as mono float32 at `target_sr`.

    Raises AudioError for a missing, empty, unreadable, truncated, silent or too short
    (< `min_seconds`) file, and for one holding NaN or infinite samples (a damaged float WAV).
    Longer files are trimmed to `max_seconds` (noted), reading no further than needed.
    """
    path = Path(path)
    if not path.exists():
        raise AudioError(path, "file not found")
    if path.is_dir():
        raise AudioError(path, "is a directory, not an audio file")
    if path.stat().st_size == 0:
        raise AudioError(path, "empty file (0 bytes)")
    _check_wav_header(path)
    try:
        info = sf.info(str(path))
    except (sf.LibsndfileError, RuntimeError) as exc:
        raise AudioError(path, f"not a readable audio file ({exc})") from None
    if info.frames == 0 or info.samplerate <= 0:
        raise AudioError(path, "audio file holds no samples")
    if info.frames / info.samplerate < min_seconds:
        raise AudioError(path, f"too short to caption: {info.frames / info.samplerate:.3f} s "
                               f"(the minimum is {min_seconds:g} s)")

    notes: list[str] = []
    limit = None if max_seconds is None else int(round(max_seconds * info.samplerate))
    resampler = None
    if info.samplerate != target_sr:
        resampler = soxr.ResampleStream(info.samplerate, target_sr, 1, dtype="float32")
        notes.append(f"resampled {info.samplerate} Hz -> {target_sr} Hz")
    if info.channels > 1:
        notes.append(f"downmixed {info.channels} channels to mono")

    pieces: list[np.ndarray] = []
    read = nonfinite = 0
    try:
        with sf.SoundFile(str(path)) as fh:
            while limit is None or read < limit:
                want = _BLOCK_FRAMES if limit is None else min(_BLOCK_FRAMES, limit - read)
                block = fh.read(want, dtype="float32", always_2d=True)
                if len(block) == 0:
                    break
                read += len(block)
                bad = ~np.isfinite(block)
                if bad.any():  # checked before resampling, which would smear one NaN over its neighbours
                    nonfinite += int(bad.any(axis=1).sum())
                    continue
                mono = block.mean(axis=1) if block.shape[1] > 1 else block[:, 0]
                last = len(block) < want or (limit is not None and read >= limit)
                if resampler is not None:
                    mono = resampler.resample_chunk(np.ascontiguousarray(mono), last=last)
                pieces.append(np.asarray(mono, dtype=np.float32))
                if last:
                    break
    except (sf.LibsndfileError, RuntimeError) as exc:
        raise AudioError(path, f"audio data unreadable ({exc})") from None

    if nonfinite:
        raise AudioError(path, f"{nonfinite} of {read} samples are NaN or infinite (a damaged float WAV?); "
                               "nothing to caption from")
    samples = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    source_seconds = info.frames / info.samplerate
    if limit is not None and info.frames > limit:
        notes.append(f"trimmed from {source_seconds:.1f} s to its first {max_seconds:.1f} s "
                     "(data.max_clip_seconds); the rest is not captioned")
    if len(samples) == 0:
        raise AudioError(path, "audio file holds no samples")
    peak = float(np.max(np.abs(samples)))
    if peak < SILENCE_PEAK:
        raise AudioError(path, f"silent audio (peak amplitude {peak:.2e})")
    clipped = float(np.mean(np.abs(samples) >= 0.999))
    if clipped > CLIPPED_SHARE:
        notes.append(f"clipped: {clipped:.1%} of samples at full scale")
    np.clip(samples, -1.0, 1.0, out=samples)
    return Clip(samples, target_sr, info.samplerate, info.channels, source_seconds, notes)


def write_wav(path: str | os.PathLike, samples: np.ndarray, sample_rate: int = TARGET_SR) -> None:
    """Write 16-bit PCM atomically (a crash never leaves a half-written clip under the final name)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    sf.write(str(tmp), np.clip(samples, -1.0, 1.0), sample_rate, subtype="PCM_16", format="WAV")
    os.replace(tmp, path)
