"""The `wisv_eval` stage, start to end: WISV against greedy and rank-R verification over the
channels of wisv.channels and the draft windows of wisv.block_lens (speccap.pipeline.wisv builds
the configurations and the report); one MLflow run per configuration under one parent; the table,
the deltas against greedy, the paper's numbers side by side and the plot in reports/wisv/."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..config import Params
from . import splits
from .saved import head_path
from .splits import SHIPPED_VAL_FOLD, eval_clips, referenced_clips
from .sweep_run import SweepHooks, run_sweep
from .wisv import OUT, build_wisv_report, wisv_configs

RUNS = Path("reports/wisv_runs")


def run_wisv_eval(params: Params, params_path: str | None, hooks: SweepHooks | None = None) -> dict:
    """Decode every configuration (`hooks`: what the calling flow lends the sweep) and write
    reports/wisv/; the mean, the paper's numbers and the deltas are what it returns."""
    report_file = head_path(params).parent / "report.json"
    if not report_file.exists():
        raise FileNotFoundError(f"{report_file}: no trained WISV head (run the `wisv_head` stage first: "
                                "dvc repro wisv_head)")
    head = json.loads(report_file.read_text())
    n = params.wisv.eval_clips
    if splits.active(params):  # the head learned from every fold but the shipped validation fold: test on that one
        clips = {lang: [c for c in referenced_clips(params, lang) if c["fold"] == SHIPPED_VAL_FOLD][: n or None]
                 for lang in params.data.languages}
    else:
        clips = {lang: eval_clips(params, lang)[: n or None] for lang in params.data.languages}
    summary = run_sweep(params, params_path, "wisv_eval", wisv_configs(params), clips, str(RUNS),
                        hooks=SweepHooks() if hooks is None else hooks)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    result = build_wisv_report(params, summary, head, OUT)
    for name in ("head_vs_channel.png", "calibration.png"):  # the head's own plots, next to the evaluation's
        plot = head_path(params).parent / name  # (models/ is not in git)
        if plot.exists():
            shutil.copy(plot, OUT / name)
    return {k: result[k] for k in ("mean", "paper", "deltas")}
