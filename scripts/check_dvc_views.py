"""DVC's own views of an experiment read as a headline: run after `dvc exp run -S decode.block_len=7`
on a committed baseline (.ci/run does), and prints what it checks.

- `dvc metrics show`: the headline alone, under 5,000 characters;
- `dvc exp show --only-changed`: the changed params beside the headline metrics that moved (a
  speculative run's figure among them, and the changed dependencies' hashes), at most 40 columns in Markdown; in a 200-column terminal, with
  the hashes dropped (`--drop '.*/'`: every column named by a path), no column collapsed to an
  ellipsis. (Plain `dvc exp show` lists every key of params.yaml and every code
  dependency: DVC always shows the default params file whole, which no setting of a project changes.)
- `dvc metrics diff`: a short table of what moved;
- `dvc plots diff`: the data plots hold both revisions, each curve from its own run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

MAX_METRICS_CHARS = 5000
MAX_COLUMNS = 40
TERMINAL = 200
DATA_PLOTS = ("l_sweep_bleu1", "quality_vs_rho", "gates_bleu1", "gates_emotion")


def dvc(*args: str, columns: int | None = None) -> str:
    env = dict(os.environ, **({"COLUMNS": str(columns)} if columns else {}))
    done = subprocess.run(["dvc", *args], capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        sys.exit(f"dvc {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def main() -> None:
    shown = dvc("metrics", "show")
    print(f"dvc metrics show ({len(shown)} characters):\n{shown}")
    assert len(shown) < MAX_METRICS_CHARS, len(shown)
    assert "reports/headline.json" in shown and "gate.gap_bleu1" in shown, shown

    md = dvc("exp", "show", "--md", "--only-changed", "--no-pager")
    header = [c.strip() for c in md.splitlines()[0].strip().strip("|").split("|")]
    print(f"dvc exp show --md --only-changed: {len(header)} columns: {header}")
    assert len(header) <= MAX_COLUMNS, len(header)
    assert "decode.block_len" in header, header
    # only what moved is shown: a draft length moves the speculative run's time, if not its words
    assert any(".ugsd." in column for column in header), header
    table = dvc("exp", "show", "--only-changed", "--drop", ".*/", "--no-pager", columns=TERMINAL)
    print(f"dvc exp show --only-changed --drop '.*/' in a {TERMINAL}-column terminal:\n{table}")
    widest = max(len(line) for line in table.splitlines())
    assert widest <= TERMINAL and "…" not in table, (widest, "a column collapsed" if "…" in table else "")

    diff = dvc("metrics", "diff")
    print(f"dvc metrics diff:\n{diff}")
    rows = [line for line in diff.splitlines() if "headline.json" in line]
    assert 0 < len(rows) <= MAX_COLUMNS and any("ugsd" in line for line in rows), diff

    plots = json.loads(dvc("plots", "diff", "--json"))["data"]
    for plot in DATA_PLOTS:
        (entry,) = plots[plot]
        revs = entry.get("revisions", [])
        print(f"dvc plots diff: {plot}: revisions {revs}")
        assert len(revs) == 2, (plot, revs)
    print("check_dvc_views: ok")


if __name__ == "__main__":
    main()
