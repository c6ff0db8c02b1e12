"""Would the learned gates spend a low budget better if they read the shape of the edge's distribution?

A token gate reads the edge's entropy, top-1, margin, log-prob and rank at temperature 1, and its
hidden state. The traces now also keep each token's entropy at every temperature of
gates.entropy_temperatures (what the entropy baseline is tuned on): a cheap summary of how the
edge's probability mass is spread, from its head to its tail. This script is the ablation on
validation, before any such feature could become a default: each target's chosen classifier is
fitted again on exactly the stage's training traces (the first traces and every DAgger round's),
once with the stage's features and once with the entropies appended, and each is scored by the
share of the validation tokens' gain its flags capture at each budget (`captured`, the criterion
the gain gates are chosen by), per language. No decoding: a feature that does not capture more
here is not worth the loop computing it. Run after `dvc repro gates`:

    python benchmarks/gate_features.py   # -> reports/gate_features.md, .json
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gate_common import stage_traces, start, write_report  # noqa: E402

from speccap.gating.features import TOKEN_SCALARS  # noqa: E402
from speccap.gating.token_gates import fit_token_gate  # noqa: E402
from speccap.pipeline.gates import captured, end_token  # noqa: E402
from speccap.pipeline.markdown import md_table  # noqa: E402
from speccap.pipeline.traces import features_of  # noqa: E402

BUDGETS = (0.03, 0.05, 0.07, 0.1)


def main() -> None:
    args, params, gates = start(__doc__)
    train, val = stage_traces(params)
    x, xv = features_of(train), features_of(val)
    extra = {split: np.stack(df["entropy_at"].to_numpy()).astype(np.float32) for split, df in
             (("train", train), ("val", val))}
    dim = x.shape[1] - len(TOKEN_SCALARS) - 1
    eos = end_token(train)
    # the stage's features again under another seed: how far a refit alone moves the numbers
    variants = {"stage's features": (x, xv, dim, params.seed), "another seed": (x, xv, dim, params.seed + 1),
                "+ entropy at each T": (np.hstack([x, extra["train"]]), np.hstack([xv, extra["val"]]),
                                        dim + extra["train"].shape[1], params.seed)}
    payload, rows = {"budgets": list(BUDGETS), "temperatures": list(params.gates.entropy_temperatures),
                     "train_tokens": len(train), "val_tokens": len(val), "gates": {}}, []
    for target, name in gates["chosen"].items():
        kind = gates["gates"][name]["kind"]
        got = {}
        for label, (a, b, d, seed) in variants.items():
            model = fit_token_gate(a, train, kind, target, d, eos, seed)
            got[label] = captured(val, model.token_scores(b), BUDGETS)
        payload["gates"][name] = got
        for lang in sorted(val["language"].unique()):
            for bud in BUDGETS:
                base, reseeded, more = (100 * got[v][str(bud)][lang] for v in variants)
                rows.append([name, lang, f"{bud:g}", f"{base:.1f}", f"{reseeded - base:+.1f}", f"{more:.1f}",
                             f"{more - base:+.1f}"])
    lines = ["# Token gate features: the edge's entropy at several temperatures (validation traces)\n",
             f"Each target's chosen classifier refitted on the stage's {len(train)} training tokens, scored on "
             f"{len(val)} validation tokens: the share (%) of their gain its flags capture at each budget "
             f"(`benchmarks/gate_features.py`; temperatures {', '.join(f'{t:g}' for t in params.gates.entropy_temperatures)}). "
             "One fit per variant, no interval; the stage's features refitted under another seed show how far a "
             "refit alone moves the share (the logistic gates do not depend on the seed).\n",
             md_table(["gate", "lang", "budget rho*", "stage's features %", "another seed, difference",
                       "+ entropy at each T %", "difference"], rows)]
    write_report(Path(args.out), "gate_features", payload, lines)


if __name__ == "__main__":
    main()
