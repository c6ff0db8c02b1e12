"""Real speech from eSpeak NG, driven through ctypes (no internet, no subprocess).

The pip wheel `espeakng-loader` ships libespeak-ng and its voice data (English and Mandarin
among them). The library keeps global state, so one `Speaker` per process: the corpus
renderer gives each worker process its own.

Determinism. eSpeak NG's output depends on more than its input: its noise generator has its own
seed, and the synthesizer carries state from one utterance into the next (the same text twice in
a row gives two waveforms, a few samples apart in length), so a clip's audio depended on which
clips its worker had rendered before it, and two clean runs of `prepare` differed. Re-initializing
the library does not reset that state. So speech is rendered in a child forked from a process
that has never synthesized (`in_pristine_child`), with the noise seed fixed: by default each
`say` is its own child; the corpus renders a whole clip in one child (a third of the forks), so a
clip's utterances follow each other from the same pristine start. Either way the same input gives
the same samples in any order, in any process.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# espeak_AUDIO_OUTPUT / espeak_PARAMETER / espeak_POSITION_TYPE values from speak_lib.h
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_PARAM_RATE, _PARAM_VOLUME, _PARAM_PITCH, _PARAM_RANGE = 1, 2, 3, 4
_POS_CHARACTER = 1
_CHARS_UTF8 = 1

_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class TTSError(RuntimeError):
    pass


@dataclass(frozen=True)
class Prosody:
    """eSpeak's own prosody knobs: pitch 0-100 (50 normal), range 0-100, rate in words/min, volume 0-200."""

    pitch: int = 50
    range: int = 50
    rate: int = 175
    volume: int = 100


@functools.cache
def _engine() -> tuple[ctypes.CDLL, int]:
    """The library, initialized once per process (the sample rate with it): initializing it again
    changes what later utterances sound like, so every Speaker of a process shares this one."""
    try:
        import espeakng_loader
    except ImportError as exc:  # pragma: no cover - it is a pinned dependency
        raise TTSError("the espeakng-loader package is not installed (pip install espeakng-loader)") from exc
    lib = ctypes.cdll.LoadLibrary(espeakng_loader.get_library_path())
    lib.espeak_Initialize.restype = ctypes.c_int
    lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
    rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, espeakng_loader.get_data_path().encode(), 0)
    if rate <= 0:
        raise TTSError(f"espeak_Initialize failed (returned {rate})")
    return lib, rate


class Speaker:
    """Synthesises text with a named eSpeak voice (e.g. 'en+f3', 'cmn+m1') at chosen prosody."""

    def __init__(self, fork: bool = True):
        self._lib, self.sample_rate = _engine()
        self._fork = fork
        self._chunks: list[np.ndarray] = []

        def _collect(wav, n, _events):
            if n > 0:
                self._chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
            return 0

        self._callback = _CALLBACK(_collect)  # keep a reference: the C side holds only a pointer

    def say(self, text: str, voice: str, prosody: Prosody, seed: int = 0) -> np.ndarray:
        """Return float32 samples in [-1, 1] at `self.sample_rate`; `seed` fixes eSpeak's noise
        generator. A forking Speaker renders in a pristine child (see the module's docstring); one
        made with `fork=False` renders here, for code already running in such a child."""
        if not self._fork:
            return self._render(text, voice, prosody, seed)
        body = in_pristine_child(lambda: self._render(text, voice, prosody, seed).tobytes(),
                                 f"rendering {text!r} with voice {voice!r}")
        return np.frombuffer(body, dtype=np.float32).copy()

    def _render(self, text: str, voice: str, prosody: Prosody, seed: int) -> np.ndarray:
        self._lib.espeak_SetSynthCallback(self._callback)
        if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise TTSError(f"eSpeak has no voice named {voice!r}")
        self._lib.espeak_ng_SetRandSeed(int(seed))
        for param, value in ((_PARAM_RATE, prosody.rate), (_PARAM_VOLUME, prosody.volume),
                             (_PARAM_PITCH, prosody.pitch), (_PARAM_RANGE, prosody.range)):
            self._lib.espeak_SetParameter(param, int(value), 0)
        self._chunks.clear()
        data = text.encode("utf-8")
        err = self._lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        self._lib.espeak_Synchronize()
        if err != 0 or not self._chunks:
            raise TTSError(f"eSpeak failed to synthesise {text!r} with voice {voice!r} (error {err})")
        return np.concatenate(self._chunks).astype(np.float32) / 32768.0


def in_pristine_child(work: Callable[[], bytes], what: str) -> bytes:
    """Run `work` in a child forked from this process and return the bytes it made. Call it from a
    process that has never synthesized, so every child starts from the same eSpeak state. A
    `TTSError` or any other exception in the child is raised here with its message; a child that
    dies (a signal, the OOM killer) is a TTSError naming `what` it was doing."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: send "ok" + the bytes or "er" + the message, and leave at once
        code = 0
        try:
            os.close(read_end)
            try:
                body = b"ok" + work()
            except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
                body = b"er" + (str(exc) if isinstance(exc, TTSError) else f"{what}: {exc!r}").encode()
            with os.fdopen(write_end, "wb") as fh:
                fh.write(body)
        except BaseException:  # noqa: BLE001 - a child never returns into the caller's code
            code = 1
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        body = fh.read()
    _, status = os.waitpid(pid, 0)
    if body[:2] == b"er":
        raise TTSError(body[2:].decode(errors="replace"))
    if body[:2] != b"ok" or status != 0:
        raise TTSError(f"the eSpeak NG process {what} died (wait status {status})")
    return body[2:]
