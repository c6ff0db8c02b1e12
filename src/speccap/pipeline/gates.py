"""Training the learned gates on the traces (the `gates` stage) and loading them for decoding.

For every (classifier, target) of params.gates: fit on the train traces; on the validation traces
measure how well it ranks mismatches and critical mismatches (ROC AUC), draw its calibration,
list its feature importances, and pick the threshold for every budget rho* (blocks scoring above
it hold rho* of the drafted tokens). The rule gates of `gates.baselines` get thresholds for the
same budgets from the same validation traces, so every gate is later compared at equal budget.
Each gate is saved as models/gates/<name>.pkl ({"model", "thresholds", "threshold"}).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import Params
from ..gating.features import FEATURES
from ..gating.learned import (GateModel, LearnedGate, block_table, fit_gate, rule_token_scores,
                              threshold_for_budget)


def gate_dir(params: Params) -> Path:
    return Path(params.models.dir) / "gates"


def learned_names(params: Params) -> list[str]:
    return [f"{k}-{t}" for k in params.gates.kinds for t in params.gates.targets]


def is_learned(name: str) -> bool:
    return name.startswith(("logistic-", "lightgbm-"))


def roc_auc(y: np.ndarray, s: np.ndarray) -> float | None:
    from sklearn.metrics import roc_auc_score
    return float(roc_auc_score(y, s)) if 0 < np.sum(y) < len(y) else None


def importances(model: GateModel) -> pd.DataFrame:
    clf = model.mismatch
    if hasattr(clf, "feature_importances_"):
        vals = np.asarray(clf.booster_.feature_importance("gain"), dtype=float)
    else:  # logistic regression on standardized features: the coefficients
        vals = np.asarray(clf[-1].coef_[0], dtype=float)
    return pd.DataFrame({"feature": FEATURES, "importance": vals}).sort_values(
        "importance", key=np.abs, ascending=False)


def calibration_plot(curves: dict[str, tuple[np.ndarray, np.ndarray]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.plot([0, 1], [0, 1], "k:", lw=1)
    for name, (pred, frac) in curves.items():
        ax.plot(pred, frac, marker="o", label=name)
    ax.set_xlabel("predicted P(mismatch)")
    ax.set_ylabel("observed mismatch rate")
    ax.set_title("gate calibration (validation traces)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def train_gates(params: Params, train: pd.DataFrame, val: pd.DataFrame, out_dir: Path | None = None) -> dict:
    """Fit, evaluate on validation, pick thresholds, save. Returns the gates.json content."""
    from sklearn.calibration import calibration_curve
    out = out_dir or gate_dir(params)
    out.mkdir(parents=True, exist_ok=True)
    g = params.gates
    x_val = val[list(FEATURES)].to_numpy(np.float32)
    y_mis = val["mismatch"].to_numpy(bool)
    y_crit = (val["critical"].fillna(0).to_numpy(float) > 0.5)
    result = {"budgets": list(g.budgets), "gates": {}}
    curves = {}
    for name in learned_names(params):
        kind, target = name.split("-", 1)
        model = fit_gate(train, kind, target, params.seed)
        s = model.token_scores(x_val)
        thresholds = _thresholds(val, s, g.budgets)
        pm = model.mismatch.predict_proba(x_val)[:, 1]
        pred, frac = calibration_curve(y_mis, pm, n_bins=8, strategy="quantile")
        curves[name] = (pred, frac)
        imp = importances(model)
        imp.to_csv(out / f"{name}.importance.csv", index=False)
        entry = {"kind": kind, "target": target, "thresholds": thresholds, "auc_mismatch": roc_auc(y_mis, s),
                 "auc_critical": roc_auc(y_crit, s), "top_features": imp["feature"].head(5).tolist(), **model.meta}
        with open(out / f"{name}.pkl", "wb") as fh:
            pickle.dump({"model": model, "thresholds": thresholds,
                         "threshold": _thresholds(val, s, [g.promote_budget])[str(g.promote_budget)], "name": name}, fh)
        result["gates"][name] = entry
    for rule in g.baselines:
        s = rule_token_scores(val, rule)
        result["gates"][rule] = {"kind": "rule", "target": "-",
                                 "thresholds": {b: {lang: _rule_threshold(rule, t) for lang, t in per.items()}
                                                for b, per in _thresholds(val, s, g.budgets).items()},
                                 "auc_mismatch": roc_auc(y_mis, s), "auc_critical": roc_auc(y_crit, s)}
    calibration_plot(curves, out / "calibration.png")
    (out / "gates.json").write_text(json.dumps(result, indent=1))
    return result


def _thresholds(val: pd.DataFrame, scores: np.ndarray, budgets) -> dict[str, dict[str, float]]:
    """budget -> language -> threshold, each language calibrated on its own validation blocks."""
    out = {str(b): {} for b in budgets}
    for lang in sorted(val["language"].unique()):
        mask = (val["language"] == lang).to_numpy()
        blocks = block_table(val[mask], scores[mask])
        for b in budgets:
            out[str(b)][lang] = threshold_for_budget(blocks, b)
    return out


def _rule_threshold(rule: str, score_threshold: float) -> float:
    """A threshold on the token-score scale back in the gate's own units (margin delta, log-prob)."""
    return -score_threshold if rule in ("margin", "logprob") else score_threshold


def read_gates_json(params: Params) -> dict:
    """What the `gates` stage wrote: thresholds per gate, budget and language, the gates key, versions."""
    path = gate_dir(params) / "gates.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no trained gates (run the `gates` stage first: dvc repro gates)")
    return json.loads(path.read_text())


def load_gate(params: Params, name: str, threshold: float | dict | None = None,
              cache: dict | None = None) -> LearnedGate:
    """A learned gate from models/gates/<name>.pkl, at `threshold` (default: the promote budget's,
    per language)."""
    path = gate_dir(params) / f"{name}.pkl"
    if cache is not None and path in cache:
        saved = cache[path]
    else:
        if not path.exists():
            raise FileNotFoundError(f"{path}: no trained gate {name!r} (run the `gates` stage: dvc repro gates)")
        with open(path, "rb") as fh:
            saved = pickle.load(fh)
        if cache is not None:
            cache[path] = saved
    return LearnedGate(saved["model"], saved["threshold"] if threshold is None else threshold, name)
