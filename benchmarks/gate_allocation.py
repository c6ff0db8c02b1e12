"""Would the learned gates capture more at a low budget if the budget were spread by caption or by position?

A token gate flags every token whose score is above one threshold per language and budget: the
budget goes wherever the scores are high, so a caption may get many flags and another none. Two
ways to spend it "where it matters in the caption", measured on the validation traces before
either could become a default (no decoding: what the flags would buy in the traces' terms, the share
of the validation tokens' gain they hold, the criterion the gain gates are chosen by):

- per caption: each caption flags its own top `round(rho* x its tokens)` tokens, so every caption
  gets its share (an upper bound for any online rule, which cannot know the caption's length);
- per position: the score recalibrated within position bins (the caption's first quarter of
  positions, ..., its last), as the gain the validation tokens of that bin and score decile held,
  then one threshold on the recalibrated value. Fitted on half the validation clips, scored on the
  other half, and the halves swapped (two folds by clip, so no clip is scored by a fit that saw it).

Each learned gate the stage shipped (models/gates/), on the stage's validation traces. Run after
`dvc repro gates`:

    python benchmarks/gate_allocation.py   # -> reports/gate_allocation.md, .json
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from gate_common import stage_traces, start, write_report

from speccap.gating.gate_file import model_of, read_gate
from speccap.gating.token_gates import target_values, threshold_for_share
from speccap.pipeline.markdown import md_table
from speccap.pipeline.saved import gate_path
from speccap.pipeline.traces import features_of

BUDGETS = (0.03, 0.05, 0.07, 0.1)
POSITION_BINS = 4
SCORE_BINS = 10


def global_flags(scores: np.ndarray, budget: float) -> np.ndarray:
    return scores > threshold_for_share(scores, budget)


def per_caption_flags(scores: np.ndarray, clip_ids: np.ndarray, budget: float) -> np.ndarray:
    flags = np.zeros(len(scores), bool)
    for idx in pd.Series(np.arange(len(scores))).groupby(clip_ids).indices.values():
        k = int(round(budget * len(idx)))
        if k:
            flags[idx[np.argsort(-scores[idx], kind="stable")[:k]]] = True
    return flags


def _cells(scores: np.ndarray, pos: np.ndarray, pos_edges: np.ndarray, score_edges: np.ndarray) -> np.ndarray:
    p = np.clip(np.searchsorted(pos_edges, pos, side="right") - 1, 0, POSITION_BINS - 1)
    s = np.clip(np.searchsorted(score_edges, scores, side="right") - 1, 0, SCORE_BINS - 1)
    return p * SCORE_BINS + s


def per_position_values(scores: np.ndarray, pos: np.ndarray, gain: np.ndarray, fit: np.ndarray) -> np.ndarray:
    """Each token's score as the mean gain of the `fit` tokens in its (position bin, score decile)
    cell; a cell the fit tokens leave empty falls back to the fit tokens' mean gain."""
    pos_edges = np.quantile(pos[fit], np.linspace(0, 1, POSITION_BINS + 1))
    score_edges = np.quantile(scores[fit], np.linspace(0, 1, SCORE_BINS + 1))
    cells = _cells(scores, pos, pos_edges, score_edges)
    table = pd.Series(gain[fit]).groupby(cells[fit]).mean()
    # ties inside a cell are broken by the raw score, so a cell is never split at random
    return table.reindex(cells).fillna(gain[fit].mean()).to_numpy() + 1e-9 * scores


def per_position_flags(scores, pos, gain, clip_ids, budget: float) -> np.ndarray:
    clips = np.unique(clip_ids)
    half = np.isin(clip_ids, clips[::2])
    flags = np.zeros(len(scores), bool)
    for fit in (half, ~half):
        values = per_position_values(scores, pos, gain, fit)
        flags[~fit] = global_flags(values[~fit], budget)
    return flags


def captured(gain: np.ndarray, flags: np.ndarray) -> float:
    return float(gain[flags].sum() / gain.sum()) if gain.sum() > 0 else 0.0


def main() -> None:
    args, params, gates = start(__doc__)
    _, val = stage_traces(params)
    x, gain = features_of(val), target_values(val, "gain")
    payload, rows = {"budgets": list(BUDGETS), "val_tokens": len(val), "gates": {}}, []
    for name in dict.fromkeys(gates["chosen"].values()):
        scores = model_of(read_gate(gate_path(params, name))).token_scores(x)
        got = payload["gates"].setdefault(name, {})
        for lang in sorted(val["language"].unique()):
            m = (val["language"] == lang).to_numpy()
            s, g, ids, pos = scores[m], gain[m], val["clip_id"].to_numpy()[m], val["pos"].to_numpy()[m]
            for b in BUDGETS:
                cell = {"global": captured(g, global_flags(s, b)), "per caption": captured(g, per_caption_flags(s, ids, b)),
                        "per position": captured(g, per_position_flags(s, pos, g, ids, b))}
                got.setdefault(lang, {})[str(b)] = cell
                rows.append([name, lang, f"{b:g}", *(f"{100 * cell[k]:.1f}" for k in cell),
                             f"{100 * (cell['per caption'] - cell['global']):+.1f}",
                             f"{100 * (cell['per position'] - cell['global']):+.1f}"])
    lines = ["# Spending a gate's budget by caption or by position (validation traces)\n",
             f"Each learned gate the gates stage chose, on its {len(val)} validation tokens: the share (%) of their "
             "gain the flags hold at each budget, with one threshold (as the gates run), with each caption's own top "
             "share, and with the score recalibrated per position bin (two folds by clip). "
             "`python benchmarks/gate_allocation.py`; one set of traces, no interval.\n",
             md_table(["gate", "lang", "budget rho*", "one threshold %", "per caption %", "per position %",
                       "per caption - one", "per position - one"], rows)]
    write_report(Path(args.out), "gate_allocation", payload, lines)


if __name__ == "__main__":
    main()
