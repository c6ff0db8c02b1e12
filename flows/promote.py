"""DVC stage `promote`: the best learned gate on validation (by the share of both gaps it closes,
against edge-only and cloud-only on the same clips) gets alias `champion` in the MLflow
registry if it beats the current champion at the same budget; the decision and why go to
reports/promotion.json and onto the model version. The champion ships as its gate file,
models/champion.gate.json (gating.gate_file, stamped with its registered name and version): the
very file the registry holds, which a device loads without MLflow (`speccap edge --gate FILE`)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from prefect import flow

from flows import stage_main
from speccap.config import load_params
from speccap.gating.gate_file import write_gate
from speccap.models.base import shared_vocab
from speccap.models.loading import load_role
from speccap.pipeline.gates import read_gates_json
from speccap.pipeline.promote import decide, evaluate_ends, evaluate_gate, validation_clips
from speccap.pipeline.saved import champion_path, gate_from_document, load_gate
from speccap.pipeline.workers import in_process
from speccap.project import portable_path
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
    decode = in_process(params, edge, cloud)
    ends = evaluate_ends(decode, params, clips)  # the gaps every gate is scored on
    candidates = {}
    for name in dict.fromkeys(gates_json["chosen"].values()):  # per target, the classifier chosen on validation
        gate = load_gate(params, name)  # at the promote budget's threshold
        candidates[name] = evaluate_gate(decode, gate, params, clips, ends) | {
            "gates_key": gates_json["gates_key"], "version": gates_json["versions"][name]}
    tracker = Tracker.for_stage(params.tracking.uri, params.tracking.experiment, "promote")
    name = params.gates.registry_name
    champ = tracker.champion(name)
    champ_score = None
    if champ is not None:
        champ_score = evaluate_gate(decode, gate_from_document(tracker.load_gate(name, "champion"), name="champion"),
                                    params, clips, ends)
    decision = decide(candidates, champ, champ_score)
    if decision["promote"]:
        tracker.promote(name, candidates[decision["promote"]]["version"], decision["reason"])
    shipped = write_gate(champion_path(params), tracker.load_gate(name, "champion"))
    result = {"budget": budget, "ends": ends, "candidates": candidates, "champion_before": champ, "champion_score": champ_score,
              **decision, "champion_after": tracker.champion(name), "shipped": portable_path(shipped)}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    stage_main(promote_flow, "promote")
