"""Do the token gates do better at a low budget when their DAgger round runs at that budget?

The `gates` stage's DAgger round decodes train and validation clips with the main target's chosen
gate at the promote budget, traces the captions that loop committed and trains every gate again:
the gates learn the states a gate at the promote budget leads to. A gate that will run at a lower
budget corrects fewer tokens and leaves the edge's trajectory later; this script is the ablation.
It trains the first gates again on the stage's first traces (data/traces), runs the same DAgger
rounds with the round's gate at `--budget`'s thresholds (into a scratch models folder: the shipped
gates stay), stamps the R the stage chose per language, and decodes the test clips with the chosen
gate of each target it compares, at each budget of `--at`. Beside it: the stage's own gates from the
gate evaluation (reports/gate_runs). Share of the edge -> cloud gap closed (BLEU-1, emotion hit)
with 95% paired-bootstrap CIs and the paired difference. With `--budget` at the promote budget the
script makes the stage's own gates again (every difference 0: what tells the ablation apart from
the stage is the budget alone). Run after `dvc repro gate_eval`:

    python benchmarks/dagger_budget.py [--budget 0.05] [--at 0.05 0.1]   # -> reports/dagger_budget.md, .json
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

# the stages' kernels, set before numpy and torch load: the gates retrain to the bytes the stage made
from speccap.kernels import pin_kernels  # noqa: E402

pin_kernels()

import pandas as pd  # noqa: E402
import yaml  # noqa: E402
from gate_common import (  # noqa: E402
    ci_cells,
    clip_stats,
    paired_columns,
    references,
    rho,
    stage_gate_run,
    start,
    write_report,
)

from speccap.config import load_params  # noqa: E402
from speccap.pipeline.dagger import dagger_rounds  # noqa: E402
from speccap.pipeline.gates import train_gates  # noqa: E402
from speccap.pipeline.splits import eval_clips  # noqa: E402
from speccap.pipeline.sweep import run_config  # noqa: E402
from speccap.pipeline.traces import TRACE_DIR  # noqa: E402
from speccap.pipeline.verify_rank import default_rank, rank_config, stamp_gates  # noqa: E402
from speccap.pipeline.workers import Pool  # noqa: E402

TARGETS = ("gain", "critical")  # the main target and the critical one: the gates the README's rows hold


def scratch_params(params_path: str, models_dir: Path) -> Path:
    """A params file whose models folder is `models_dir`: the trained edge, cloud and tokenizer
    linked in, its gates folder empty (what the ablation trains goes there, not into models/gates)."""
    params = load_params(params_path)
    models_dir.mkdir(parents=True)
    for role in ("edge", "cloud", "tokenizer"):
        (models_dir / role).symlink_to((Path(params.models.dir) / role).resolve())
    raw = yaml.safe_load(Path(params_path).read_text(encoding="utf-8"))
    raw.setdefault("models", {})["dir"] = str(models_dir)
    out = models_dir.parent / "params.yaml"
    out.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return out


def retrained(params_path: Path, budget: float, stage_gates: dict) -> dict:
    """The first gates trained again on the stage's first traces, then the DAgger rounds with the
    round's gate at `budget`; the stage's verify R stamped into every gate file."""
    params = load_params(str(params_path))
    train = pd.read_parquet(TRACE_DIR / "train.parquet")
    val = pd.read_parquet(TRACE_DIR / "val.parquet")
    result = train_gates(params, train, val)
    result, rounds = dagger_rounds(params, str(params_path), train, val, result,
                                   out_dir=params_path.parent / "dagger", budget=budget)
    chosen = stage_gates.get("verify_rank", {}).get("chosen")
    if chosen:
        stamp_gates(params, chosen)
    return result | {"dagger": rounds}


def main() -> None:
    def more(ap):
        ap.add_argument("--budget", type=float, default=0.05, help="the budget the DAgger round's gate runs at")
        ap.add_argument("--at", type=float, nargs="+", default=[0.05, 0.1], help="the budgets the test decodes at")
    args, params, gates = start(__doc__, more)
    ranks = gates.get("verify_rank", {}).get("chosen", {})
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"  # the ablation's records: scratch, like its gates
        runs.mkdir()
        scratch = scratch_params(args.params, Path(tmp) / "models")
        ablation = retrained(scratch, args.budget, gates)
        sp = load_params(str(scratch))
        pool = Pool.for_stage(sp, str(scratch), "gate_eval")
        try:
            for lang in params.data.languages:
                clips = eval_clips(params, lang)[: params.gates.eval_clips or None]
                e_s, c_s = references(params, lang, clips)
                r = ranks.get(lang, default_rank(params))
                for target in TARGETS:
                    shipped, ours = gates["chosen"][target], ablation["chosen"][target]
                    for budget in args.at:
                        stage, found = stage_gate_run(
                            params, lang, shipped, gates["gates"][shipped]["thresholds"][str(budget)][lang], r)
                        new = rank_config(sp, lang, ours, ablation["gates"][ours]["thresholds"][str(budget)][lang], r)
                        path = runs / f"{lang}-{target}-{budget:g}-dagger{args.budget:g}.jsonl"
                        made = run_config(new, clips, pool, path)
                        row = {"language": lang, "target": target, "budget": budget, "stage_gate": shipped,
                               "ablation_gate": ours, "clips": len(clips), "rho_stage": rho(stage),
                               "rho_ablation": rho(made)}
                        row |= paired_columns(e_s, c_s, {"ablation": clip_stats(made, clips, lang, path),
                                                         "stage": clip_stats(stage, clips, lang, found)},
                                              ("ablation", "stage"))
                        rows.append(row)
        finally:
            pool.close()
    stage_budget = params.gates.promote_budget
    lines = [f"# DAgger at rho* {args.budget:g} against DAgger at the promote budget ({stage_budget:g})\n",
             f"Made by `python benchmarks/dagger_budget.py --budget {args.budget:g} --at "
             f"{' '.join(f'{b:g}' for b in args.at)}`. The stage's gates (DAgger round at rho* {stage_budget:g}, "
             f"from the gate evaluation's runs) against the same training run with the round's gate at rho* "
             f"{args.budget:g} (first gates, DAgger rounds, thresholds and chosen classifiers all from it); flagged "
             "tokens judged by the R the stage chose per language. Share of the edge -> cloud gap closed, % [95% "
             "paired-bootstrap CI over the test clips]; the difference ablation - stage in points, paired.\n",
             "| lang | target | rho* | gate stage / ablation | rho stage / ablation | BLEU-1 share ablation | "
             "BLEU-1 share stage | BLEU-1 ablation - stage | emotion share ablation | emotion share stage | "
             "emotion hit ablation - stage |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['language']} | {r['target']} | {r['budget']:g} | {r['stage_gate']} / {r['ablation_gate']} "
                     f"| {r['rho_stage']:.3f} / {r['rho_ablation']:.3f} | "
                     + ci_cells(r, ("ablation_share", "stage_share", "ablation_minus_stage")) + " |")
    write_report(Path(args.out), "dagger_budget", {"dagger_budget": args.budget, "stage_budget": stage_budget,
                                                   "ablation_chosen": ablation["chosen"], "rows": rows}, lines)


if __name__ == "__main__":
    main()
