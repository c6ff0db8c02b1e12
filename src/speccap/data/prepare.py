"""The prepare stage: corpus (synthetic or MER2024) -> 16 kHz mono WAVs + manifests + a skip report."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from functools import partial
from pathlib import Path

from tqdm import tqdm

from ..config import Params
from ..fanout import fan_out
from .manifest import append_jsonl, manifest_path, read_jsonl, write_jsonl
from .mer2024 import load_mer2024, mer2024_root
from .synthetic import SPLITS, make_clip, plan_corpus
from .trace_pool import load_trace_pool


def _language_view(corpus: list[dict], language: str) -> list[dict]:
    """Records as one caption language sees them: clips spoken in it, references in it."""
    out = []
    for rec in corpus:
        if rec.get("speech_language") not in (None, language) or language not in rec["references"]:
            continue
        view = {k: v for k, v in rec.items() if k != "references"}
        view["language"] = language
        view["references"] = rec["references"][language]
        out.append(view)
    return out


def prepare_synthetic(params: Params, progress: bool = True) -> dict:
    syn = params.data.synthetic
    sizes = {"train": syn.train_per_language, "val": syn.val_per_language, "test": syn.test_per_language}
    plans = plan_corpus(params.seed, sizes, params.data.languages, syn.cue_spread)
    raw = Path(params.data.raw_dir) / "synthetic"
    wav_dir = raw / "wav"
    # WAVs on disk are reused only if they were rendered under the same corpus design
    design = raw / "design.json"
    want = json.dumps({"seed": params.seed, "cue_spread": syn.cue_spread})
    if design.exists() and design.read_text() != want:
        shutil.rmtree(wav_dir, ignore_errors=True)
        (raw / "corpus.partial.jsonl").unlink(missing_ok=True)
    wav_dir.mkdir(parents=True, exist_ok=True)
    design.write_text(want)
    # Records are appended as clips finish, so an interrupted run keeps its work; clips whose
    # WAV exists are not rendered again.
    journal = raw / "corpus.partial.jsonl"
    done = {r["id"]: r for r in (read_jsonl(journal, tolerate_partial_last_line=True) if journal.exists() else [])}
    todo = [p for p in plans if p.clip_id not in done]
    work = partial(make_clip, wav_dir=wav_dir, references_per_clip=syn.references_per_clip)
    workers = max(1, min(syn.workers, len(todo)))
    bar = tqdm(total=len(plans), initial=len(plans) - len(todo), desc="render corpus", unit="clip",
               disable=not progress)
    # Always in spawned workers: rendering forks once per clip, which is only safe in a process
    # without other threads (this one may be running Prefect's).
    for rec in fan_out(work, todo, workers, stage="prepare", key=lambda p: f"clip {p.clip_id}"):
        append_jsonl(journal, rec)
        done[rec["id"]] = rec
        bar.update()
    bar.close()
    corpus = [done[p.clip_id] for p in plans]
    write_jsonl(raw / "corpus.jsonl", corpus)
    journal.unlink(missing_ok=True)
    counts = {}
    for split in SPLITS:
        for lang in params.data.languages:
            view = _language_view([r for r in corpus if r["split"] == split], lang)
            write_jsonl(manifest_path(params.data.processed_dir, split, lang), view)
            counts[f"{split}.{lang}"] = len(view)
    emotions = Counter(r["emotion"] for r in corpus)
    return {"source": "synthetic", "clips": len(corpus), "manifests": counts,
            "emotions": dict(sorted(emotions.items())), "skipped": []}


def _mer_record(clip_id: str, path, duration: float, split: str, lang: str, source: str, notes: list[str],
                references: list[str], mode: str | None) -> dict:
    rec = {"id": clip_id, "path": str(path), "duration": duration, "split": split, "source": source,
           "language": lang, "speech_language": None, "emotion": None, "cues": {}, "reference_mode": mode,
           "notes": notes, "references": references}
    if not references:
        rec["references_from"] = "cloud"  # a trace pool clip: the trace_refs stage captions it with the cloud
    return rec


def prepare_mer2024(params: Params) -> dict:
    """The referenced clips as the test split; with a trace pool, its clips as train and validation.
    Clips already 16 kHz mono are used in place; data/raw/mer2024/sources.json says where every clip
    came from (and so the stage's output exists even when nothing needed converting)."""
    mer = params.data.mer2024
    raw = Path(params.data.raw_dir) / "mer2024"
    clips, skips = load_mer2024(mer2024_root(mer.path), params.data.languages, mer.reference_mode, raw / "wav",
                                params.data.max_clip_seconds)
    pool, pool_skips = [], []
    if params.data.trace_pool.path:
        tp = params.data.trace_pool
        pool, pool_skips = load_trace_pool(tp.path, tp.val_share, raw / "pool", params.data.max_clip_seconds,
                                           exclude={c.name for c in clips})
    counts = {}
    for lang in params.data.languages:
        view = []
        for c in clips:
            if lang not in c.references:
                skips.append({"id": c.name, "reason": f"no {lang} reference"})
                continue
            view.append(_mer_record(c.name, c.wav_path, c.duration, "test", lang, "mer2024", c.notes,
                                    [c.references[lang]], mer.reference_mode))
        write_jsonl(manifest_path(params.data.processed_dir, "test", lang), view)
        counts[f"test.{lang}"] = len(view)
        for split in ("train", "val"):
            recs = [_mer_record(c.clip_id, c.wav_path, c.duration, split, lang, "trace_pool", c.notes, [], None)
                    for c in pool if c.split == split]
            path = manifest_path(params.data.processed_dir, split, lang)
            if recs:
                write_jsonl(path, recs)
                counts[f"{split}.{lang}"] = len(recs)
            else:
                path.unlink(missing_ok=True)  # a pool dropped from params leaves no stale split behind
    sources = {c.name: str(c.source_path) for c in clips} | {c.clip_id: str(c.source_path) for c in pool}
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "sources.json").write_text(json.dumps(sources, ensure_ascii=False, indent=1), encoding="utf-8")
    return {"source": "mer2024", "path": str(mer.path), "reference_mode": mer.reference_mode,
            "trace_pool": params.data.trace_pool.path, "clips": len(clips), "pool_clips": len(pool),
            "manifests": counts, "skipped": skips + pool_skips}


def prepare(params: Params, progress: bool = True) -> dict:
    """Run the prepare stage; writes data/processed/prepare_report.json and returns it."""
    if params.data.source == "synthetic":
        report = prepare_synthetic(params, progress)
    else:
        report = prepare_mer2024(params)
    out = Path(params.data.processed_dir) / "prepare_report.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, ensure_ascii=False, indent=1), encoding="utf-8")
    return report
