"""Does the critical gate spend its budget better when each critical token weighs by its impact?

The `critical` target alone treats a token that gains 1 quality point when corrected like one that
gains 40 (the quote's first word, the emotion word). At a budget of 10% of the tokens, in zh
(critical rate ~7% of the traced tokens) such a gate misses the expensive ones as often as the
cheap ones. The `gates` stage therefore weighs a critical token 1 + w x its impact
(gates.impact_weight). This script is the ablation: it fits the chosen critical gate's classifier
again on exactly the stage's training traces (the first traces and every DAgger round's) with
another w (`--weight`, default 0: unweighted), picks its thresholds on the same validation
traces at each budget, and decodes the test clips with it, flagged tokens judged by the R the
stage chose per language. Beside it: the stage's own gate from the gate evaluation
(reports/gate_runs). Share of the edge -> cloud gap closed (BLEU-1, emotion hit) with 95% paired-
bootstrap CIs and the paired difference stage - refit. Run after `dvc repro gate_eval`:

    python benchmarks/gate_impact_weight.py [--weight 0]   # -> reports/gate_impact_weight.md, .json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import load_models  # noqa: E402
from gate_common import (  # noqa: E402
    ci_cells,
    clip_stats,
    paired_columns,
    references,
    rho,
    stage_gate_run,
    stage_traces,
    start,
    write_report,
)

from speccap.config import gate_decode  # noqa: E402
from speccap.gating.features import TOKEN_SCALARS  # noqa: E402
from speccap.gating.token_gates import LearnedTokenGate, fit_token_gate, impact_weights, threshold_for_share  # noqa: E402
from speccap.pipeline.gates import end_token  # noqa: E402
from speccap.pipeline.saved import load_gate  # noqa: E402
from speccap.pipeline.splits import eval_clips  # noqa: E402
from speccap.pipeline.traces import features_of  # noqa: E402
from speccap.pipeline.verify_rank import default_rank  # noqa: E402


def main() -> None:
    args, params, gates = start(__doc__, lambda ap: ap.add_argument(
        "--weight", type=float, default=0.0, help="the refit's w: a critical token weighs 1 + w x its impact "
        "(default 0: unweighted)"))
    name = gates["chosen"]["critical"]
    stage_model = load_gate(params, name).model
    train, val = stage_traces(params)
    x, xv = features_of(train), features_of(val)
    weights = impact_weights(train, args.weight) if args.weight else None
    model = fit_token_gate(x, train, stage_model.kind, "critical", x.shape[1] - len(TOKEN_SCALARS) - 1,
                           end_token(train), params.seed, sample_weight=weights)
    scores = model.token_scores(xv)
    ranks = gates.get("verify_rank", {}).get("chosen", {})

    from speccap.data.featurize import load_clip_features
    from speccap.decoding.build import DecodeSpec, build_decoder
    from speccap.decoding.engine import speculative
    from speccap.decoding.link import Link
    edge, cloud = load_models(params, params.sweep.threads)
    rows, runs = [], Path(args.out) / "gate_impact_weight"
    runs.mkdir(parents=True, exist_ok=True)
    for lang in params.data.languages:
        clips = eval_clips(params, lang)[: params.gates.eval_clips or None]
        e_s, c_s = references(params, lang, clips)
        r = ranks.get(lang, default_rank(params))
        mask = (val["language"] == lang).to_numpy()
        for budget in params.gates.budgets:
            t_stage = gates["gates"][name]["thresholds"][str(budget)][lang]
            stage, found = stage_gate_run(params, lang, name, t_stage, r)
            t = threshold_for_share(scores[mask], budget)
            gate = LearnedTokenGate(model, {lang: t}, f"{name}-w{args.weight:g}", params.gates.verify)
            spec = DecodeSpec.from_params(params, gate_decode(params), gate=gate.name, rule="rank", rank=r)
            path = runs / f"{lang}-{budget:g}-w{args.weight:g}.jsonl"
            refit = []
            with path.open("w", encoding="utf-8") as fh:
                for c in tqdm(clips, desc=f"{lang} rho* {budget:g} refit w = {args.weight:g}", unit="clip"):
                    mel, _ = load_clip_features(params.data.processed_dir, c["id"])
                    settings = build_decoder(spec, learned=lambda _spec, gate=gate: gate)
                    rec = speculative(edge, cloud, mel, lang, settings, Link(params.link, seed=params.seed))
                    refit.append({"id": c["id"], "caption": rec.caption, **rec.metrics()})
                    fh.write(json.dumps(refit[-1], ensure_ascii=False) + "\n")
            s_stage, s_refit = clip_stats(stage, clips, lang, found), clip_stats(refit, clips, lang, path)
            row = {"language": lang, "budget": budget, "rank": r, "clips": len(clips), "rho_stage": rho(stage),
                   "rho_refit": rho(refit)}
            row |= paired_columns(e_s, c_s, {"stage": s_stage, "refit": s_refit}, ("stage", "refit"))
            rows.append(row)
    out = Path(args.out)
    w_stage = params.gates.impact_weight
    lines = ["# The critical gate with and without impact weights\n",
             f"Made by `python benchmarks/gate_impact_weight.py --weight {args.weight:g}`. {name} as the `gates` "
             f"stage trained it (a critical token weighing 1 + {w_stage:g} x its impact, the quality points "
             f"correcting it gains; from the gate evaluation's runs) and fitted again on the same traces with "
             f"w = {args.weight:g} (thresholds on the same validation traces); flagged tokens judged by the R the "
             "stage chose per language (`R` column). Share of the edge -> cloud gap closed, % [95% paired-bootstrap "
             "CI over the test clips]; the difference stage - refit in points, paired.\n",
             f"| lang | rho* | R | rho stage / refit | BLEU-1 share stage (w {w_stage:g}) | BLEU-1 share refit "
             f"(w {args.weight:g}) | BLEU-1 stage - refit | emotion share stage | emotion share refit | emotion hit "
             "stage - refit |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['language']} | {r['budget']:g} | {r['rank']} | {r['rho_stage']:.3f} / "
                     f"{r['rho_refit']:.3f} | "
                     + ci_cells(r, ("stage_share", "refit_share", "stage_minus_refit")) + " |")
    write_report(out, "gate_impact_weight", {"gate": name, "stage_weight": w_stage, "refit_weight": args.weight,
                                             "rows": rows}, lines)


if __name__ == "__main__":
    main()
