"""Wall time of the whole pipeline, stage by stage: `dvc repro` from a clean clone, then a no-op one.

    python benchmarks/pipeline.py [--profile default|ci] [--out reports/pipeline] [--keep DIR]
    python benchmarks/pipeline.py --render reports/pipeline.json [--before OLD.json]   # tables again

Clones this repository (its committed HEAD) into a temporary folder (or DIR, kept), runs the
README's main job there (`make repro`, the set-up being already done on this machine) with an
EMPTY numba cache, as on a new machine, and times every stage from DVC's own output, then times a
second `dvc repro` that must find nothing to do. Targets: under 30 minutes, under 15 seconds.
The run before (the report found at --out, or --before) sits next to it, stage by stage.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from speccap.project import portable_command

_STAGE = re.compile(r"^Running stage '([a-z_]+)'")
_SKIPPED = re.compile(r"^Stage '([a-z_]+)' didn't change, skipping", re.M)


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
    ap.add_argument("--before", type=Path, help="an earlier run's JSON to compare with (default: the one at --out)")
    ap.add_argument("--render", type=Path, help="only write the Markdown of this JSON (with --before), no run")
    args = ap.parse_args()
    if args.render:
        result = json.loads(args.render.read_text())
        before = json.loads(args.before.read_text()) if args.before else None
        args.render.with_suffix(".md").write_text(render(result, before))
        print(render(result, before))
        return
    old = args.before or args.out.with_suffix(".json")
    before = json.loads(old.read_text()) if old.exists() else None
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
    result = {"command": portable_command(), "commit": commit, "profile": args.profile,
              "machine": platform.machine(), "cpus": os.cpu_count(), "numba_cache": "empty at start",
              "dvc_repro_seconds": round(full, 1), "noop_dvc_repro_seconds": round(noop, 1), "stages": stages,
              "skipped": skipped_stages(log),
              "targets": {"dvc_repro_seconds": 1800, "noop_dvc_repro_seconds": 15}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    md = render(result, before)
    args.out.with_suffix(".md").write_text(md)
    print(md)


def skipped_stages(log: str) -> list[str]:
    """The stages `dvc repro` found up to date in the clone: outputs committed in git whose
    dependencies the clone rebuilt to the same bytes."""
    return _SKIPPED.findall(log)


def render(result: dict, before: dict | None = None) -> str:
    """The report's Markdown: totals against the targets, and each stage's seconds (next to the run
    `before`, when given)."""
    full, noop = result["dvc_repro_seconds"], result["noop_dvc_repro_seconds"]
    was = {s["stage"]: s["seconds"] for s in before["stages"]} if before else {}
    if before:
        head = f"| stage | seconds | before (commit {before['commit']}) |\n|---|---|---|\n"
        rows = "".join(f"| {s['stage']} | {s['seconds']:.0f} | "
                       f"{'–' if s['stage'] not in was else format(was[s['stage']], '.0f')} |\n"
                       for s in result["stages"])
        rows += f"| **all** | **{full:.0f}** | **{before['dvc_repro_seconds']:.0f}** |\n"
    else:
        head = "| stage | seconds |\n|---|---|\n"
        rows = "".join(f"| {s['stage']} | {s['seconds']:.0f} |\n" for s in result["stages"])
    return (f"# Pipeline wall time\n\nMade by `{result['command']}` at commit {result['commit']} on {result['cpus']} "
            f"CPUs ({result['machine']}), profile `{result['profile']}`, from a clean clone (set-up already installed) "
            f"and an empty numba cache.\n\n"
            f"| run | seconds | target |\n|---|---|---|\n"
            f"| `dvc repro`, all stages | {full:.0f} ({full / 60:.1f} min) | < 1800 |\n"
            f"| no-op `dvc repro` | {noop:.1f} | < 15 |\n\n"
            f"## Per stage (wall seconds, from DVC starting the stage to starting the next)\n\n{head}{rows}"
            + _skipped_line(result.get("skipped")))


def _skipped_line(skipped: list[str] | None) -> str:
    if not skipped:
        return ""
    return (f"\nNot run in the clone: {', '.join(skipped)}. Their outputs are committed in git and the stages before "
            "them rebuilt their dependencies to the same bytes, so DVC found them up to date, as it will on a "
            "new user's machine.\n")


if __name__ == "__main__":
    main()
