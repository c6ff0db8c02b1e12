"""Wall time of the whole pipeline, stage by stage: `dvc repro` from a clean clone, then a no-op one.

    python benchmarks/pipeline.py [--profile default|ci] [--out reports/pipeline] [--keep DIR]

Clones this repository (its committed HEAD) into a temporary folder (or DIR, kept), runs the
README's main job there (`make repro`, the set-up being already done on this machine) with an
EMPTY numba cache, as on a new machine, and times every stage from DVC's own output, then times a
second `dvc repro` that must find nothing to do. Targets: under 30 minutes, under 15 seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_STAGE = re.compile(r"^Running stage '([a-z_]+)'")


def timed(cmd: str, cwd: Path, env: dict, log_path: Path | None = None) -> tuple[float, str, list[tuple[str, float]]]:
    """(seconds, output, [(stage, seconds from the start when DVC began it)]); output streamed to log_path."""
    t = time.perf_counter()
    starts, lines = [], []
    with open(log_path or os.devnull, "w") as log, \
            subprocess.Popen(cmd, shell=True, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, bufsize=1) as proc:
        for line in proc.stdout:
            lines.append(line)
            m = _STAGE.match(line)
            if m:
                starts.append((m.group(1), time.perf_counter() - t))
            log.write(f"[{time.perf_counter() - t:7.1f}] {line}")
            log.flush()
    dt = time.perf_counter() - t
    out = "".join(lines)
    if proc.returncode != 0:
        raise SystemExit(f"`{cmd}` failed after {dt:.0f} s:\n{out[-4000:]}")
    return dt, out, starts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="default")
    ap.add_argument("--out", type=Path, default=Path("reports/pipeline"))
    ap.add_argument("--keep", type=Path, help="clone into this folder and keep it (default: a temporary one)")
    args = ap.parse_args()
    repo = Path(__file__).resolve().parents[1]
    tmp = None if args.keep else tempfile.mkdtemp(prefix="speccap-bench-")
    clone = args.keep or Path(tmp) / "speccap"
    # the clone's own code (not an editable install's checkout, which may change meanwhile); numba cold
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(clone / "src"), os.environ.get("PYTHONPATH")])),
               NUMBA_CACHE_DIR=str(clone / ".cold-numba-cache"))  # cold, like a new machine
    env.pop("MLFLOW_TRACKING_URI", None)
    try:
        subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
        with (clone / ".git" / "info" / "exclude").open("a") as fh:
            fh.write("/.cold-numba-cache/\n")
        if args.profile != "default":
            p = clone / "params.yaml"
            p.write_text(p.read_text().replace("profile: default", f"profile: {args.profile}"))
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True,
                                text=True).stdout.strip()
        full, log, starts = timed("bash scripts/with_prefect.sh dvc repro", clone, env, clone / "repro.log")
        noop, noop_log, _ = timed("dvc repro", clone, env)
        if "Data and pipelines are up to date" not in noop_log:
            raise SystemExit(f"the second dvc repro was not a no-op:\n{noop_log[-2000:]}")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    ends = [s for _, s in starts[1:]] + [full]
    stages = [{"stage": name, "seconds": round(end - start, 1)} for (name, start), end in zip(starts, ends)]
    result = {"command": " ".join(["python"] + sys.argv), "commit": commit, "profile": args.profile,
              "machine": platform.machine(), "cpus": os.cpu_count(), "numba_cache": "empty at start",
              "dvc_repro_seconds": round(full, 1), "noop_dvc_repro_seconds": round(noop, 1), "stages": stages,
              "targets": {"dvc_repro_seconds": 1800, "noop_dvc_repro_seconds": 15}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    rows = "".join(f"| {s['stage']} | {s['seconds']:.0f} |\n" for s in stages)
    md = (f"# Pipeline wall time\n\nMade by `{result['command']}` at commit {commit} on {result['cpus']} CPUs "
          f"({result['machine']}), profile `{args.profile}`, from a clean clone (set-up already installed) and an "
          f"empty numba cache.\n\n"
          f"| run | seconds | target |\n|---|---|---|\n"
          f"| `dvc repro`, all stages | {full:.0f} ({full / 60:.1f} min) | < 1800 |\n"
          f"| no-op `dvc repro` | {noop:.1f} | < 15 |\n\n"
          f"## Per stage (wall seconds, from DVC starting the stage to starting the next)\n\n"
          f"| stage | seconds |\n|---|---|\n{rows}")
    args.out.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
