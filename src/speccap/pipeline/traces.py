"""Trace collection over the train and validation splits, resumable: the token gates' on-policy
traces (the `traces` stage, gating.shadow) and WISV's verified-block traces (gating.traces).

Each clip's rows are appended to `<dir>/<split>.<lang>.jsonl` as soon as it is traced, so an
interrupted run picks up where it stopped; the stage then writes one Parquet table per split
(`run_traces`: the `traces` stage start to end).
A shadow record carries its feature matrix as base64 float32 (with hidden states, JSON numbers
would be ten times larger).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import traceback
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from ..config import Params, gate_decode
from ..decoding.build import DecodeSpec, build_decoder
from ..decoding.engine import speculative
from ..decoding.link import Link
from ..tracking import Tracker
from . import sweep, workers
from .trace_refs import training_clips

TRACE_DIR = Path("data/traces")


def trace_clips(params: Params, split: str, language: str, counts=None) -> list[dict]:
    """The first clips of a split; `counts` (train_clips, val_clips; 0 = all) default to gates.traces."""
    recs = training_clips(params, split, language)
    t = counts or params.gates.traces
    n = t.train_clips if split == "train" else t.val_clips
    return recs[:n] if n else recs


def trace_settings(params: Params):
    """The token gates' on-policy traces (gating.shadow.ShadowSettings)."""
    from ..gating.shadow import ShadowSettings
    t = params.gates.traces
    return ShadowSettings(rank=params.decode.rank, critical_margin=t.critical_margin,
                          max_new_tokens=params.models.max_new_tokens,
                          entropy_temperatures=tuple(params.gates.entropy_temperatures))


def traces_key(params: Params, settings=None) -> str:
    """What a clip's trace depends on besides the clip: records with another key are traced again."""
    blob = json.dumps([dataclasses.asdict(settings or trace_settings(params)), sweep.models_fingerprint(params),
                       params.data.trace_references, *sweep.stepping_key(params)], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def shadow_one(w: workers.Worker, job: tuple) -> dict:
    """One clip's on-policy trace with `w`'s models, along the edge's own caption."""
    return _shadow_record(w, job, job[5], lambda mel, language: None)


def _shadow_record(w: workers.Worker, job: tuple, settings, committed_of) -> dict:
    """A shadow trace's record in a worker, along `committed_of(mel, language)` (None: the edge's own
    caption); errors come back as a record, for the stage to decide what a failed clip means."""
    from ..gating.shadow import shadow_caption
    clip_id, split, language, references, key, _, emotion = job
    try:
        mel = w.mel(clip_id)
        x, labels, caption = shadow_caption(w.edge, w.cloud, mel, language, references,
                                            emotion, settings, committed=committed_of(mel, language))
        return {"id": clip_id, "key": key, "split": split, "language": language, "caption": caption,
                "rows": labels, "x_shape": list(x.shape), "x": base64.b64encode(x.tobytes()).decode()}
    except Exception as exc:  # noqa: BLE001 - the stage decides what a failed clip means
        return {"id": clip_id, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


@dataclasses.dataclass(frozen=True)
class DaggerSettings:
    """A DAgger round's traces: the shadow settings, and the gate whose committed captions are traced
    (models/gates/<gate>.gate.json at `threshold` per language, verifying `verify`; `gate_sha` is
    its file's hash, so traces made under another gate are made again)."""

    rank: int
    critical_margin: float
    max_new_tokens: int
    gate: str
    threshold: dict
    verify: str
    gate_sha: str
    entropy_temperatures: tuple[float, ...] = ()


def dagger_one(w: workers.Worker, job: tuple) -> dict:
    """One clip with `w`'s models: the token-gated loop's caption under the round's gate, then its
    shadow trace along that caption (gating.shadow, `committed`)."""
    from ..gating.shadow import ShadowSettings
    d: DaggerSettings = job[5]
    spec = DecodeSpec.from_params(w.params, gate_decode(w.params), gate=d.gate, threshold=d.threshold, token=d.verify)

    def committed(mel, language):
        settings = build_decoder(spec, learned=workers.learned_gates(w))
        return speculative(w.edge, w.cloud, mel, language, settings, Link(w.params.link, seed=w.params.seed)).token_ids
    return _shadow_record(w, job, ShadowSettings(d.rank, d.critical_margin, d.max_new_tokens, d.entropy_temperatures),
                          committed)


def _frame(rec: dict) -> pd.DataFrame:
    """A clip record's rows as a table (a shadow record's features as columns x0..)."""
    df = pd.DataFrame(rec["rows"])
    if "x" in rec:
        x = np.frombuffer(base64.b64decode(rec["x"]), dtype=np.float32).reshape(rec["x_shape"])
        df = pd.concat([df, pd.DataFrame(x, columns=[f"x{k}" for k in range(x.shape[1])])], axis=1)
    return df


def clip_table(rec: dict, language: str) -> pd.DataFrame:
    """One traced clip's rows, with its clip id and language in front (the stage's table layout)."""
    df = _frame(rec)
    df.insert(0, "clip_id", rec["id"])
    df.insert(1, "language", language)
    return df


def features_of(df: pd.DataFrame) -> np.ndarray:
    """The feature matrix of a shadow trace table (columns x0.., in order)."""
    n = sum(1 for c in df.columns if c.startswith("x") and c[1:].isdigit())
    return df[[f"x{k}" for k in range(n)]].to_numpy(np.float32)


def trace_one(w: workers.Worker, job: tuple) -> dict:
    """Trace one clip with `w`'s models under the job's TraceSettings; errors come back as a record."""
    from ..gating.traces import trace_caption
    clip_id, split, language, references, key, settings, _ = job
    try:
        mel = w.mel(clip_id)
        rows, caption = trace_caption(w.edge, w.cloud, mel, language, references, settings)
        return {"id": clip_id, "key": key, "split": split, "language": language, "caption": caption, "rows": rows}
    except Exception as exc:  # noqa: BLE001 - the stage decides what a failed clip means
        return {"id": clip_id, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


def collect(params: Params, pool: workers.Pool, out_dir: Path = TRACE_DIR, progress=None, settings=None,
            counts=None) -> dict[str, pd.DataFrame]:
    """Trace every selected clip not yet on disk; return one table per split (train, val).
    `settings` (TraceSettings) and `counts` (clips per split) default to the gates' traces."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tables, errors = {}, []
    settings = settings or trace_settings(params)
    key = traces_key(params, settings)
    for split in ("train", "val"):
        frames = []
        for lang in params.data.languages:
            clips = trace_clips(params, split, lang, counts)
            path = out_dir / f"{split}.{lang}.jsonl"
            done = {}
            if path.exists():
                for line in path.read_text(encoding="utf-8").splitlines():
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a line torn by a crash: that clip is traced again
                    if rec.get("key") == key:  # traced under other settings or models: again
                        done[rec["id"]] = rec
                path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in done.values()),
                                encoding="utf-8")
            jobs = [(c["id"], split, lang, c["references"], key, settings, c.get("emotion"))
                    for c in clips if c["id"] not in done]
            with open(path, "a", encoding="utf-8") as fh:
                for rec in pool.imap(jobs):
                    if "error" in rec:
                        errors.append(rec)
                    else:
                        fh.write(json.dumps(rec, ensure_ascii=False, default=float) + "\n")
                        fh.flush()
                        done[rec["id"]] = rec
                    if progress is not None:
                        progress()
            sweep.settle_log(path, [c["id"] for c in clips])
            frames += [clip_table(done[c["id"]], lang) for c in clips if c["id"] in done]
        tables[split] = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if errors:
        raise RuntimeError(f"{len(errors)} clip(s) could not be traced (the others are kept); first: "
                           f"{errors[0]['id']}: {errors[0]['error']}")
    return tables


def summary(tables: dict[str, pd.DataFrame]) -> dict:
    """Per split: clips, tokens, the mismatch rate and what the judged mismatches are worth."""
    if any("first_reject" not in df.columns for df in tables.values() if len(df)):
        return shadow_summary(tables)
    out = {}
    for split, df in tables.items():
        judged = df[df["first_reject"]] if len(df) else df
        out[split] = {"clips": int(df["clip_id"].nunique()) if len(df) else 0, "tokens": int(len(df)),
                      "mismatch_rate": float(df["mismatch"].mean()) if len(df) else 0.0,
                      "judged_mismatches": int(len(judged)),
                      "critical_share_of_judged": float(judged["critical"].mean()) if len(judged) else 0.0,
                      "mean_impact": float(judged["impact"].mean()) if len(judged) else 0.0}
    return out


def shadow_summary(tables: dict[str, pd.DataFrame]) -> dict:
    out = {}
    for split, df in tables.items():
        judged = df[df["mismatch"]] if len(df) else df
        out[split] = {"clips": int(df["clip_id"].nunique()) if len(df) else 0, "tokens": int(len(df)),
                      "mismatch_rate": float(df["mismatch"].mean()) if len(df) else 0.0,
                      "critical_rate": float(df["critical"].mean()) if len(df) else 0.0,
                      "judged_mismatches": int(len(judged)),
                      "critical_share_of_judged": float(judged["critical"].mean()) if len(judged) else 0.0,
                      "mean_impact": float(judged["impact"].mean()) if len(judged) else 0.0,
                      "mean_emotion_gain": float(judged["impact_emotion"].mean()) if len(judged) else 0.0}
    return out


SUMMARY = Path("reports/traces.json")


def run_traces(params: Params, params_path: str | None) -> dict:
    """The `traces` stage, start to end: every train and validation clip traced (resumable), the
    tables written to data/traces/*.parquet, their summary to reports/traces.json and to MLflow."""
    total = sum(len(trace_clips(params, s, lang)) for s in ("train", "val") for lang in params.data.languages)
    pool = workers.Pool.for_stage(params, params_path, "traces", fn=shadow_one)
    try:
        with tqdm(total=total, desc="traces", unit="clip") as bar:
            tables = collect(params, pool, TRACE_DIR, progress=bar.update)
    finally:
        pool.close()
    for split, df in tables.items():
        df.to_parquet(TRACE_DIR / f"{split}.parquet", index=False)
    result = summary(tables)
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(json.dumps(result, indent=1))
    key = traces_key(params)
    tracker = Tracker.for_stage(params.tracking.uri, params.tracking.experiment, "traces")
    with tracker.sweep(f"traces-{key}", {"traces": params.gates.traces.__dict__, "rank": params.decode.rank},
                       {"sweep_key": f"traces-{key}", "stage": "traces"}) as parent:
        for split, stats in result.items():
            tracker.log_config(parent, f"traces-{key}-{split}", f"traces-{split}", {"split": split}, stats)
    return result
