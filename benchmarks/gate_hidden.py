"""Which edge hidden state should a token gate read: the one BEFORE the token (the state whose
distribution drafted it; what the gates read) or the one AFTER it (the state once the token is fed
back, what the gates read before), or none?

Reading the state before the token lets the gate decide before the edge feeds the token back, so
a token the cloud replaces never costs the edge a forward (decoding.halves.EdgeHalf). This checks
that the gate loses nothing by it. On the first-round traces (the edge's own captions,
data/traces/{train,val}.parquet) the state after token j is the state before token j + 1, so all
three inputs come from the same rows (the end token has no state after it: zeros, as the old gate
had). Every classifier and target of the gates stage is fitted on the train traces and ranked on
the validation traces (ROC AUC). Run after `dvc repro traces`:

    python benchmarks/gate_hidden.py        # -> reports/gate_hidden.md, reports/gate_hidden.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from speccap.gating.features import TOKEN_SCALARS  # noqa: E402
from speccap.gating.token_gates import TOKEN_KINDS, TOKEN_TARGETS, fit_token_gate  # noqa: E402
from speccap.pipeline.gates import end_token, roc_auc  # noqa: E402
from speccap.pipeline.traces import features_of  # noqa: E402

INPUTS = ("before", "after", "none")


def variants(traces: pd.DataFrame) -> dict[str, np.ndarray]:
    """The feature matrix with the state before each token (as traced), after it, or none."""
    x = features_of(traces)
    cols = slice(len(TOKEN_SCALARS) + 1, x.shape[1])
    after = x.copy()
    after[:, cols] = 0.0
    clip = traces["clip_id"].to_numpy()
    same = clip[:-1] == clip[1:]  # rows are in caption order within a clip
    after[:-1][same, cols] = x[1:][same, cols]
    none = x.copy()
    none[:, cols] = 0.0
    return {"before": x, "after": after, "none": none}


def load(path: Path) -> pd.DataFrame:
    if not path.exists():
        raise SystemExit(f"{path}: no traces (run `dvc repro traces` first)")
    return pd.read_parquet(path).sort_values(["clip_id", "pos"]).reset_index(drop=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(ROOT), help="project whose data/traces to read")
    ap.add_argument("--out", default=str(ROOT / "reports"))
    args = ap.parse_args()
    traces = Path(args.root) / "data" / "traces"
    train, val = load(traces / "train.parquet"), load(traces / "val.parquet")
    xt, xv = variants(train), variants(val)
    dim = xt["before"].shape[1] - len(TOKEN_SCALARS) - 1
    eos = end_token(train)
    rows = []
    for kind in TOKEN_KINDS:
        for target in TOKEN_TARGETS:
            row = {"kind": kind, "target": target}
            for name in INPUTS:
                model = fit_token_gate(xt[name], train, kind, target, dim, eos)
                row[name] = roc_auc(val[target].to_numpy(bool), model.token_scores(xv[name]))
            rows.append(row)
            print(row, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"train_tokens": len(train), "val_tokens": len(val), "train_clips": int(train["clip_id"].nunique()),
               "val_clips": int(val["clip_id"].nunique()), "hidden": dim, "auc": rows}
    (out / "gate_hidden.json").write_text(json.dumps(summary, indent=1))
    lines = ["# Token gates: the edge state before the token, after it, or none", "",
             f"Validation ROC AUC of each gate (fitted on {summary['train_clips']} train clips, "
             f"{len(train)} tokens; ranked on {summary['val_clips']} validation clips, {len(val)} tokens; "
             f"first-round traces, hidden size {dim}). `python benchmarks/gate_hidden.py`.", "",
             "| classifier | target | before (read now) | after (read before) | no hidden state |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['kind']} | {r['target']} | {r['before']:.3f} | {r['after']:.3f} | {r['none']:.3f} |" for r in rows]
    lines += ["", "The state before a token is known before it is fed back: the gate decides without an edge "
              "forward, and a token the cloud replaces is never fed (no extra edge step per correction)."]
    (out / "gate_hidden.md").write_text("\n".join(lines) + "\n")
    print((out / "gate_hidden.md").read_text())


if __name__ == "__main__":
    main()
