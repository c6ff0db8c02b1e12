"""What the gate benchmarks share: the gate evaluation's outputs read back (gates.json, its runs,
the decode stage's edge-only and cloud-only records) and scored per clip."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from speccap.config import Params, load_params
from speccap.metrics.bootstrap import ClipStats, difference, gap_closed
from speccap.metrics.caption import score_captions
from speccap.pipeline.traces import TRACE_DIR, clip_table
from speccap.pipeline.verify_rank import rank_config

KEYS = (("bleu1", "BLEU-1"), ("emotion_hit_rate", "emotion hit"))
GATES_JSON = Path("models/gates/gates.json")


def read_records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def clip_stats(records: list[dict], clips: list[dict], language: str, source: Path,
               remedy: str = "run `dvc repro gate_eval` with the current params") -> ClipStats:
    by_id = {r["id"]: r for r in records}
    missing = [c["id"] for c in clips if c["id"] not in by_id]
    if missing:
        raise SystemExit(f"{source}: no caption of {len(missing)} evaluation clip(s), e.g. {missing[0]} ({remedy})")
    s = score_captions([by_id[c["id"]]["caption"] for c in clips], [c["references"] for c in clips], language,
                       [c.get("emotion") for c in clips])
    return ClipStats.from_records([c["id"] for c in clips], s.per_caption)


def rho(records: list[dict]) -> float:
    return sum(r["transmitted"] for r in records) / max(sum(r["drafted"] for r in records), 1)


def start(doc: str, more: Callable[[argparse.ArgumentParser], None] | None = None
          ) -> tuple[argparse.Namespace, Params, dict]:
    """A gate benchmark's command line (--params, --out and what `more` adds, described by the first
    paragraph of `doc`), its params and the gates stage's gates.json."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--out", default="reports")
    if more is not None:
        more(ap)
    args = ap.parse_args()
    return args, load_params(args.params), read_gates()


def read_gates() -> dict:
    """The gates stage's gates.json (thresholds, the chosen gates, the verify rank)."""
    if not GATES_JSON.exists():
        raise SystemExit(f"{GATES_JSON}: not found; run `dvc repro gate_eval` here first")
    return json.loads(GATES_JSON.read_text())


def references(params: Params, lang: str, clips: list[dict]) -> tuple[ClipStats, ClipStats]:
    """Edge-only and cloud-only on `clips`, from the decode stage's records."""
    refs = {m: next(Path(params.sweep.runs_dir).glob(f"{m}-{lang}-*.jsonl"), None) for m in ("edge", "cloud")}
    if None in refs.values():
        raise SystemExit(f"{params.sweep.runs_dir}: no edge-only or cloud-only {lang} records (run `dvc repro decode`)")
    edge, cloud = (clip_stats(read_records(f), clips, lang, f) for f in refs.values())
    return edge, cloud


def gate_eval_run(name: str) -> Path | None:
    """The gate evaluation's records of the configuration named `name` (RunConfig.name), if it ran."""
    found = sorted(Path("reports/gate_runs").glob(f"{name}-*.jsonl"))
    return found[0] if found else None


def stage_gate_run(params: Params, lang: str, name: str, threshold: float, rank: int) -> tuple[list[dict], Path]:
    """The gate evaluation's records of gate `name` at `threshold`, flagged tokens judged by rank-`rank`,
    and their file."""
    cfg = rank_config(params, lang, name, threshold, rank)
    found = gate_eval_run(cfg.name)
    if found is None:
        raise SystemExit(f"reports/gate_runs: no run of {cfg.name} (run `dvc repro gate_eval` first)")
    return read_records(found), found


def paired_columns(edge: ClipStats, cloud: ClipStats, stats: dict[str, ClipStats], minus: tuple[str, str]) -> dict:
    """For each of KEYS: the edge -> cloud gap share each named run closes (`<key>_<name>_share`)
    and the paired difference of two of them (`<key>_<a>_minus_<b>`), all on the same clips."""
    a, b = minus
    row = {}
    for key, _ in KEYS:
        for name, s in stats.items():
            row[f"{key}_{name}_share"] = gap_closed(edge, s, cloud, key)
        row[f"{key}_{a}_minus_{b}"] = difference(stats[a], stats[b], key)
    return row


def ci_cells(row: dict, suffixes: tuple[str, ...]) -> str:
    """The table cells "value [low, high]" of `row`'s `<key>_<suffix>` intervals, KEYS by suffixes."""
    return " | ".join(f"{d['value']:.1f} [{d['ci_low']:.1f}, {d['ci_high']:.1f}]"
                      for d in (row[f"{k}_{w}"] for k, _ in KEYS for w in suffixes))


def write_report(out: Path, stem: str, payload: dict, lines: list[str]) -> None:
    """<out>/<stem>.json and <stem>.md (the folder made if missing), the table printed too."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(payload, indent=1))
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def stage_traces(params) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The traces the `gates` stage trained on (the first ones + every DAgger round's train traces)
    and the validation traces its thresholds came from (the last round's, else the first)."""
    path = TRACE_DIR / "train.parquet"
    if not path.exists():
        raise SystemExit(f"{path}: not found; run `dvc repro gates` here first")
    train, val = [pd.read_parquet(path)], pd.read_parquet(TRACE_DIR / "val.parquet")
    for k in range(1, params.gates.dagger.rounds + 1):
        tables = {}
        for split in ("train", "val"):
            frames = []
            for lang in params.data.languages:
                f = Path("data/dagger") / f"round{k}" / f"{split}.{lang}.jsonl"
                if not f.exists():
                    raise SystemExit(f"{f}: not found; run `dvc repro gates` here first")
                frames += [clip_table(json.loads(x), lang) for x in f.read_text(encoding="utf-8").splitlines() if x]
            tables[split] = pd.concat(frames, ignore_index=True)
        train.append(tables["train"])
        val = tables["val"]
    return pd.concat(train, ignore_index=True), val
