"""The featurize stage: every manifest clip -> `features/{id}.npz` (log-mel + prosody) and a table.

Files are written one by one (atomically), so an interrupted run resumes where it stopped;
clips that cannot be read are skipped and reported with the reason, never fatal.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections import OrderedDict
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from ..config import Params
from ..fanout import fan_out
from ..numba_cache import ensure_warm
from .audio_io import AudioError, read_audio
from .features import PROSODY_KEYS, clip_log_mel, prosody
from .manifest import manifest_path, read_manifest
from .synthetic import SPLITS


def features_dir(processed_dir: str | os.PathLike) -> Path:
    return Path(processed_dir) / "features"


def load_clip_features(processed_dir: str | os.PathLike, clip_id: str) -> tuple[np.ndarray, np.ndarray]:
    """(log-mel float32 (n_mels, frames), prosody float32 in PROSODY_KEYS order) of one clip."""
    with np.load(features_dir(processed_dir) / f"{clip_id}.npz") as z:
        return z["mel"].astype(np.float32), z["prosody"].astype(np.float32)


class KeptMels:
    """Clips' log-mels (`load_clip_features`) kept across a process's jobs, the least recently used
    dropped past `max_bytes`: a sweep's configurations caption the same clips, so each clip's file
    is read once, not once per configuration. Shared: every caption of the clip gets the same
    array, which callers do not change."""

    def __init__(self, processed_dir: str | os.PathLike, max_bytes: int):
        self.processed_dir, self.max_bytes, self.nbytes = processed_dir, max_bytes, 0
        self._kept: OrderedDict[str, np.ndarray] = OrderedDict()

    def get(self, clip_id: str) -> np.ndarray:
        if clip_id in self._kept:
            self._kept.move_to_end(clip_id)
            return self._kept[clip_id]
        mel, _ = load_clip_features(self.processed_dir, clip_id)
        self._kept[clip_id] = mel
        self.nbytes += mel.nbytes
        while self.nbytes > self.max_bytes and self._kept:
            self.nbytes -= self._kept.popitem(last=False)[1].nbytes
        return mel


def write_npz(path: Path, **arrays: np.ndarray) -> None:
    """Like np.savez, but byte-identical for identical arrays (np.savez stamps the current time
    into the zip, so DVC would see new features and retrain on every run), and atomic."""
    tmp = path.with_name(path.name + ".part")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zf:
        for name, arr in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arr), allow_pickle=False)
            zf.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buf.getvalue())
    os.replace(tmp, path)


def _featurize_one(item: tuple[str, str], out_dir: Path, fparams, max_seconds: float) -> dict:
    clip_id, path = item
    out = out_dir / f"{clip_id}.npz"
    if out.exists():
        try:
            with np.load(out) as z:
                mel, pros = z["mel"], z["prosody"]
                if mel.shape[0] == fparams.n_mels and len(pros) == len(PROSODY_KEYS):
                    return {"id": clip_id, "frames": int(mel.shape[1]), **dict(zip(PROSODY_KEYS, map(float, pros)))}
        except (OSError, ValueError, KeyError):
            pass  # a damaged file from a crash: compute it again
    try:
        clip = read_audio(path, max_seconds=max_seconds, target_sr=fparams.sample_rate)
    except AudioError as exc:
        return {"id": clip_id, "skip": exc.problem, "path": str(path)}
    mel = clip_log_mel(clip.samples, fparams)
    pros = prosody(clip.samples, sr=fparams.sample_rate)
    # float16 halves the disk; log-mel values live in about [-1, 3], well inside its precision
    write_npz(out, mel=mel.astype(np.float16), prosody=np.array([pros[k] for k in PROSODY_KEYS], np.float32))
    return {"id": clip_id, "frames": int(mel.shape[1]), **pros}


def featurize(params: Params, progress: bool = True) -> dict:
    f = params.features
    processed = Path(params.data.processed_dir)
    items: dict[str, str] = {}
    for split in SPLITS:
        for lang in params.data.languages:
            mp_ = manifest_path(processed, split, lang)
            if mp_.exists():
                for rec in read_manifest(mp_):
                    items.setdefault(rec["id"], rec["path"])
    if not items:
        raise FileNotFoundError(f"{processed / 'manifests'}: no manifests found; run the prepare stage first")
    out_dir = features_dir(processed)
    out_dir.mkdir(parents=True, exist_ok=True)
    work = partial(_featurize_one, out_dir=out_dir, fparams=f, max_seconds=params.data.max_clip_seconds)
    rows, skips = [], []
    todo = sorted(items.items())
    bar = tqdm(total=len(todo), desc="featurize", unit="clip", disable=not progress)
    workers = min(f.workers, len(todo))
    # compile librosa's numba functions here, once, before any worker could race to (numba_cache)
    ensure_warm()
    # each clip's file is written by its worker as it finishes: a worker's death loses no finished clip
    for r in fan_out(work, todo, workers if workers > 1 else 0, stage="featurize",
                     key=lambda item: f"clip {item[0]} ({item[1]})"):
        (skips if "skip" in r else rows).append(r)
        bar.update()
    bar.close()
    table = pd.DataFrame(rows).sort_values("id").reset_index(drop=True)
    table.to_parquet(out_dir.parent / "features.parquet", index=False)
    report = {"clips": len(rows), "skipped": sorted(skips, key=lambda s: s["id"]), "sample_rate": f.sample_rate,
              "n_mels": f.n_mels, "n_fft": f.n_fft, "hop_length": f.hop_length,
              "mean_frames": float(table["frames"].mean()) if len(table) else 0.0}
    (processed / "featurize_report.json").write_text(json.dumps(report, ensure_ascii=False, indent=1), encoding="utf-8")
    return report
