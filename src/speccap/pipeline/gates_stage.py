"""The `gates` stage, start to end: token gates trained on the on-policy traces, logged and
registered in MLflow.

Every (classifier, target) of params.gates is fitted on the train traces, evaluated on the
validation traces (ROC AUC for mismatches and for critical mismatches, calibration plot, feature
importances) and given a threshold per budget (speccap.pipeline.gates); each one is logged as a
pyfunc model (token features in, scores and decisions out) and registered under
gates.registry_name (promotion is its own stage). With gates.dagger.rounds, the captions the loop
commits under the chosen gate are traced and the gates trained again with them
(speccap.pipeline.dagger), round by round. Last, the chosen critical gate decodes the validation
clips once per R of gates.verify_ranks, and the R its flagged tokens are judged by is chosen per
language and written into every gate (speccap.pipeline.verify_rank) before they are logged. Under
cross-fitting (params data.cross_fit) each fold's gates are trained too, without that fold
(speccap.pipeline.crossfit).
"""

from __future__ import annotations

import hashlib
import json

import pandas as pd
from tqdm import tqdm

from ..config import Params
from ..gating.features import TOKEN_SCALARS, token_columns
from ..tracking import Tracker
from . import splits
from .crossfit import train_fold_gates
from .dagger import dagger_rounds, total_clips
from .gates import learned_names, train_gates
from .saved import gate_dir, gate_path
from .traces import TRACE_DIR, features_of
from .verify_rank import choose_verify_rank, stamp_gates, total_captions


def read_traces(split: str) -> pd.DataFrame:
    """The `traces` stage's table of `split`."""
    path = TRACE_DIR / f"{split}.parquet"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no traces (run the `traces` stage first: dvc repro traces)")
    return pd.read_parquet(path)


def run_gates(params: Params, params_path: str | None) -> dict:
    """Train, choose, stamp and register the gates; models/gates/gates.json is what it returns."""
    train, val = read_traces("train"), read_traces("val")
    result = train_gates(params, train, val)
    rounds = []
    if params.gates.dagger.rounds:
        with tqdm(total=total_clips(params), desc="dagger traces", unit="clip") as bar:
            result, rounds = dagger_rounds(params, params_path, train, val, result, progress=bar.update)
    result["dagger"] = rounds
    with tqdm(total=total_captions(params), desc="verify rank (validation)", unit="caption") as bar:
        result["verify_rank"] = choose_verify_rank(params, params_path, result, progress=bar.update)
    stamp_gates(params, result["verify_rank"]["chosen"])
    if splits.active(params):  # beside the shipped gates, each fold's: trained without it (gate_eval tests them)
        with tqdm(total=params.data.cross_fit.folds, desc="cross-fitted gates", unit="fold") as bar:
            result["cross_fit"] = train_fold_gates(params, train, val, result["verify_rank"]["chosen"], bar.update)
    out = gate_dir(params)
    key = hashlib.sha256(b"".join(gate_path(params, n).read_bytes() for n in learned_names(params))).hexdigest()[:12]
    result["gates_key"] = key
    (out / "gates.json").write_text(json.dumps(result, indent=1))
    result["versions"] = register(params, result, rounds, features_of(val.head(5)))
    (out / "gates.json").write_text(json.dumps(result, indent=1))
    return result


def register(params: Params, result: dict, rounds: list[dict], x) -> dict[str, str]:
    """Each DAgger round and each learned gate logged under one parent run, every gate registered:
    gate name -> its registered version. `x`: a few validation feature rows, the models' input example."""
    key, out = result["gates_key"], gate_dir(params)
    tracker = Tracker.for_stage(params.tracking.uri, params.tracking.experiment, "gates")
    example = pd.DataFrame(x, columns=list(token_columns(x.shape[1] - len(TOKEN_SCALARS) - 1)))
    versions = {}
    with tracker.sweep(f"gates-{key}", {"gates": params.gates.__dict__}, {"sweep_key": f"gates-{key}",
                                                                          "stage": "gates"}) as parent:
        for r in rounds:
            metrics = {f"{when}_auc_{t}": v for when in ("before", "after") for t, v in r[f"val_auc_{when}"].items()
                       if v is not None}
            metrics |= {f"val_{k}": v for k, v in r["traces"]["val"].items() if isinstance(v, (int, float))}
            tracker.log_config(parent, f"gates-{key}-dagger{r['round']}", f"dagger-round-{r['round']}",
                               {"round": r["round"], "gate": r["gate"]}, metrics)
        for name in learned_names(params):
            g = result["gates"][name]
            metrics = {k: v for k, v in g.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            metrics |= {f"threshold_{b}_{lang}": t for b, per in g["thresholds"].items() for lang, t in per.items()}
            _, versions[name] = tracker.log_gate(
                params.gates.registry_name, name, gate_path(params, name), example,
                {"kind": g["kind"], "target": g["target"], "budgets": list(params.gates.budgets)}, metrics,
                artifacts=[out / f"{name}.importance.csv", out / "calibration.png"],
                tags={"gate": name, "gates_key": key}, parent_id=parent)
    return versions
