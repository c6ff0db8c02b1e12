"""DVC stage `wisv_eval`: WISV against greedy and rank-R verification over the channels of
wisv.channels and the draft windows of wisv.block_lens, as a Prefect flow; one MLflow run per
configuration under one parent; the table, the deltas against greedy, the paper's numbers side by
side and the plot in reports/wisv/."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from prefect import flow

from flows import stage_main
from flows.sweep_hooks import sweep_hooks
from speccap.config import load_params, materialize
from speccap.pipeline import folds
from speccap.pipeline.folds import SHIPPED_VAL_FOLD, referenced_clips
from speccap.pipeline.saved import head_path
from speccap.pipeline.sweep import eval_clips
from speccap.pipeline.sweep_run import run_sweep
from speccap.pipeline.wisv import OUT, build_wisv_report, wisv_configs


@flow(name="speccap-wisv-eval")
def wisv_eval_flow(params_path: str | None = None, overrides: dict | None = None) -> dict:
    """`overrides`: dotted params keys on top of the file (a deployment's parameters)."""
    params_path = materialize(params_path, overrides)
    params = load_params(params_path)
    report_file = head_path(params).parent / "report.json"
    if not report_file.exists():
        raise FileNotFoundError(f"{report_file}: no trained WISV head (run the `wisv_head` stage first: "
                                "dvc repro wisv_head)")
    head = json.loads(report_file.read_text())
    n = params.wisv.eval_clips
    if folds.active(params):  # the head learned from every fold but the shipped validation fold: test on that one
        clips = {lang: [c for c in referenced_clips(params, lang) if c["fold"] == SHIPPED_VAL_FOLD][: n or None]
                 for lang in params.data.languages}
    else:
        clips = {lang: eval_clips(params, lang)[: n or None] for lang in params.data.languages}
    summary = run_sweep(params, params_path, "wisv_eval", wisv_configs(params), clips, str(Path("reports/wisv_runs")),
                        hooks=sweep_hooks())
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    result = build_wisv_report(params, summary, head, OUT)
    for name in ("head_vs_channel.png", "calibration.png"):  # the head's own plots, next to the evaluation's
        plot = head_path(params).parent / name  # (models/ is not in git)
        if plot.exists():
            shutil.copy(plot, OUT / name)
    return {k: result[k] for k in ("mean", "paper", "deltas")}


if __name__ == "__main__":
    stage_main(wisv_eval_flow, "wisv_eval")
