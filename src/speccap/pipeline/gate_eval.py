"""The `gate_eval` stage, start to end: the oracle, the ceiling (speccap.pipeline.ceiling), the
entropy baselines and the chosen token gates at every budget on the test clips; one MLflow run per
(gate, budget, language) under one parent; the table with intervals and the Pareto plot in
reports/gates/ (speccap.pipeline.gate_report). Edge-only and cloud-only come from the decode stage
(reports/references.json) when it holds the same clips (else they are captioned here). Under
cross-fitting (params data.cross_fit) each clip is decoded by the gates of its own fold and the
folds are pooled per gate (speccap.pipeline.crossfit)."""

from __future__ import annotations

import json
from pathlib import Path

from ..config import Params
from . import splits
from .ceiling import log_name, run_ceiling
from .crossfit import crossfit_configs, fold_clips, pool_folds
from .decode import REFERENCES
from .gate_report import OUT, build_gate_report, decode_references, gate_clips, gate_configs
from .gates import read_gates_json
from .splits import eval_clips, referenced_clips
from .sweep_run import SweepHooks, run_sweep
from .verify_rank import default_rank

RUNS = Path("reports/gate_runs")


def run_gate_eval(params: Params, params_path: str | None, hooks: SweepHooks | None = None) -> dict:
    """Decode every gate configuration (`hooks`: what the calling flow lends the sweep), add the
    ceiling rows, write reports/gates/ and return the report's summary."""
    gates_json = read_gates_json(params)
    n = params.gates.eval_clips
    crossfit = splits.active(params)
    if crossfit:  # each clip decoded by the gates of its own fold, which never saw it
        configs, tags = crossfit_configs(params, gates_json)
        clips = {lang: referenced_clips(params, lang)[: n or None] for lang in params.data.languages}
        clips_of = fold_clips(gate_clips(params, tags, clips))
    else:
        configs, tags = gate_configs(params, gates_json)
        clips = {lang: eval_clips(params, lang)[: n or None] for lang in params.data.languages}
        clips_of = gate_clips(params, tags, clips)
    reused = decode_references(REFERENCES, clips)
    have = {(r["method"], r["language"]) for r in reused}
    configs = [c for c in configs if (c.method, c.language) not in have]
    summary = run_sweep(params, params_path, "gate_eval", configs, clips_of, str(RUNS),
                        extra_fp=gates_json["gates_key"], run_tags=lambda c: tags.get(c, {}),
                        hooks=SweepHooks() if hooks is None else hooks,
                        keep_also=tuple(log_name(lang) for lang in clips))
    if crossfit:
        summary = pool_folds(summary, configs, tags, clips_of, RUNS)
    summary["configs"] += reused
    # the ceiling at each budget: judged by the R the oracle's flagged tokens are judged by
    chosen_ranks = gates_json.get("verify_rank", {}).get("chosen", {})
    summary["configs"] += run_ceiling(params, params_path, summary, clips,
                                      {lang: chosen_ranks.get(lang, default_rank(params)) for lang in clips}, RUNS)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    return build_gate_report(params, summary, OUT, gates_json.get("dagger"), gates_json.get("verify_rank"),
                             gates_json["gates"].get("entropy"))
