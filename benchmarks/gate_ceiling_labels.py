"""Do token gates trained on the ceiling's choices close more of the gaps at low budgets?

The `gates` stage's gates learn labels judged one mismatch at a time: on the edge's own caption
(and DAgger's committed captions) each mismatch is corrected alone and the edge finishes the
caption. The ceiling of the gate evaluation (speccap.gating.ceiling) instead searches which
corrections to send together, by the finished caption's score on both gaps, and closes far more
of both gaps at rho* 0.05 than any gate. This script runs that search on the training clips the
traces come from (the first `--clips` per language, mismatches judged by the R the stage chose),
takes each clip's plan (the point `--label-budget`'s allocation over the training clips picks, or
with 0 its best caption), teacher-forces the edge along the caption the plan writes (what a token
gate reads at each position there, gating.shadow.trajectory_block) and labels a position 1 where
the plan sends the cloud's correction. Gates of each variant are fitted on those rows (alone, added
to the stage's own training rows and labels, or per language: en the stage's, zh the ceiling's),
given thresholds on the stage's validation traces, and decode the test clips (or with `--split val`
the validation clips) at each budget of `--at`, flagged tokens judged by the stage's R. Beside them:
the stage's tok-lightgbm-critical and tok-mlp-gain (from the gate evaluation's runs where it made
them). The search weighs both gaps as the gate evaluation's ceiling does, by the test clips' gap
sizes. Share of the edge -> cloud gap closed (BLEU-1, emotion hit) with 95%
paired-bootstrap CIs, and each variant minus the stage's critical gate, paired. The ceiling's
searches are kept in benchmarks/out/gate_ceiling_labels/ (a rerun reads them back). Run after
`dvc repro gate_eval`:

    python benchmarks/gate_ceiling_labels.py [--clips 400] [--at 0.05 0.07 0.1] [--split test|val]
        [--label-budget 0.05] [--seed N]
    # -> reports/gate_ceiling_labels{_val}{_best}{_seed<N>}.{md,json}
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

# the stages' kernels, set before numpy and torch load: the gates fit as the stage's would
from speccap.kernels import pin_kernels  # noqa: E402

pin_kernels()

import dataclasses  # noqa: E402
import json  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from dagger_budget import scratch_params  # noqa: E402
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

from speccap.config import load_params  # noqa: E402
from speccap.data.featurize import load_clip_features  # noqa: E402
from speccap.data.manifest import append_jsonl, read_jsonl  # noqa: E402
from speccap.gating.ceiling import PlanWalker, allocate, greedy_curve  # noqa: E402
from speccap.gating.features import TOKEN_SCALARS, token_rows  # noqa: E402
from speccap.gating.gate_file import SUFFIX, gate_document, model_of, read_gate, write_gate  # noqa: E402
from speccap.gating.shadow import trajectory_block  # noqa: E402
from speccap.gating.token_gates import fit_token_gate, impact_weights, threshold_for_share  # noqa: E402
from speccap.metrics.bootstrap import interval  # noqa: E402
from speccap.pipeline import workers  # noqa: E402
from speccap.pipeline.ceiling import CeilingSettings, objective, settings_for  # noqa: E402
from speccap.pipeline.gates import end_token  # noqa: E402
from speccap.pipeline.saved import gate_path  # noqa: E402
from speccap.pipeline.splits import eval_clips  # noqa: E402
from speccap.pipeline.sweep import RunConfig, run_config  # noqa: E402
from speccap.pipeline.traces import features_of, trace_clips  # noqa: E402
from speccap.pipeline.verify_rank import default_rank, rank_config  # noqa: E402

OUT = ROOT / "benchmarks" / "out" / "gate_ceiling_labels"
STAGE = {"critical": "tok-lightgbm-critical", "gain": "tok-mlp-gain"}  # the stage's gates held beside
# the variants: (gate name, classifier, the rows it learns from: the ceiling's alone, the stage's own rows
# (critical labels, impact weights) added, or per language: en the stage's, zh the ceiling's)
VARIANTS = (("tok-lightgbm-ceiling", "lightgbm", "ceiling"), ("tok-mlp-ceiling", "mlp", "ceiling"),
            ("tok-lightgbm-ceilcrit", "lightgbm", "both"), ("tok-lightgbm-mixed", "lightgbm", "mixed"))
MIXED = {"en": "stage", "zh": "ceiling"}


def search_one(w: workers.Worker, job: tuple) -> dict:
    """One training clip's ceiling curve: per point its caption tokens, whether it ended, where the
    plan corrects (positions), how many tokens it drafted and corrected, and its score."""
    clip_id, language, refs, emotion, settings = job
    s = CeilingSettings(**settings)
    mel, _ = load_clip_features(w.params.data.processed_dir, clip_id)
    score = objective(s, refs, emotion, language)
    walker = PlanWalker(w.edge, w.cloud, mel, language, s.rank, s.max_new_tokens)
    curve = greedy_curve(walker, lambda t: score(w.edge.decode(list(t.tokens))), s.steps)
    return {"id": clip_id, "language": language, "curve": [
        {"tokens": list(t.tokens), "ended": t.ended, "drafted": t.drafted, "corrected": t.corrected,
         "sent_at": [pos for j, (pos, _) in enumerate(t.mismatches) if j in t.plan],
         "score": score(w.edge.decode(list(t.tokens)))} for t in curve]}


def rows_one(w: workers.Worker, job: tuple) -> dict:
    """What a token gate reads at each position of a committed caption (token_rows), one row per position."""
    clip_id, language, tokens = job
    mel, _ = load_clip_features(w.params.data.processed_dir, clip_id)
    block = trajectory_block(w.edge, mel, language, tokens, w.params.models.max_new_tokens)
    dim = int(block.context[0].shape[-1])
    return {"id": clip_id, "x": token_rows(block, dim, w.edge.eos_token_id)}


def searched(params, params_path: str, clips: dict[str, list[dict]], settings: dict[str, CeilingSettings]
             ) -> dict[str, list[dict]]:
    """Every clip's curve, those searched before (same settings) read back from OUT."""
    OUT.mkdir(parents=True, exist_ok=True)
    out = {}
    pool = workers.Pool.for_stage(params, params_path, "gate_eval", fn=search_one)
    try:
        for lang, part in clips.items():
            path = OUT / f"search.{lang}.jsonl"
            key = json.dumps(dataclasses.asdict(settings[lang]), sort_keys=True)
            done = {r["id"]: r for r in read_jsonl(path) if r.get("key") == key} if path.exists() else {}
            jobs = [(c["id"], lang, c["references"], c.get("emotion"), dataclasses.asdict(settings[lang]))
                    for c in part if c["id"] not in done]
            for k, rec in enumerate(pool.imap(jobs), 1):
                append_jsonl(path, rec | {"key": key})
                done[rec["id"]] = rec
                if k % 50 == 0:
                    print(f"ceiling search {lang}: {k}/{len(jobs)}", flush=True)
            out[lang] = [done[c["id"]] for c in part]
    finally:
        pool.close()
    return out


def chosen_points(curves: list[dict], budget: float | None) -> list[dict]:
    """Each clip's point: its best caption, or the one `budget`'s allocation over the clips picks."""
    if budget is None:
        return [c["curve"][-1] for c in curves]
    at = allocate([[p["score"] for p in c["curve"]] for c in curves],
                  [[p["drafted"] for p in c["curve"]] for c in curves],
                  [[p["corrected"] for p in c["curve"]] for c in curves], budget)
    return [c["curve"][k] for c, k in zip(curves, at)]


def ceiling_table(params, params_path: str, curves: dict[str, list[dict]], budget: float | None
                  ) -> tuple[np.ndarray, pd.DataFrame]:
    """Rows along each clip's chosen caption and their labels (`critical`: the plan corrects it)."""
    points = {lang: chosen_points(c, budget) for lang, c in curves.items()}
    jobs = [(c["id"], lang, p["tokens"]) for lang in curves for c, p in zip(curves[lang], points[lang])]
    sent = {(c["id"]): set(p["sent_at"]) for lang in curves for c, p in zip(curves[lang], points[lang])}
    pool = workers.Pool.for_stage(params, params_path, "gate_eval", fn=rows_one)
    try:
        made = {r["id"]: r["x"] for r in pool.imap(jobs)}
    finally:
        pool.close()
    xs, labels = [], []
    for clip_id, lang, _ in jobs:
        x = made[clip_id]
        xs.append(x)
        labels.append(pd.DataFrame({"clip_id": clip_id, "language": lang, "pos": np.arange(len(x)),
                                    "critical": [k in sent[clip_id] for k in range(len(x))], "impact": 0.0}))
    return np.concatenate(xs).astype(np.float32), pd.concat(labels, ignore_index=True)


def fitted_gates(params, x_ceil: np.ndarray, y_ceil: pd.DataFrame, budgets, gates_dir: Path, seed: int) -> dict:
    """Each variant fitted (`seed`), and beside them the stage's own gates of STAGE as shipped; every
    one's thresholds per budget and language on the stage's validation traces (flagging that share
    of the tokens, as the stage's), written to `gates_dir`; name -> thresholds."""
    train, val = stage_traces(params)
    x_stage, x_val = features_of(train), features_of(val)
    if x_stage.shape[1] != x_ceil.shape[1]:
        raise SystemExit(f"the traces' rows have {x_stage.shape[1]} columns, the ceiling's {x_ceil.shape[1]}: trace "
                         "again with the current edge (dvc repro traces)")
    dim, eos = x_stage.shape[1] - len(TOKEN_SCALARS) - 1, end_token(train)
    g = params.gates
    models = {name: model_of(read_gate(gate_path(params, name)), name) for name in STAGE.values()}
    cols = ["clip_id", "language", "critical", "impact"]
    for name, kind, rows in VARIANTS:
        if rows == "ceiling":
            x, labels, weights = x_ceil, y_ceil, None
        else:
            stage_rows = np.ones(len(train), bool) if rows == "both" else \
                train["language"].map(MIXED).eq("stage").to_numpy()
            ceil_rows = np.ones(len(y_ceil), bool) if rows == "both" else \
                y_ceil["language"].map(MIXED).eq("ceiling").to_numpy()
            x = np.concatenate([x_stage[stage_rows], x_ceil[ceil_rows]])
            labels = pd.concat([train[cols][stage_rows], y_ceil[cols][ceil_rows]], ignore_index=True)
            weights = np.concatenate([impact_weights(train, g.impact_weight)[stage_rows], np.ones(ceil_rows.sum())])
        models[name] = fit_token_gate(x, labels, kind, "critical", dim, eos, seed, sample_weight=weights)
    out = {}
    for name, model in models.items():
        s = model.token_scores(x_val)
        thresholds = {str(b): {lang: threshold_for_share(s[(val["language"] == lang).to_numpy()], b)
                               for lang in sorted(val["language"].unique())} for b in budgets}
        write_gate(gates_dir / f"{name}{SUFFIX}", gate_document(model, name, thresholds, thresholds[str(budgets[0])],
                                                               budgets[0], g.verify))
        out[name] = thresholds
    return out


def decoded(scratch, pool, lang: str, name: str, threshold: float, rank: int, clips: list[dict],
            runs: Path) -> tuple[list[dict], Path]:
    """Gate `name` of the scratch gates folder at `threshold` on `clips`: its records and their file."""
    cfg = rank_config(scratch, lang, name, threshold, rank)
    path = runs / f"{name}-{lang}-{threshold:.6g}.jsonl"
    return run_config(cfg, clips, pool, path), path


def stage_run(params, gates: dict, scratch, pool, lang: str, name: str, budget: float, thresholds: dict,
              rank: int, clips: list[dict], runs: Path, reuse: bool) -> tuple[list[dict], Path]:
    """The stage's gate `name` at `budget`: with `reuse`, the gate evaluation's run where it made one;
    else decoded here at the threshold its validation scores give."""
    if reuse and str(budget) in gates["gates"][name]["thresholds"]:
        return stage_gate_run(params, lang, name, gates["gates"][name]["thresholds"][str(budget)][lang], rank)
    return decoded(scratch, pool, lang, name, thresholds[str(budget)][lang], rank, clips, runs)


def label_summary(curves: dict[str, list[dict]], y: pd.DataFrame, budget: float | None) -> dict:
    """Per language: the training clips searched, the rows and the share the plans correct."""
    out = {}
    for lang, c in curves.items():
        part = y[y["language"] == lang]
        points = chosen_points(c, budget)
        out[lang] = {"clips": len(c), "rows": int(len(part)), "sent": int(part["critical"].sum()),
                     "rho": sum(p["corrected"] for p in points) / max(sum(p["drafted"] for p in points), 1)}
    return out


def main() -> None:
    def more(ap):
        ap.add_argument("--clips", type=int, default=400, help="training clips per language the ceiling searches")
        ap.add_argument("--at", type=float, nargs="+", default=[0.05, 0.07, 0.1],
                        help="the budgets the test decodes at")
        ap.add_argument("--split", choices=("test", "val"), default="test",
                        help="the clips decoded: the test clips, or the validation clips the thresholds come from "
                             "(edge-only, cloud-only and the stage's gates then decoded here too)")
        ap.add_argument("--seed", type=int, default=None, help="the variants' fitting seed (default: params seed)")
        ap.add_argument("--label-budget", type=float, default=0.05,
                        help="label the point this budget's allocation over the training clips picks (0: each "
                             "clip's best caption)")
    args, params, gates = start(__doc__, more)
    args.seed = params.seed if args.seed is None else args.seed
    stem = "gate_ceiling_labels" + ("_val" if args.split == "val" else "") + \
        ("_best" if not args.label_budget else "") + \
        ("" if args.seed == params.seed else f"_seed{args.seed}")
    args.label_budget = args.label_budget or None
    ranks = {lang: gates.get("verify_rank", {}).get("chosen", {}).get(lang, default_rank(params))
             for lang in params.data.languages}
    test = {lang: eval_clips(params, lang)[: params.gates.eval_clips or None] for lang in params.data.languages}
    refs = {lang: references(params, lang, test[lang]) for lang in test}
    evaluated = test if args.split == "test" else {lang: trace_clips(params, "val", lang) for lang in test}
    settings = {lang: settings_for(params, ranks[lang], {k: interval(refs[lang][1], k)["value"]
                                                         - interval(refs[lang][0], k)["value"]
                                                         for k in ("bleu1", "emotion_hit_rate")})
                for lang in test}
    train_clips = {lang: trace_clips(params, "train", lang)[: args.clips] for lang in test}
    curves = searched(params, args.params, train_clips, settings)
    x_ceil, y_ceil = ceiling_table(params, args.params, curves, args.label_budget)
    labels = label_summary(curves, y_ceil, args.label_budget)
    print("ceiling labels:", json.dumps(labels))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        scratch = scratch_params(args.params, Path(tmp) / "models")
        sp = load_params(str(scratch))
        (Path(sp.models.dir) / "gates").mkdir()
        thresholds = fitted_gates(params, x_ceil, y_ceil, list(args.at), Path(sp.models.dir) / "gates", args.seed)
        for name in STAGE.values():  # the stage's thresholds come out of the same validation scores again
            for b, per in gates["gates"][name]["thresholds"].items():
                if b in thresholds[name] and per != thresholds[name][b]:
                    raise SystemExit(f"{name} at rho* {b}: thresholds {thresholds[name][b]} here, {per} in gates.json")
        pool = workers.Pool.for_stage(sp, str(scratch), "gate_eval")
        try:
            for lang, clips in evaluated.items():
                e_s, c_s = refs[lang] if args.split == "test" else \
                    (clip_stats(run_config(RunConfig(m, lang), clips, pool, runs / f"{m}-{lang}.jsonl"), clips, lang,
                                runs / f"{m}-{lang}.jsonl") for m in ("edge", "cloud"))
                for budget in args.at:
                    stage = {t: stage_run(params, gates, sp, pool, lang, n, budget, thresholds[n], ranks[lang], clips,
                                          runs, args.split == "test") for t, n in STAGE.items()}
                    stats = {t: clip_stats(recs, clips, lang, path) for t, (recs, path) in stage.items()}
                    for name, _, _ in VARIANTS:
                        made, path = decoded(sp, pool, lang, name, thresholds[name][str(budget)][lang],
                                             ranks[lang], clips, runs)
                        row = {"language": lang, "budget": budget, "gate": name, "clips": len(clips),
                               "rho": rho(made), "rho_critical": rho(stage["critical"][0]),
                               "rho_gain": rho(stage["gain"][0])}
                        row |= paired_columns(e_s, c_s, {"variant": clip_stats(made, clips, lang, path)} | stats,
                                              ("variant", "critical"))
                        rows.append(row)
        finally:
            pool.close()
    write_report(Path(args.out), stem,
                 {"clips": args.clips, "label_budget": args.label_budget, "seed": args.seed, "ranks": ranks, "labels": labels,
                  "rows": rows}, report_lines(args, labels, rows))


def report_lines(args, labels: dict, rows: list[dict]) -> list[str]:
    where = "each clip's best caption" if args.label_budget is None else \
        f"the point rho* {args.label_budget:g}'s allocation picks"
    clips = "test clips" if args.split == "test" else \
        "validation clips the thresholds come from (edge-only, cloud-only and the stage's gates decoded here)"
    lines = ["# Token gates trained on the ceiling's choices" + (" (validation clips)" if args.split == "val" else "")
             + "\n",
             f"Made by `python benchmarks/gate_ceiling_labels.py --clips {args.clips} --at "
             f"{' '.join(f'{b:g}' for b in args.at)} --split {args.split} --seed {args.seed} "
             f"--label-budget {args.label_budget or 0:g}`. "
             f"The ceiling's search on the first {args.clips} training clips per language; rows along {where}, "
             "labelled 1 where its plan sends the cloud's correction. `ceiling`: fitted on those rows alone; "
             "`ceilcrit`: those rows added to the stage's own (critical labels, impact weights); `mixed`: the "
             "stage's own en rows and the ceiling's zh rows. Thresholds on the stage's validation traces; flagged "
             "tokens judged by the stage's R. The stage's gates at a budget its gate evaluation did not run "
             "(every budget on validation): decoded here at the threshold their validation scores give. Share of "
             f"the edge -> cloud gap closed on the {clips}, % [95% paired-bootstrap CI over the clips]; the "
             "variant minus the stage's tok-lightgbm-critical, points, paired.\n"]
    for lang, d in labels.items():
        lines.append(f"- {lang}: {d['clips']} clips, {d['rows']} rows, {d['sent']} sent by the plans "
                     f"(rho {d['rho']:.3f} on those captions)")
    lines += ["", "| lang | rho* | gate | rho (critical / gain) | BLEU-1 share | BLEU-1 share critical | "
              "BLEU-1 share gain | BLEU-1 minus critical | emotion share | emotion share critical | "
              "emotion share gain | emotion hit minus critical |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['language']} | {r['budget']:g} | {r['gate']} | {r['rho']:.3f} ({r['rho_critical']:.3f}"
                     f" / {r['rho_gain']:.3f}) | "
                     + ci_cells(r, ("variant_share", "critical_share", "gain_share", "variant_minus_critical")) + " |")
    return lines


if __name__ == "__main__":
    main()
