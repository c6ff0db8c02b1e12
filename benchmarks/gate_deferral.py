"""What deferring a flagged token saves on the papers' hardware: the same captions, timed twice.

A token gate reads the edge's state before the token, so the blocking loop leaves a flagged token
unfed until its verdict (decoding.halves.EdgeHalf): a draft the cloud replaces never costs the edge
a forward. Every token-level run of the gate evaluation (reports/gate_runs) records both counts
per caption: the tokens the edge really fed (`edge_fed`) and what feeding every draft at once
would have cost (each draft, plus each correction or bonus token fed after it). Both are timed as
the gate report does (pipeline.papers_hardware.papers_seconds: edge 2.10 and cloud 24.16 tokens/s, the
link model's time) against edge-only on the same clips. Run after `dvc repro gate_eval`:

    python benchmarks/gate_deferral.py        # -> reports/gate_deferral.md, reports/gate_deferral.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from speccap.pipeline.papers_hardware import papers_seconds  # noqa: E402


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _mean(records: list[dict], keys: tuple[str, ...]) -> dict:
    return {k: statistics.fmean(r[k] for r in records) for k in keys if all(k in r for r in records)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(ROOT), help="project whose reports/runs and reports/gate_runs to read")
    ap.add_argument("--out", default=str(ROOT / "reports"))
    args = ap.parse_args()
    root = Path(args.root)
    rows = []
    for path in sorted((root / "reports" / "gate_runs").glob("ugsd-*-*tok*.jsonl")):
        lang = path.name.split("-")[1]
        runs = _records(path)
        if not runs or "edge_fed" not in runs[0]:
            continue
        edge_path = next((root / "reports" / "runs").glob(f"edge-{lang}-*.jsonl"), None)
        if edge_path is None:
            raise SystemExit(f"{root / 'reports/runs'}: no edge-only records for {lang} (run `dvc repro decode`)")
        clips = {r["id"] for r in runs}
        edge = [r for r in _records(edge_path) if r["id"] in clips]
        e = papers_seconds(_mean(edge, ("tokens",)), "edge")
        m = _mean(runs, ("drafted", "corrected", "bonus", "rounds", "link_time", "edge_fed"))
        at_once = {k: v for k, v in m.items() if k != "edge_fed"}
        rho = sum(r["transmitted"] for r in runs) / max(sum(r["drafted"] for r in runs), 1)
        rows.append({"language": lang, "config": path.stem.rsplit("-", 1)[0], "clips": len(runs), "rho": rho,
                     "x_edge_deferred": papers_seconds(m, "ugsd") / e,
                     "x_edge_fed_at_once": papers_seconds(at_once, "ugsd") / e,
                     "edge_steps_saved": m["drafted"] + m["corrected"] + m["bonus"] - m["edge_fed"] - 1})
    if not rows:
        raise SystemExit(f"{root / 'reports/gate_runs'}: no token-level runs with the edge's fed-token count "
                         "(run `dvc repro gate_eval`)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gate_deferral.json").write_text(json.dumps(rows, indent=1))
    lines = ["# Deferring a flagged token: the same captions, timed fed at once and deferred", "",
             "Papers' hardware (edge 2.10, cloud 24.16 tokens/s, the link model), per caption, against edge-only "
             "on the same clips. `python benchmarks/gate_deferral.py` over the gate evaluation's records.", "",
             "| lang | configuration | clips | rho | x edge-only, deferred | x edge-only, fed at once | "
             "edge steps saved per caption |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['language']} | {r['config']} | {r['clips']} | {r['rho']:.3f} | {r['x_edge_deferred']:.3f} | "
              f"{r['x_edge_fed_at_once']:.3f} | {r['edge_steps_saved']:.2f} |" for r in rows]
    (out / "gate_deferral.md").write_text("\n".join(lines) + "\n")
    print((out / "gate_deferral.md").read_text())


if __name__ == "__main__":
    main()
