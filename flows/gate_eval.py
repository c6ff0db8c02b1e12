"""DVC stage `gate_eval`: every gate at every budget on the test clips, as a Prefect flow; one
MLflow run per (gate, budget, language) under one parent; Pareto table and plot in reports/gates/."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow

from flows.sweep_runner import run_sweep
from speccap.config import load_params, materialize
from speccap.pipeline.gate_report import OUT, build_gate_report, gate_configs
from speccap.pipeline.gates import read_gates_json
from speccap.pipeline.sweep import eval_clips


@flow(name="speccap-gate-eval")
def gate_eval_flow(params_path: str | None = None, overrides: dict | None = None) -> dict:
    """`overrides`: dotted params keys on top of the file (a deployment's parameters)."""
    params_path = materialize(params_path, overrides)
    params = load_params(params_path)
    gates_json = read_gates_json(params)
    configs, tags = gate_configs(params, gates_json)
    n = params.gates.eval_clips
    clips = {lang: eval_clips(params, lang)[: n or None] for lang in params.data.languages}
    summary = run_sweep(params, params_path, "gate_eval", configs, clips, str(Path("reports/gate_runs")),
                        extra_fp=gates_json["gates_key"], run_tags=lambda c: tags.get(c, {}))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    result = build_gate_report(params, summary, OUT)
    return result


if __name__ == "__main__":
    print(json.dumps(gate_eval_flow(), indent=1))
