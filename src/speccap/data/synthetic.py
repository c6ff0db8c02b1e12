"""The embedded default corpus: emotional speech rendered with eSpeak NG, captioned from its cues.

Every clip is a pure function of (seed, spoken language, split, index): its own random stream
picks emotion, speaker, sentence and cue values, renders the speech and writes the references.
So the corpus is deterministic, renders in parallel in any order, and a rerun skips clips whose
WAV is already on disk. Rendering forks once per clip (POSIX only); call it from single-threaded
worker processes, as `prepare` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from . import effects
from .audio_io import TARGET_SR, write_wav
from .captions import Cues, write_references
from .emotions import EMOTIONS, PROFILES
from .sentences import SENTENCES
from .tts import Prosody, Speaker, in_pristine_child

SPLITS = ("train", "val", "test")
SPEECH_LANGUAGES = ("en", "zh")

# (eSpeak voice, gender, pitch offset of this speaker on eSpeak's 0-100 scale)
VOICES = {
    "en": (("en+m1", "male", -2), ("en+m3", "male", 2), ("en-us+m2", "male", 0), ("en-us+m7", "male", -4),
           ("en+f2", "female", 0), ("en+f4", "female", 3), ("en-us+f1", "female", -2), ("en-us+f3", "female", 2)),
    "zh": (("cmn+m1", "male", -2), ("cmn+m3", "male", 2), ("cmn+m2", "male", 0), ("cmn+m7", "male", -4),
           ("cmn+f2", "female", 0), ("cmn+f4", "female", 3), ("cmn+f1", "female", -2), ("cmn+f3", "female", 2)),
}

# How far the second part of a clip moves from the first for a rising contour (falling: the reverse)
_CONTOUR_DELTA = {"pitch": 16.0, "volume": 30.0, "rate": 24.0}


@dataclass(frozen=True)
class ClipPlan:
    clip_id: str
    speech_language: str
    split: str
    index: int
    seed: int
    cue_spread: float = 1.0

    @property
    def rng_key(self) -> list[int]:
        return [self.seed, SPEECH_LANGUAGES.index(self.speech_language), SPLITS.index(self.split), self.index]


def plan_corpus(seed: int, sizes: dict[str, int], languages=SPEECH_LANGUAGES, cue_spread: float = 1.0) -> list[ClipPlan]:
    return [ClipPlan(f"syn-{lang}-{split}-{i:05d}", lang, split, i, seed, cue_spread)
            for lang in languages for split in SPLITS for i in range(sizes[split])]


def _draw(rng: np.random.Generator, mean_std: tuple[float, float], lo: float, hi: float, spread: float = 1.0) -> float:
    return float(np.clip(rng.normal(mean_std[0], mean_std[1] * spread), lo, hi))


def _effect(rng: np.random.Generator, spec: tuple[float, float, float]) -> float:
    p, lo, hi = spec
    return round(float(rng.uniform(lo, hi)), 3) if rng.random() < p else 0.0


def sample_cues(plan: ClipPlan, rng: np.random.Generator) -> Cues:
    emotion = EMOTIONS[int(rng.integers(len(EMOTIONS)))]
    prof = PROFILES[emotion]
    voice, gender, offset = VOICES[plan.speech_language][int(rng.integers(len(VOICES[plan.speech_language])))]
    text_en, text_zh = SENTENCES[int(rng.integers(len(SENTENCES)))]
    contours = list(prof.contour_probs)
    contour = contours[int(rng.choice(len(contours), p=list(prof.contour_probs.values())))]
    return Cues(
        emotion=emotion, gender=gender, voice=voice, speech_language=plan.speech_language,
        text_en=text_en, text_zh=text_zh,
        pitch=round(_draw(rng, prof.pitch, 5, 95, plan.cue_spread) + offset, 1),
        pitch_range=round(_draw(rng, prof.range, 5, 99, plan.cue_spread), 1),
        rate=round(_draw(rng, prof.rate, 90, 280, plan.cue_spread), 1),
        volume=round(_draw(rng, prof.volume, 40, 190, plan.cue_spread), 1),
        contour=contour,
        tremor=_effect(rng, prof.tremor), breathiness=_effect(rng, prof.breathy),
        harshness=_effect(rng, prof.harsh),
        pauses=int(rng.choice(3, p=list(prof.pause_probs))),
        noise_db=round(float(rng.uniform(-45, -25)), 1),
    )


def _segments(text: str, language: str, n: int) -> list[str]:
    """Split the sentence into `n` phrases at word (en) or character (zh) boundaries."""
    units = text.split() if language == "en" else list(text)
    n = max(1, min(n, len(units)))
    cuts = np.linspace(0, len(units), n + 1).round().astype(int)
    sep = " " if language == "en" else ""
    return [sep.join(units[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]


def _segment_prosody(c: Cues, n: int) -> list[Prosody]:
    sign = {"steady": 0.0, "rising": 1.0, "falling": -1.0}[c.contour]
    out = []
    for k in range(n):
        f = (k / (n - 1) - 0.5) if n > 1 else 0.0  # -0.5 .. 0.5 along the clip
        out.append(Prosody(
            pitch=int(np.clip(c.pitch + sign * f * _CONTOUR_DELTA["pitch"], 0, 100)),
            range=int(np.clip(c.pitch_range, 0, 100)),
            rate=int(np.clip(c.rate + sign * f * _CONTOUR_DELTA["rate"], 80, 450)),
            volume=int(np.clip(c.volume + sign * f * _CONTOUR_DELTA["volume"], 0, 200)),
        ))
    return out


def render(c: Cues, speaker: Speaker, rng: np.random.Generator) -> np.ndarray:
    """Speech for the cues, 16 kHz mono float32."""
    text = c.text_en if c.speech_language == "en" else c.text_zh
    n_seg = 2 + c.pauses
    parts = _segments(text, c.speech_language, n_seg)
    prosodies = _segment_prosody(c, len(parts))
    sr = speaker.sample_rate
    long_gaps = set(rng.choice(np.arange(1, len(parts)), size=min(c.pauses, len(parts) - 1), replace=False).tolist()) \
        if len(parts) > 1 else set()
    pieces = [np.zeros(int(sr * rng.uniform(0.1, 0.3)), np.float32)]
    for k, (words, pros) in enumerate(zip(parts, prosodies)):
        if k > 0:
            gap = rng.uniform(0.35, 0.7) if k in long_gaps else rng.uniform(0.03, 0.08)
            pieces.append(np.zeros(int(sr * gap), np.float32))
        pieces.append(speaker.say(words, c.voice, pros))
    pieces.append(np.zeros(int(sr * rng.uniform(0.1, 0.3)), np.float32))
    x = soxr.resample(np.concatenate(pieces), sr, TARGET_SR).astype(np.float32)
    x = effects.harshness(x, c.harshness)
    x = effects.tremor(x, TARGET_SR, c.tremor, rate_hz=float(rng.uniform(5, 8)), phase=float(rng.uniform(0, 6.28)))
    x = effects.breathiness(x, TARGET_SR, c.breathiness, rng)
    x = effects.background_noise(x, c.noise_db, rng)
    peak = float(np.max(np.abs(x)))
    if peak > 0.98:  # keep loud clips loud but unclipped
        x *= 0.98 / peak
    return x


def render_to_file(c: Cues, rng_key: list[int], path: Path) -> float:
    """Render the clip and write its WAV; returns its seconds. A pure function of the cues and the
    seed, whatever order or worker renders it: the whole clip is rendered in one child forked
    from a process that never synthesized, with eSpeak's noise seed fixed (see tts)."""
    body = in_pristine_child(lambda: render(c, Speaker(fork=False), np.random.default_rng(rng_key)).tobytes(),
                             f"rendering clip {path.stem}")
    write_wav(path, np.frombuffer(body, dtype=np.float32))
    return sf.info(str(path)).duration


def make_clip(plan: ClipPlan, wav_dir: Path, references_per_clip: int) -> dict:
    """Render one clip (unless its WAV exists) and return its corpus record (both caption languages)."""
    rng = np.random.default_rng(plan.rng_key)
    cues = sample_cues(plan, rng)
    refs = {lang: write_references(cues, lang, references_per_clip, rng) for lang in ("en", "zh")}
    # The audio draws from its own stream so that captions do not depend on rendering details.
    audio_key = plan.rng_key + [1]
    path = wav_dir / f"{plan.clip_id}.wav"
    duration = sf.info(str(path)).duration if path.exists() else render_to_file(cues, audio_key, path)
    return {
        "id": plan.clip_id, "path": str(path), "duration": round(duration, 3), "split": plan.split,
        "source": "synthetic", "speech_language": plan.speech_language, "emotion": cues.emotion,
        "speaker": cues.voice, "gender": cues.gender, "cues": cues.to_dict(), "references": refs,
    }
