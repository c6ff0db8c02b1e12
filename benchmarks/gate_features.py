"""Would the learned gates spend a low budget better if they read more of what the edge knows?

A token gate reads the edge's entropy, top-1, margin, log-prob and rank at temperature 1, the token,
its position and its hidden state. This script is the ablation on validation, before any other
feature could become a default. Candidates (what the device has when it decides):

- the entropy at every temperature of gates.entropy_temperatures (the traces keep them);
- the edge's top-k distribution: the 3rd to 5th probabilities and the mass outside the top 5;
- the runner-up: the edge's second choice token (LightGBM reads it as a category, as the token);
- what was already sent: the corrections the caption took before the token and the tokens since the
  last one (zero along the edge's own caption; the DAgger rounds' captions carry them).

The top-k and runner-up columns come from the edge teacher-forced along each traced caption (the
edge-only caption, or the one a DAgger round committed), checked against the traces' own top-1. Each
target's chosen classifier is fitted again on exactly the stage's training traces (the critical gate
with the stage's impact weights), once per variant, and scored by the share of the validation
tokens' gain its flags capture at each budget (`captured`, the criterion the gain gates are chosen
by), per language. The stage's features under another seed show how far a refit alone moves it.
No decoding: a feature that does not capture more here is not worth the loop computing it. Run after
`dvc repro gates`:

    python benchmarks/gate_features.py   # -> reports/gate_features.md, .json
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gate_common import stage_traces, start, write_report  # noqa: E402

from speccap.data.featurize import load_clip_features  # noqa: E402
from speccap.gating.features import TOKEN_SCALARS  # noqa: E402
from speccap.gating.token_gates import (  # noqa: E402
    REGRESSION_TARGETS,
    _classifier,
    fit_token_gate,
    impact_weights,
    scorer_of,
    target_values,
)
from speccap.pipeline import workers  # noqa: E402
from speccap.pipeline.gates import captured, end_token  # noqa: E402
from speccap.pipeline.markdown import md_table  # noqa: E402
from speccap.pipeline.traces import features_of  # noqa: E402

BUDGETS = (0.03, 0.05, 0.07, 0.1)
TOP = 5  # the top-k columns: p3..p5 and the mass outside the top 5
TOKEN = len(TOKEN_SCALARS)  # the token id's column


def edge_view(w: workers.Worker, job: tuple) -> dict:
    """Along one traced caption, per position: the edge's top-1 probability (the check), its 3rd to
    5th probabilities, the mass outside its top 5, and its runner-up token."""
    clip_id, language, path, n, k = job
    mel, _ = load_clip_features(w.params.data.processed_dir, clip_id)
    sess = w.edge.start(mel, language)
    rows = [sess.prefill_logits]
    if path:
        out = sess.extend(list(path), False)
        rows += [out.logits[k] for k in range(len(path))]
    logits = torch.stack([r.double() for r in rows[:n]])
    top = torch.topk(torch.softmax(logits, -1), TOP, dim=-1)
    view = np.column_stack([top.values[:, 0].numpy(), top.values[:, 2:].numpy(),
                            1.0 - top.values.sum(-1).numpy(), top.indices[:, 1].numpy()])
    return {"k": k, "view": view}


def runs(df: pd.DataFrame) -> np.ndarray:
    """A number per traced caption: a clip is traced once along the edge's own caption and again in
    each DAgger round, so its id alone does not name one caption; its consecutive rows do."""
    ids = df["clip_id"].to_numpy()
    return np.concatenate([[0], np.cumsum(ids[1:] != ids[:-1])])


def committed_paths(df: pd.DataFrame) -> list[tuple]:
    """(clip, language, the caption the trace ran along, rows) per traced clip: at each position the
    edge's draft where it was kept, else the cloud's token that replaced it."""
    jobs = []
    for _, part in df.groupby(runs(df), sort=False):
        clip_id = part["clip_id"].iloc[0]
        toks = np.where(part["kept"], part["token"], part["cloud_token"]).tolist()
        # row j was drafted after the first j committed tokens: the last row's own token is never fed
        jobs.append((clip_id, part["language"].iloc[0], toks[:-1], len(part), len(jobs)))
    return jobs


def already_sent(df: pd.DataFrame) -> np.ndarray:
    """Per row: the corrections its caption took before it, and log(1 + tokens since the last one)."""
    out = np.zeros((len(df), 2), dtype=np.float32)
    at = 0
    for _, part in df.groupby(runs(df), sort=False):
        fixed = ~part["kept"].to_numpy(bool)
        before = np.concatenate([[0], np.cumsum(fixed)[:-1]])
        last = -1
        since = np.zeros(len(part))
        for j in range(len(part)):
            since[j] = j - last
            if fixed[j]:
                last = j
        out[at:at + len(part)] = np.column_stack([before, np.log1p(since)])
        at += len(part)
    return out


def edge_views(params, params_path: str, tables: dict[str, pd.DataFrame]) -> dict[str, np.ndarray]:
    """The edge_view columns of every row of each table (rows in the table's order)."""
    pool = workers.Pool.for_stage(params, params_path, "gates", fn=edge_view)
    out = {}
    try:
        for split, df in tables.items():
            jobs = committed_paths(df)
            made = {r["k"]: r["view"] for r in pool.imap(jobs)}
            view = np.concatenate([made[k] for k in range(len(jobs))]).astype(np.float32)
            gap = np.abs(view[:, 0] - df[f"x{TOKEN_SCALARS.index('top1')}"].to_numpy(np.float32)).max()
            if gap > 1e-4:
                raise SystemExit(f"{split} traces: the edge teacher-forced along them gives another top-1 (max "
                                 f"difference {gap:.2g}): trace again with the current edge (dvc repro traces)")
            out[split] = view[:, 1:]
    finally:
        pool.close()
    return out


def fit_scores(kind: str, target: str, x: np.ndarray, train: pd.DataFrame, xv: np.ndarray, dim: int, eos: int,
               seed: int, weights, categories: tuple[int, ...]) -> np.ndarray:
    """Validation scores of `kind` fitted for `target`; LightGBM reads the columns `categories` as
    categories (the token id and, where added, the runner-up)."""
    if kind != "lightgbm" or categories == (TOKEN,):
        model = fit_token_gate(x, train, kind, target, dim, eos, seed, weights)
        return model.token_scores(xv)
    regression = target in REGRESSION_TARGETS
    clf = _classifier(kind, seed, regression).fit(x, target_values(train, target), sample_weight=weights,
                                                   categorical_feature=list(categories))
    return scorer_of(kind, clf, regression).scores(xv)


def main() -> None:
    args, params, gates = start(__doc__, lambda ap: ap.add_argument("--seeds", type=int, default=3,
                                                                     help="fits per variant"))
    train, val = stage_traces(params)
    x, xv = features_of(train), features_of(val)
    views = edge_views(params, args.params, {"train": train, "val": val})
    sent = {"train": already_sent(train), "val": already_sent(val)}
    ent = {split: np.stack(df["entropy_at"].to_numpy()).astype(np.float32) for split, df in
           (("train", train), ("val", val))}
    topk = {s: v[:, :TOP - 1] for s, v in views.items()}
    runner = {s: v[:, TOP - 1:] for s, v in views.items()}
    dim = x.shape[1] - len(TOKEN_SCALARS) - 1
    eos = end_token(train)
    runner_col = x.shape[1]

    def plus(*parts):
        return (np.hstack([x, *(p["train"] for p in parts)]), np.hstack([xv, *(p["val"] for p in parts)]))

    # label -> (train rows, val rows, LightGBM's categorical columns, whether the MLP reads them too)
    variants = {"stage's features": (x, xv, (TOKEN,), True),
                "+ entropy at each T": (*plus(ent), (TOKEN,), True),
                "+ top-5 distribution": (*plus(topk), (TOKEN,), True),
                "+ runner-up token": (*plus(runner), (TOKEN, runner_col), False),
                "+ already sent": (*plus(sent), (TOKEN,), True),
                "+ all three": (*plus(runner, topk, sent), (TOKEN, runner_col), False)}
    seeds = [params.seed + k for k in range(args.seeds)]
    payload = {"budgets": list(BUDGETS), "temperatures": list(params.gates.entropy_temperatures), "seeds": seeds,
               "train_tokens": len(train), "val_tokens": len(val), "gates": {}}
    rows = []
    for target, name in gates["chosen"].items():
        kind = gates["gates"][name]["kind"]
        weights = impact_weights(train, params.gates.impact_weight) \
            if target == "critical" and params.gates.impact_weight else None
        got = {}  # variant -> one `captured` per seed
        for label, (a, b, cats, any_kind) in variants.items():
            if any_kind or kind == "lightgbm":
                got[label] = [captured(val, fit_scores(kind, target, a, train, b, dim, eos, seed, weights, cats),
                                       BUDGETS) for seed in seeds]
        payload["gates"][name] = got
        for lang in sorted(val["language"].unique()):
            for bud in BUDGETS:
                share = {v: 100 * np.array([c[str(bud)][lang] for c in cs]) for v, cs in got.items()}
                base = share["stage's features"]
                cells = [f"{share[v].mean() - base.mean():+.1f}" if v in share else "–"
                         for v in variants if v != "stage's features"]
                rows.append([name, lang, f"{bud:g}", f"{base.mean():.1f} [{base.min():.1f}, {base.max():.1f}]",
                             *cells])
    lines = ["# Token gate features: what else the edge knows (validation traces)\n",
             f"Each target's chosen classifier refitted on the stage's {len(train)} training tokens, scored on "
             f"{len(val)} validation tokens: the share (%) of their gain its flags capture at each budget, with the "
             "stage's features and the difference each variant makes (`benchmarks/gate_features.py`, whose "
             "docstring defines the candidates; temperatures "
             f"{', '.join(f'{t:g}' for t in params.gates.entropy_temperatures)}). Each variant is fitted under "
             f"{len(seeds)} seeds and its mean share shown; in brackets the lowest and highest of the stage's "
             "features over the seeds, how far a refit alone moves the share (the logistic gates do not depend on "
             "the seed). A difference inside that spread is no finding. The runner-up token is read by LightGBM "
             "only (an MLP has no use for an id).\n",
             md_table(["gate", "lang", "budget rho*", "stage's features % [seeds' range]",
                       *[f"{v}, difference" for v in variants if v != "stage's features"]], rows)]
    write_report(Path(args.out), "gate_features", payload, lines)


if __name__ == "__main__":
    main()
