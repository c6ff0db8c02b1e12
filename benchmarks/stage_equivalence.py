"""The sweep stages' records made again by the working tree's code, against the records on disk.

    python benchmarks/stage_equivalence.py [--clips 50] [--out reports/stage_equivalence]

The decode, gate_eval and wisv_eval stages keep every caption's record in a log per configuration
(reports/runs, reports/gate_runs, reports/wisv_runs), named by the configuration's key in the
stage's summary. A change to how a sweep describes, ships or runs its configurations (the path from
params.yaml through `RunConfig` to the worker) leaves those logs in place when their keys stay, so
`dvc repro` alone says nothing about the new path. Here every configuration each stage builds today
is matched by name to its row in the stage's summary, the first `--clips` clips of its log are
captioned again through `run_config` on the stage's own worker pool (its workers and `sweep.batch`),
and every record field is compared, except the measured ones (wall time, model time, CPU, RAM).
Configurations a stage relinks from another channel's records (decoding.relink) are not decoded by
it, so they are not decoded here either (counted as relinked). Needs a finished `dvc repro`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

# the stages' kernels, set before numpy and torch load (its workers inherit them): a machine whose own
# kernels differ from the pinned ones would otherwise make records that differ in their last bits
from speccap.kernels import pin_kernels

pin_kernels()

from speccap.config import load_params  # noqa: E402
from speccap.pipeline.gate_report import gate_configs  # noqa: E402
from speccap.pipeline.markdown import md_table  # noqa: E402
from speccap.pipeline.splits import eval_clips  # noqa: E402
from speccap.pipeline.sweep import build_configs, run_config  # noqa: E402
from speccap.pipeline.wisv import wisv_configs  # noqa: E402
from speccap.pipeline.workers import Pool  # noqa: E402

MEASURED = {"wall_time", "model_time", "cpu_percent", "ram_gb"}
STAGES = {  # stage -> (its records folder, its summary, the configurations it builds)
    "decode": ("reports/runs", "reports/decode_summary.json", lambda p: build_configs(p)),
    "gate_eval": ("reports/gate_runs", "reports/gates/summary.json",
                  lambda p: gate_configs(p, json.loads(Path("models/gates/gates.json").read_text()))[0]),
    "wisv_eval": ("reports/wisv_runs", "reports/wisv/summary.json", lambda p: wisv_configs(p)),
}


def _clips_by_id(params) -> dict[str, dict]:
    return {c["id"]: c for lang in params.data.languages for c in eval_clips(params, lang)}


def compare_stage(params, params_path: str, stage: str, n_clips: int, tmp: Path) -> dict:
    runs, summary_path, build = STAGES[stage]
    rows = {r["name"]: r for r in json.loads(Path(summary_path).read_text())["configs"]}
    clips = _clips_by_id(params)
    out = {"configurations": 0, "captions": 0, "differ": [], "relinked": 0, "not_on_disk": []}
    pool = Pool.for_stage(params, params_path, stage)
    try:
        for cfg in build(params):
            row = rows.get(cfg.name)
            log = Path(runs) / f"{row['config_id']}.jsonl" if row else None
            if row is None or not log.exists():
                out["not_on_disk"].append(cfg.name)  # e.g. edge/cloud rows a stage reuses from another
                continue
            if "relinked_from" in row:
                out["relinked"] += 1
                continue
            before = [json.loads(x) for x in log.read_text(encoding="utf-8").splitlines() if x.strip()][:n_clips]
            again = run_config(cfg, [clips[r["id"]] for r in before], pool, tmp / f"{stage}-{row['config_id']}.jsonl")
            out["configurations"] += 1
            out["captions"] += len(before)
            for a, b in zip(before, again):
                fields = sorted(k for k in set(a) | set(b) if k not in MEASURED and a.get(k) != b.get(k))
                if fields:
                    out["differ"].append({"configuration": cfg.name, "clip": a["id"], "fields": fields})
    finally:
        pool.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clips", type=int, default=50, help="clips per configuration (the first of its log)")
    ap.add_argument("--stages", nargs="+", default=list(STAGES), choices=list(STAGES))
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--out", default="reports/stage_equivalence")
    args = ap.parse_args()
    params = load_params(args.params)
    result = {"clips": args.clips, "stages": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for stage in args.stages:
            result["stages"][stage] = compare_stage(params, args.params, stage, args.clips, Path(tmp))
    lines = ["# The sweep stages' records made again\n",
             f"`python benchmarks/stage_equivalence.py --clips {args.clips}`: every configuration each stage builds, "
             f"its first {args.clips} clips captioned again by this code on the stage's worker pool, against the "
             "records on disk; every field compared except wall time, model time, CPU and RAM.\n"]
    table = [[s, r["configurations"], r["captions"], len(r["differ"]), r["relinked"], len(r["not_on_disk"])]
             for s, r in result["stages"].items()]
    lines.append(md_table(["stage", "configurations", "captions", "records that differ", "relinked (not decoded)",
                       "not on disk"], table))
    for s, r in result["stages"].items():
        for d in r["differ"][:10]:
            lines.append(f"- {s}: {d['configuration']} {d['clip']}: {', '.join(d['fields'])}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.exit(1 if any(r["differ"] for r in result["stages"].values()) else 0)


if __name__ == "__main__":
    main()
