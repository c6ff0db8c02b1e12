"""What the train and validation clips' corrections are judged against: the `trace_refs` stage.

Traces, gates, the verification-rank choice, promotion and the WISV head all score a caption
against a clip's references. A clip of a trace pool has none (unlabeled speech), and with
`data.trace_references: cloud` no clip's human references are used: there the cloud-only caption
is the reference, and the emotion it names is the clip's emotion. This stage writes the clips as
those consumers read them, `<data.processed_dir>/trace_refs/<split>.<lang>.jsonl`, so every one of them judges
against the same references. The cloud captions are kept per clip under the models' fingerprint,
so an interrupted run resumes and a new cloud captions again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tqdm import tqdm

from ..config import Params
from ..data.emotions import detect_emotion
from ..data.manifest import ManifestError, read_jsonl, write_jsonl
from ..tracking import Tracker
from . import splits, sweep, workers
from .splits import SPLITS, split_records

REPORT = Path("reports/trace_refs.json")


def refs_dir(params: Params) -> Path:
    return Path(params.data.processed_dir) / "trace_refs"


def refs_path(params: Params, split: str, language: str) -> Path:
    return refs_dir(params) / f"{split}.{language}.jsonl"


def needs_cloud(params: Params, rec: dict) -> bool:
    return params.data.trace_references == "cloud" or not rec["references"]


def captions_dir(params: Params) -> Path:
    """Where the cloud captions go, one file per split and language, under the models' fingerprint
    (resumable; computed once per call: it hashes the embedded models' weights)."""
    return refs_dir(params) / "cloud_captions" / sweep.models_fingerprint(params)


def _captioned(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    return {r["id"]: r for r in read_jsonl(path, tolerate_partial_last_line=True) if "error" not in r}


def _cloud_todo(params: Params, split: str, language: str) -> tuple[list[dict], list[dict]]:
    """The split's manifest records, and those that take the cloud's caption."""
    recs = split_records(params, split, language)
    return recs, [r for r in recs if needs_cloud(params, r)]


def build_trace_refs(params: Params, pool: workers.Pool | None, progress=None) -> dict:
    """Write every train and validation clip with the references it is judged against; `pool`
    (workers holding the models) captions those that take the cloud's and are not captioned yet.
    Returns the stage's report."""
    keep = captions_dir(params)
    for old in (refs_dir(params) / "cloud_captions").glob("*"):  # other models' captions are never read again
        if old != keep:
            shutil.rmtree(old)
    report = {"trace_references": params.data.trace_references, "models": keep.name,
              "cross_fit_folds": params.data.cross_fit.folds if splits.active(params) else None, "splits": {}}
    for split in SPLITS:
        for lang in params.data.languages:
            recs, todo = _cloud_todo(params, split, lang)
            cap_path = keep / f"{split}.{lang}.jsonl"
            made = _captioned(cap_path)
            missing = [r for r in todo if r["id"] not in made]
            if missing:
                if pool is None:
                    raise ValueError(f"{cap_path}: {len(missing)} clip(s) take the cloud's caption, and no worker "
                                     "pool was given to caption them")
                records = sweep.run_config(sweep.RunConfig("cloud", lang), todo, pool, cap_path, progress)
                failed = [r for r in records if "error" in r]
                if failed:
                    raise RuntimeError(f"{len(failed)} {split}.{lang} clip(s) could not be captioned by the cloud "
                                       f"(the others are kept); first: {failed[0]['id']}: {failed[0]['error']}")
                made = {r["id"]: r for r in records}
            made = {r["id"]: made[r["id"]] for r in todo}
            out, agree, human = [], 0, 0
            for r in recs:
                if r["id"] not in made:
                    out.append(r | {"references_from": "human"})
                    continue
                caption = made[r["id"]]["caption"]
                emotion = detect_emotion(caption, lang)
                if r["references"]:  # human references exist too: how often the cloud names their emotion
                    human += 1
                    agree += int(emotion is not None and emotion == r.get("emotion"))
                out.append(r | {"references": [caption] if caption.strip() else [], "emotion": emotion,
                                "references_from": "cloud"})
            empty = [r["id"] for r in out if not r["references"]]
            out = [r for r in out if r["references"]]  # an empty cloud caption judges nothing
            write_jsonl(refs_path(params, split, lang), out)
            report["splits"][f"{split}.{lang}"] = {
                "clips": len(out), "cloud_referenced": len(made) - len(empty), "empty_cloud_captions": len(empty),
                "cloud_emotion_named": sum(r["emotion"] is not None for r in out if r["references_from"] == "cloud"),
                "cloud_emotion_agrees_with_human": (agree / human) if human else None}
    return report


def count_cloud_captions(params: Params) -> int:
    """How many clips the stage still has to caption with the cloud (its progress bar's total; 0: no
    workers needed)."""
    n, cap_dir = 0, captions_dir(params)
    for split in SPLITS:
        for lang in params.data.languages:
            _, todo = _cloud_todo(params, split, lang)
            made = _captioned(cap_dir / f"{split}.{lang}.jsonl")
            n += sum(r["id"] not in made for r in todo)
    return n


def training_clips(params: Params, split: str, language: str) -> list[dict]:
    """A train or validation split's clips with the references they are judged against."""
    path = refs_path(params, split, language)
    if not path.exists():
        raise ManifestError(f"{path}: not found (run the trace_refs stage: dvc repro trace_refs)")
    return read_jsonl(path)


def run_trace_refs(params: Params, params_path: str | None) -> dict:
    """The `trace_refs` stage, start to end: the clips written with their references (the cloud
    captioning those that need it), the counts to reports/trace_refs.json and to MLflow."""
    total = count_cloud_captions(params)
    pool = workers.Pool.for_stage(params, params_path, "trace_refs") if total else None
    try:
        with tqdm(total=total, desc="cloud references", unit="clip", disable=not total) as bar:
            report = build_trace_refs(params, pool, progress=bar.update)
    finally:
        if pool is not None:
            pool.close()
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(report, indent=1))
    tracker = Tracker.for_stage(params.tracking.uri, params.tracking.experiment, "trace_refs")
    key = f"trace-refs-{report['models']}-{params.data.trace_references}"
    with tracker.sweep(key, {"trace_references": params.data.trace_references}, {"sweep_key": key,
                                                                                 "stage": "trace_refs"}) as parent:
        for name, stats in report["splits"].items():
            tracker.log_config(parent, f"{key}-{name}", f"trace-refs-{name}", {"split": name},
                               {k: v for k, v in stats.items() if v is not None})
    return report
