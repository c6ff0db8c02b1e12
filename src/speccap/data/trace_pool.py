"""A trace pool: unlabeled speech the gates and the WISV head learn from on real data.

Any folder of audio (MER2024's train or unlabeled clips extracted to 16 kHz mono, or other speech),
searched recursively. Each file goes to train or validation by a hash of its name, so adding files
never moves the others. Names that are also referenced test clips are left out: the test set is never
trained on. The clips carry no references; the trace_refs stage gives them the cloud-only caption.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .audio_io import AudioError
from .mer2024 import AUDIO_EXTS, VIDEO_EXTS, usable_wav

PARAM = "data.trace_pool.path"
ID_PREFIX = "pool-"


class TracePoolError(ValueError):
    pass


@dataclass
class PoolClip:
    clip_id: str
    split: str  # train | val
    source_path: Path
    wav_path: Path
    duration: float
    notes: list[str]


def name_hash(name: str) -> float:
    """A name's place in [0, 1): the split follows from the name alone (stable across runs and machines)."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big") / 2**64


def assign_splits(names: list[str], val_share: float) -> dict[str, str]:
    """val below `val_share`, train above; a pool small enough to leave a split empty gives it the
    nearest name, so both splits always hold a clip."""
    if len(names) < 2:
        raise TracePoolError(f"{PARAM}: a trace pool needs at least 2 usable clips (train and validation), "
                             f"has {len(names)}")
    order = sorted(names, key=name_hash)
    split = {n: "val" if name_hash(n) < val_share else "train" for n in names}
    if "val" not in split.values():
        split[order[0]] = "val"
    if "train" not in split.values():
        split[order[-1]] = "train"
    return split


def pool_files(root: Path) -> list[Path]:
    exts = AUDIO_EXTS + VIDEO_EXTS
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in exts)


def load_trace_pool(root: str | Path, val_share: float, wav_dir: Path, max_seconds: float,
                    exclude: set[str] = frozenset()) -> tuple[list[PoolClip], list[dict]]:
    """Usable clips of the pool with their split, and a skip record for each unusable file."""
    root = Path(root)
    if not root.is_dir():
        raise TracePoolError(f"{PARAM}: trace pool folder {root} not found")
    clips, skips = [], []
    seen: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        for media in pool_files(root):
            name = str(media.relative_to(root).with_suffix("")).replace("/", "__")
            if media.stem in exclude or name in exclude:
                skips.append({"id": ID_PREFIX + name, "reason": "a referenced test clip (never trained on)"})
                continue
            if name in seen:  # the same clip as audio and video: the first (audio) is kept
                continue
            seen.add(name)
            try:
                out, seconds, notes = usable_wav(media, ID_PREFIX + name, wav_dir, Path(tmp), max_seconds)
            except AudioError as exc:
                skips.append({"id": ID_PREFIX + name, "reason": exc.problem, "path": str(media)})
                continue
            clips.append(PoolClip(ID_PREFIX + name, "", media, out, seconds, notes))
    if not clips:
        raise TracePoolError(f"{PARAM}: no usable audio under {root} ({len(skips)} file(s) skipped; "
                             f"first: {skips[:1]}); it takes {', '.join(AUDIO_EXTS + VIDEO_EXTS)} files")
    split = assign_splits([c.clip_id for c in clips], val_share)
    for c in clips:
        c.split = split[c.clip_id]
    return clips, skips
