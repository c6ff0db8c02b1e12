"""The MER2024 caption subset from a local copy (EULA: the code never downloads it).

Layout as the organisers ship it: `final-EMER-reason.csv` with columns `name,chinese,english`,
and audio `{name}.wav` (16 kHz mono) beside it or under `audio/` / `wav/`. Video files
(`{name}.mp4|avi|mkv`, beside it or under `video/`) are accepted when ffmpeg is installed.
The references describe video, audio and subtitles; `audio_only` keeps the audio part.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .audio_io import AudioError, read_audio, write_wav

CSV_NAME = "final-EMER-reason.csv"
COLUMNS = ("name", "chinese", "english")
AUDIO_DIRS = ("", "audio", "wav")
VIDEO_DIRS = ("", "video")
VIDEO_EXTS = (".mp4", ".avi", ".mkv")
AUDIO_EXTS = (".wav", ".flac", ".ogg")  # what libsndfile reads
PARAM = "data.mer2024.path"

_OTHER_MODALITY = re.compile(r"^(in the (video|text|subtitles?|image|scene|visuals?)\b|the (subtitles?|text|video)\b)", re.I)


class Mer2024Error(ValueError):
    pass


def audio_part_zh(reference: str) -> str | None:
    """The `；`-separated segment that talks about the audio (contains 在音频中)."""
    for seg in reference.split("；"):
        if "在音频中" in seg:
            return seg.strip()
    return None


def audio_part_en(reference: str) -> str | None:
    """The sentences from 'In the audio' onwards, up to one that turns to another modality."""
    m = re.search(r"in the audio", reference, re.I)
    if not m:
        return None
    sentences = re.split(r"(?<=[.!?])\s+", reference[m.start():].strip())
    kept = [sentences[0]]
    for s in sentences[1:]:
        if _OTHER_MODALITY.match(s):
            break
        kept.append(s)
    return " ".join(kept).strip()


def select_reference(text: str, language: str, mode: str) -> str | None:
    text = (text or "").strip() if isinstance(text, str) else ""
    if not text:
        return None
    if mode == "full":
        return text
    return audio_part_zh(text) if language == "zh" else audio_part_en(text)


@dataclass
class MerClip:
    name: str
    source_path: Path
    wav_path: Path
    duration: float
    references: dict[str, str]
    notes: list[str]


def mer2024_root(path: str | None) -> Path:
    """The MER2024 folder params name (data.mer2024.path), or the error that it is not set."""
    if not path:
        raise Mer2024Error(f"{PARAM}: not set; point it at your local MER2024 copy")
    return Path(path)


def read_caption_table(root: Path) -> pd.DataFrame:
    if not root.is_dir():
        raise Mer2024Error(f"{PARAM}: MER2024 folder {root} not found (point params at your local copy)")
    csv = root / CSV_NAME
    if not csv.is_file():
        raise Mer2024Error(f"{csv}: caption file not found in the MER2024 folder ({PARAM})")
    try:
        table = pd.read_csv(csv, encoding="utf-8-sig", dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
        raise Mer2024Error(f"{csv}: not a readable CSV ({exc})") from None
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise Mer2024Error(f"{csv}: missing column(s) {', '.join(missing)} (expected {', '.join(COLUMNS)})")
    return table


def find_media(root: Path, name: str) -> Path | None:
    for sub in AUDIO_DIRS:
        p = root / sub / f"{name}.wav"
        if p.is_file():
            return p
    for sub in VIDEO_DIRS:
        for ext in VIDEO_EXTS:
            p = root / sub / f"{name}{ext}"
            if p.is_file():
                return p
    return None


def _audio_from_video(video: Path, tmp_dir: Path) -> Path:
    if shutil.which("ffmpeg") is None:
        raise AudioError(video, "video file, and ffmpeg is not installed to extract its audio")
    out = tmp_dir / (video.stem + ".wav")
    proc = subprocess.run(["ffmpeg", "-nostdin", "-y", "-loglevel", "error", "-i", str(video),
                           "-vn", "-ar", "16000", "-ac", "1", str(out)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise AudioError(video, f"ffmpeg could not extract audio: {proc.stderr.strip()[:200]}")
    return out


def usable_wav(media: Path, name: str, wav_dir: Path, tmp_dir: Path, max_seconds: float) -> tuple[Path, float, list[str]]:
    """A media file as later stages read it: a 16 kHz mono WAV used in place, or a normalised copy
    `wav_dir/{name}.wav` (video, another rate or layout, trimmed); its seconds and what was done."""
    wav = _audio_from_video(media, tmp_dir) if media.suffix.lower() not in AUDIO_EXTS else media
    clip = read_audio(wav, max_seconds=max_seconds)
    out = media
    if media.suffix.lower() != ".wav" or clip.notes:
        out = wav_dir / f"{name}.wav"
        write_wav(out, clip.samples)
    return out, round(clip.seconds, 3), clip.notes


def load_mer2024(root: str | Path, languages: tuple[str, ...], mode: str, wav_dir: Path,
                 max_seconds: float) -> tuple[list[MerClip], list[dict]]:
    """Validate a local MER2024 copy; return usable clips and a skip record for each unusable one."""
    root = Path(root)
    table = read_caption_table(root)
    clips: list[MerClip] = []
    skips: list[dict] = []
    column = {"en": "english", "zh": "chinese"}
    with tempfile.TemporaryDirectory() as tmp:
        for row in table.itertuples(index=False):
            name = str(row.name).strip()
            if not name:
                skips.append({"id": "", "reason": "empty name in caption file"})
                continue
            refs = {}
            for lang in languages:
                ref = select_reference(getattr(row, column[lang]), lang, mode)
                if ref:
                    refs[lang] = ref
            if not refs:
                why = "empty reference" if mode == "full" else f"no audio part in the reference ({mode})"
                skips.append({"id": name, "reason": why})
                continue
            media = find_media(root, name)
            if media is None:
                skips.append({"id": name, "reason": f"no audio file {name}.wav (or video) under {root}"})
                continue
            try:
                out, seconds, notes = usable_wav(media, name, wav_dir, Path(tmp), max_seconds)
            except AudioError as exc:
                skips.append({"id": name, "reason": exc.problem, "path": str(media)})
                continue
            clips.append(MerClip(name, media, out, seconds, refs, notes))
    if not clips:
        raise Mer2024Error(f"{root}: no usable clip in {CSV_NAME} ({len(skips)} skipped; first: {skips[:1]})")
    return clips, skips
