"""DVC stage `gates`: token gates trained on the on-policy traces, logged and registered in MLflow.

Every (classifier, target) of params.gates is fitted on the train traces, evaluated on the
validation traces (ROC AUC for mismatches and for critical mismatches, calibration plot, feature
importances) and given a threshold per budget; each one is logged as a pyfunc model (token
features in, scores and decisions out) and registered under gates.registry_name (promotion is
its own stage). With gates.dagger.rounds, the captions the loop commits under the chosen gate are
traced and the gates trained again with them (speccap.pipeline.dagger), round by round. Last, the
chosen critical gate decodes the validation clips once per R of gates.verify_ranks, and the R its
flagged tokens are judged by is chosen per language and written into every gate
(speccap.pipeline.verify_rank) before they are logged. Under cross-fitting (params data.cross_fit)
each fold's gates are trained too, without that fold (speccap.pipeline.crossfit).
"""

from __future__ import annotations

import hashlib
import json

import pandas as pd
from prefect import flow
from tqdm import tqdm

from flows import stage_main
from speccap.config import load_params
from speccap.gating.features import TOKEN_SCALARS, token_columns
from speccap.pipeline import folds
from speccap.pipeline.crossfit import train_fold_gates
from speccap.pipeline.dagger import dagger_rounds, total_clips
from speccap.pipeline.gates import learned_names, train_gates
from speccap.pipeline.saved import gate_dir, gate_path
from speccap.pipeline.traces import TRACE_DIR, features_of
from speccap.pipeline.verify_rank import choose_verify_rank, stamp_gates, total_captions
from speccap.tracking import Tracker


def _traces(split: str) -> pd.DataFrame:
    path = TRACE_DIR / f"{split}.parquet"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no traces (run the `traces` stage first: dvc repro traces)")
    return pd.read_parquet(path)


@flow(name="speccap-gates")
def gates_flow(params_path: str | None = None) -> dict:
    params = load_params(params_path)
    train, val = _traces("train"), _traces("val")
    result = train_gates(params, train, val)
    rounds = []
    if params.gates.dagger.rounds:
        bar = tqdm(total=total_clips(params), desc="dagger traces", unit="clip")
        try:
            result, rounds = dagger_rounds(params, params_path, train, val, result, progress=bar.update)
        finally:
            bar.close()
    result["dagger"] = rounds
    bar = tqdm(total=total_captions(params), desc="verify rank (validation)", unit="caption")
    try:
        result["verify_rank"] = choose_verify_rank(params, params_path, result, progress=bar.update)
    finally:
        bar.close()
    stamp_gates(params, result["verify_rank"]["chosen"])
    if folds.active(params):  # beside the shipped gates, each fold's: trained without it (gate_eval tests them)
        bar = tqdm(total=params.data.cross_fit.folds, desc="cross-fitted gates", unit="fold")
        try:
            result["cross_fit"] = train_fold_gates(params, train, val, result["verify_rank"]["chosen"], bar.update)
        finally:
            bar.close()
    out = gate_dir(params)
    key = hashlib.sha256(b"".join(gate_path(params, n).read_bytes() for n in learned_names(params))).hexdigest()[:12]
    result["gates_key"] = key
    (out / "gates.json").write_text(json.dumps(result, indent=1))
    tracker = Tracker.for_stage(params.tracking.uri, params.tracking.experiment, "gates")
    x = features_of(val.head(5))
    example = pd.DataFrame(x, columns=list(token_columns(x.shape[1] - len(TOKEN_SCALARS) - 1)))
    with tracker.sweep(f"gates-{key}", {"gates": params.gates.__dict__}, {"sweep_key": f"gates-{key}",
                                                                          "stage": "gates"}) as parent:
        for r in rounds:
            metrics = {f"{when}_auc_{t}": v for when in ("before", "after") for t, v in r[f"val_auc_{when}"].items()
                       if v is not None}
            metrics |= {f"val_{k}": v for k, v in r["traces"]["val"].items() if isinstance(v, (int, float))}
            tracker.log_config(parent, f"gates-{key}-dagger{r['round']}", f"dagger-round-{r['round']}",
                               {"round": r["round"], "gate": r["gate"]}, metrics)
        versions = {}
        for name in learned_names(params):
            g = result["gates"][name]
            metrics = {k: v for k, v in g.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            metrics |= {f"threshold_{b}_{lang}": t for b, per in g["thresholds"].items() for lang, t in per.items()}
            _, version = tracker.log_gate(
                params.gates.registry_name, name, gate_path(params, name), example,
                {"kind": g["kind"], "target": g["target"], "budgets": list(params.gates.budgets)}, metrics,
                artifacts=[out / f"{name}.importance.csv", out / "calibration.png"],
                tags={"gate": name, "gates_key": key}, parent_id=parent)
            versions[name] = version
    result["versions"] = versions
    (out / "gates.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    stage_main(gates_flow, "gates")
