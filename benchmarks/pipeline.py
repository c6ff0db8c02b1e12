"""Wall time of the whole pipeline: `dvc repro` from a clean clone, then a no-op `dvc repro`.

    python benchmarks/pipeline.py [--profile default|ci] [--out reports/pipeline]

Clones this repository (its committed HEAD) into a temporary folder, runs the README's main job
there (`make repro`, the set-up being already done on this machine) and times it, then times a
second `dvc repro` that must find nothing to do. Targets: under 30 minutes, under 15 seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(cmd: str, cwd: Path, env: dict) -> tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, shell=True, cwd=cwd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"`{cmd}` failed after {dt:.0f} s:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return dt, proc.stdout + proc.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="default")
    ap.add_argument("--out", type=Path, default=Path("reports/pipeline"))
    args = ap.parse_args()
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    with tempfile.TemporaryDirectory(prefix="speccap-bench-") as tmp:
        clone = Path(tmp) / "speccap"
        subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
        if args.profile != "default":
            p = clone / "params.yaml"
            p.write_text(p.read_text().replace("profile: default", f"profile: {args.profile}"))
        full, log = timed("bash scripts/with_prefect.sh dvc repro", clone, env)
        noop, noop_log = timed("dvc repro", clone, env)
        if "Data and pipelines are up to date" not in noop_log:
            raise SystemExit(f"the second dvc repro was not a no-op:\n{noop_log[-2000:]}")
        stages = [line.split("'")[1] for line in log.splitlines() if line.startswith("Running stage")]
    result = {"command": " ".join(["python"] + sys.argv), "profile": args.profile, "machine": platform.machine(),
              "cpus": os.cpu_count(), "dvc_repro_seconds": full, "noop_dvc_repro_seconds": noop, "stages": stages,
              "targets": {"dvc_repro_seconds": 1800, "noop_dvc_repro_seconds": 15}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    md = (f"# Pipeline wall time\n\nMade by `{result['command']}` on {result['cpus']} CPUs ({result['machine']}), "
          f"profile `{args.profile}`, from a clean clone (set-up already installed).\n\n"
          f"| run | seconds | target |\n|---|---|---|\n"
          f"| `dvc repro` (stages {', '.join(stages)}) | {full:.0f} ({full / 60:.1f} min) | < 1800 |\n"
          f"| no-op `dvc repro` | {noop:.1f} | < 15 |\n")
    args.out.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
