"""Two `dvc repro` runs of the same commit and params, compared: are the models and the results the same?

    python benchmarks/repro_compare.py RUN_A RUN_B [--out reports/repro_compare]

RUN_A and RUN_B are project roots after a full `dvc repro` (e.g. two clean clones, or
`benchmarks/pipeline.py --keep` directories). Compared:
- every model file (safetensors, gate files, WISV head) by sha256;
- every decode and gate-evaluation configuration's captions, clip by clip (reports/runs/,
  reports/gate_runs/), and its per-caption counters that do not read the clock (tokens, rounds,
  escalations, drafted, accepted, corrected);
- the traces (data/traces/*.jsonl) clip by clip.
Times are not compared: they are measured. Where a decoding rule decides by the clock (the
pipelined loop's adaptive draft-ahead waits for a verdict only if it is due sooner than a token;
adaptive Q-S picks L and the lattice level from measured times), its captions may differ between
runs by design; those configurations are listed apart.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
from pathlib import Path

from speccap.project import portable_path

COUNTERS = ("tokens", "rounds", "escalations", "drafted", "accepted", "corrected")
MODEL_GLOBS = ("models/edge/*.safetensors", "models/cloud/*.safetensors", "models/gates/*.gate.json", "models/wisv/*.pt")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def clock_driven(config_name: str) -> bool:
    """Configurations that decide by the measured clock: pipelined ones (`-N<blocks in flight>-`,
    adaptive draft-ahead) and adaptive Q-S (`Lqsadapt`: L and the lattice level from measured times)."""
    return re.search(r"-N\d+-", config_name) is not None or "-Lqsadapt-" in config_name


def _records(path: Path) -> dict[str, dict]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            out[r["id"]] = r
    return out


def compare_runs(a: Path, b: Path) -> dict:
    models = []
    for pattern in MODEL_GLOBS:
        for pa in sorted(a.glob(pattern)):
            pb = b / pa.relative_to(a)
            models.append({"file": str(pa.relative_to(a)), "same": pb.exists() and sha256(pa) == sha256(pb)})
    configs = []
    for sub in ("reports/runs", "reports/gate_runs"):
        for pa in sorted((a / sub).glob("*.jsonl")):
            pb = b / sub / pa.name
            ra = _records(pa)
            rb = _records(pb) if pb.exists() else {}
            shared = sorted(set(ra) & set(rb))
            captions = sum(ra[k]["caption"] == rb[k]["caption"] for k in shared)
            counters = sum(all(ra[k].get(c) == rb[k].get(c) for c in COUNTERS) for k in shared)
            configs.append({"config": f"{sub.split('/')[-1]}/{pa.stem}", "clips": len(ra), "shared": len(shared),
                            "same_captions": captions, "same_counters": counters,
                            "clock_driven": clock_driven(pa.stem)})
    traces = []
    for pa in sorted((a / "data/traces").glob("*.jsonl")):
        pb = b / "data/traces" / pa.name
        # records are appended as workers finish them: compared by clip, not by line
        la, lb = _records(pa), (_records(pb) if pb.exists() else {})
        traces.append({"file": pa.name, "records": len(la), "same": la == lb})
    return {"a": portable_path(a), "b": portable_path(b), "commits": [_commit(a), _commit(b)], "models": models, "configs": configs,
            "traces": traces}


def _commit(root: Path) -> str | None:
    run = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return run.stdout.strip() or None


def markdown(result: dict) -> str:
    models_same = sum(m["same"] for m in result["models"])
    exact = [c for c in result["configs"] if not c["clock_driven"]]
    clock = [c for c in result["configs"] if c["clock_driven"]]
    full = lambda c: c["same_captions"] == c["clips"] == c["shared"] and c["same_counters"] == c["clips"]  # noqa: E731
    lines = ["# Two repros compared", "",
             f"Made by `python benchmarks/repro_compare.py {result['a']} {result['b']}`: two `dvc repro` runs from "
             f"clean clones at commits {' and '.join(str(c) for c in result.get('commits', []))}.", "",
             "| what | the same in both runs |", "|---|---|",
             f"| model files (sha256) | {models_same} of {len(result['models'])} |",
             f"| traces files | {sum(t['same'] for t in result['traces'])} of {len(result['traces'])} |",
             f"| configurations that do not read the clock: every caption and counter | "
             f"{sum(map(full, exact))} of {len(exact)} |",
             f"| clock-driven configurations (pipelined, adaptive Q-S): every caption | "
             f"{sum(c['same_captions'] == c['clips'] for c in clock)} of {len(clock)} |", "",
             "| configuration | clips | same captions | same counters | reads the clock |", "|---|---|---|---|---|"]
    lines += [f"| {c['config']} | {c['clips']} | {c['same_captions']} | {c['same_counters']} | "
              f"{'yes' if c['clock_driven'] else 'no'} |" for c in result["configs"]]
    lines += ["", "| model file | same |", "|---|---|"]
    lines += [f"| {m['file']} | {'yes' if m['same'] else '**no**'} |" for m in result["models"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--out", type=Path, default=Path("reports/repro_compare"))
    args = ap.parse_args()
    for root in (args.a, args.b):
        if not (root / "reports" / "runs").is_dir():
            raise SystemExit(f"{root}: no reports/runs/ here; run `dvc repro` there first")
    result = compare_runs(args.a, args.b)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
