"""DVC stage `promote`: the best learned gate on validation gets alias `champion` in the MLflow
registry if it beats the current champion at the same budget; the decision and why go to
reports/promotion.json and onto the model version."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from prefect import flow

from flows import stage_main
from speccap.config import load_params
from speccap.models.base import shared_vocab
from speccap.models.loading import load_role
from speccap.pipeline.gates import read_gates_json
from speccap.pipeline.promote import decide, evaluate_gate, validation_clips
from speccap.pipeline.saved import gate_from_saved, load_gate
from speccap.tracking import Tracker

OUT = Path("reports/promotion.json")


@flow(name="speccap-promote")
def promote_flow(params_path: str | None = None) -> dict:
    params = load_params(params_path)
    torch.set_num_threads(params.sweep.threads * max(params.sweep.workers, 1))
    gates_json = read_gates_json(params)
    edge, cloud = load_role(params, "edge"), load_role(params, "cloud")
    shared_vocab(edge, cloud)
    clips = validation_clips(params)
    budget = params.gates.promote_budget
    candidates = {}
    for name in dict.fromkeys(gates_json["chosen"].values()):  # per target, the classifier chosen on validation
        gate = load_gate(params, name)  # at the promote budget's threshold
        candidates[name] = evaluate_gate(edge, cloud, gate, params, clips) | {
            "gates_key": gates_json["gates_key"], "version": gates_json["versions"][name]}
    tracker = Tracker.for_stage(params.tracking.uri, params.tracking.experiment, "promote")
    name = params.gates.registry_name
    champ = tracker.champion(name)
    champ_score = None
    if champ is not None:
        saved = tracker.load_gate(name, "champion")
        champ_score = evaluate_gate(edge, cloud, gate_from_saved(saved, name="champion"), params, clips)
    decision = decide(candidates, champ, champ_score)
    if decision["promote"]:
        tracker.promote(name, candidates[decision["promote"]]["version"], decision["reason"])
    result = {"budget": budget, "candidates": candidates, "champion_before": champ, "champion_score": champ_score,
              **decision, "champion_after": tracker.champion(name)}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    stage_main(promote_flow, "promote")
