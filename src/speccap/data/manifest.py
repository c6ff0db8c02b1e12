"""Manifests: one JSON line per clip, one file per (split, caption language).

A record: id, path (16 kHz mono WAV), duration, split, language (of the references),
speech_language, emotion (or null), cues (values rendered, empty for real data), references
(non-empty list of non-empty strings; empty only with references_from "cloud": a trace pool clip
that the trace_refs stage captions with the cloud), notes (what loading did to the input).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

REQUIRED = ("id", "path", "duration", "split", "language", "references")


class ManifestError(ValueError):
    pass


def manifest_path(processed_dir: str | os.PathLike, split: str, language: str) -> Path:
    return Path(processed_dir) / "manifests" / f"{split}.{language}.jsonl"


def write_jsonl(path: str | os.PathLike, records: list[dict]) -> None:
    """Write all records to a temporary file, then rename: readers never see half a manifest."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    with tmp.open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def append_jsonl(path: str | os.PathLike, record: dict) -> None:
    """Append one record and flush it: progress written as it goes survives a crash."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        fh.flush()


def read_jsonl(path: str | os.PathLike, tolerate_partial_last_line: bool = False) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"{path}: file not found")
    out = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if tolerate_partial_last_line and n == len(lines):
                break  # a crash mid-write leaves at most one broken last line
            raise ManifestError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
    return out


def validate_record(rec: dict, where: str) -> None:
    missing = [k for k in REQUIRED if k not in rec]
    if missing:
        raise ManifestError(f"{where}: record lacks field(s) {', '.join(missing)}")
    refs = rec["references"]
    if rec.get("references_from") == "cloud" and refs == []:
        return  # a trace pool clip: its reference is the cloud's caption (the trace_refs stage)
    if not isinstance(refs, list) or not refs or not all(isinstance(r, str) and r.strip() for r in refs):
        raise ManifestError(f"{where}: clip {rec['id']!r} has no non-empty reference caption")


def read_manifest(path: str | os.PathLike) -> list[dict]:
    records = read_jsonl(path)
    for n, rec in enumerate(records, 1):
        validate_record(rec, f"{path}:{n}")
    return records
