"""Training the token gates on the on-policy traces (the `gates` stage) and loading them for decoding.

For every (classifier, target) of params.gates: fit on the train traces (the critical target with
each critical token weighted by its impact, gates.impact_weight); on the validation traces
measure how well it ranks mismatches and critical mismatches (ROC AUC) and what share of the
quality its flags would buy at each budget (`captured`: the gain of the tokens it flags over the
gain of all, per language), draw its calibration, list its feature importances, and pick each
language's threshold for every budget rho* (the share of validation tokens it flags). Per target
one classifier is `chosen` (the one the test evaluation runs): for `critical` and `mismatch` the
best validation AUC on that target, for `gain` (a regression: no class to rank) the most gain
captured at gates.promote_budget, averaged over the languages. The first target of
gates.targets is the main one (`main_gate`): DAgger decodes with its chosen gate, the verify-R
choice and the test evaluation's full-size rows use it. The rule baselines get thresholds
for the same budgets from the same traces: `entropy` per token (at the temperature of
gates.entropy_temperatures whose flags capture the most validation gain at the budget:
`tune_entropy`), and `entropy-block` per block of
gates.traces.block_len tokens (UGSD's gate; the traces' caption cut into blocks as the loop would
draft them while it escalates nothing). Each learned gate is saved as a self-contained gate file,
models/gates/<name>.gate.json (gating.gate_file: the classifier, its thresholds per budget, how it
verifies, and "verify_rank" once the stage has chosen how strictly flagged tokens are judged:
pipeline.verify_rank).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import Params
from ..fanout import Background, usable_cores
from ..gating.features import TOKEN_SCALARS
from ..gating.gate_file import SUFFIX, gate_document, write_gate
from ..gating.learned import rule_token_scores, threshold_for_budget
from ..gating.token_gates import TokenGateModel, fit_token_gate, impact_weights, target_values, threshold_for_share
from .markdown import md_table
from .saved import gate_dir
from .traces import features_of

BLOCK_SUFFIX = "-block"
# trace rows from which the LightGBM fits go to a worker process: below, its start (a second or two)
# costs more than the fits
ASIDE_ROWS = 5_000


def learned_names(params: Params) -> list[str]:
    return [f"tok-{k}-{t}" for k in params.gates.kinds for t in params.gates.targets]


def main_gate(chosen: dict[str, str]) -> str:
    """The chosen gate of the main target: the first of gates.targets (`chosen` keeps their order)."""
    return next(iter(chosen.values()))


def captured(val: pd.DataFrame, scores: np.ndarray, budgets) -> dict[str, dict[str, float]]:
    """budget -> language -> the share of the validation tokens' gain (impact > 0) held by the tokens
    the gate flags at that budget's threshold: what its flags would buy, in the traces' terms."""
    gain = target_values(val, "gain")
    out = {str(b): {} for b in budgets}
    for lang in sorted(val["language"].unique()):
        mask = (val["language"] == lang).to_numpy()
        total = float(gain[mask].sum())
        for b in budgets:
            flagged = scores[mask] > threshold_for_share(scores[mask], b)
            out[str(b)][lang] = float(gain[mask][flagged].sum()) / total if total > 0 else 0.0
    return out


def roc_auc(y: np.ndarray, s: np.ndarray) -> float | None:
    from sklearn.metrics import roc_auc_score
    return float(roc_auc_score(y, s)) if 0 < np.sum(y) < len(y) else None


def importances(model: TokenGateModel) -> pd.DataFrame | None:
    """LightGBM's gain per column, or the logistic coefficients; the MLP has none to give."""
    found = model.importances()
    if found is None:
        return None
    cols, vals = found
    return pd.DataFrame({"feature": list(cols), "importance": vals}).sort_values("importance", key=np.abs,
                                                                                ascending=False)


def calibration_plot(curves: dict[str, tuple[np.ndarray, np.ndarray]], path: Path,
                     title: str = "token gate calibration (validation traces)",
                     ylabel: str = "observed rate of the target") -> None:
    """Reliability curves: for each name, (mean predicted probability, observed rate) per bin."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.plot([0, 1], [0, 1], "k:", lw=1)
    for name, (pred, frac) in curves.items():
        ax.plot(pred, frac, marker="o", label=name)
    ax.set_xlabel("predicted probability")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def end_token(traces: pd.DataFrame) -> int:
    """The edge's end token id, as the traces recorded it."""
    ends = traces["eos"].unique() if "eos" in traces.columns else []
    if len(ends) != 1:
        raise ValueError(f"the traces should name one end token (column 'eos'); found {list(ends)}: "
                         "trace again (dvc repro traces)")
    return int(ends[0])


def train_gates(params: Params, train: pd.DataFrame, val: pd.DataFrame, out_dir: Path | None = None) -> dict:
    """Fit, evaluate on validation, pick thresholds, save. Returns the gates.json content."""
    from sklearn.calibration import calibration_curve
    out = out_dir or gate_dir(params)
    out.mkdir(parents=True, exist_ok=True)
    g = params.gates
    x_train, x_val = features_of(train), features_of(val)
    dim = x_train.shape[1] - len(TOKEN_SCALARS) - 1
    eos = end_token(train)
    y = {t: val[t].to_numpy(bool) for t in ("mismatch", "critical")}
    result = {"budgets": list(g.budgets), "verify": g.verify, "gates": {}, "chosen": {}}
    curves = {}
    labels = train[[c for c in _LABEL_COLUMNS if c in train.columns]]
    weights = impact_weights(train, g.impact_weight) if g.impact_weight and "critical" in g.targets else None
    jobs = [(name, x_train, labels, dim, eos, params.seed, weights) for name in learned_names(params)]
    # LightGBM and the MLP fit on one thread each, the same bits in any process: the LightGBM gates
    # are fitted in a worker while this process fits the MLPs; the logistic ones come last, when their
    # BLAS threads have the cores to themselves (their sums depend on how many threads there are, which
    # every stage pins: speccap.kernels)
    kinds = {job[0]: job[0].split("-")[1] for job in jobs}
    aside = [job for job in jobs if kinds[job[0]] == "lightgbm"]
    beside = 1 if usable_cores() > 1 and len(train) >= ASIDE_ROWS else 0
    with Background(fit_gate, aside, beside, stage="gates",
                    key=lambda job: f"gate {job[0]}") as background:
        models = {job[0]: fit_gate(job) for job in jobs if kinds[job[0]] == "mlp"}
        models |= {job[0]: model for job, model in zip(aside, background.results())}
    models |= {job[0]: fit_gate(job) for job in jobs if job[0] not in models}
    for name in learned_names(params):
        _, kind, target = name.split("-", 2)
        model = models[name]
        s = model.token_scores(x_val)
        thresholds = _thresholds(val, s, g.budgets)
        if not model.regression:  # a probability: its reliability curve (a gain score is in points)
            pred, frac = calibration_curve(y[target], s, n_bins=8, strategy="quantile")
            curves[name] = (pred, frac)
        imp = importances(model)
        if imp is not None:
            imp.to_csv(out / f"{name}.importance.csv", index=False)
        entry = {"kind": kind, "target": target, "thresholds": thresholds, "auc_mismatch": roc_auc(y["mismatch"], s),
                 "auc_critical": roc_auc(y["critical"], s),
                 "captured": captured(val, s, sorted({*g.budgets, g.promote_budget})),
                 "top_features": [] if imp is None else imp["feature"].head(5).tolist(), **model.meta}
        write_gate(out / f"{name}{SUFFIX}", gate_document(
            model, name, thresholds, _thresholds(val, s, [g.promote_budget])[str(g.promote_budget)], g.promote_budget,
            g.verify))
        result["gates"][name] = entry
    for target in g.targets:
        named = [n for n in learned_names(params) if n.endswith(f"-{target}")]
        result["chosen"][target] = max(named, key=lambda n: _choice_key(result["gates"][n], target,
                                                                         g.promote_budget))
    for rule in g.baselines:
        s = rule_token_scores(pd.DataFrame(x_val[:, :len(TOKEN_SCALARS)], columns=TOKEN_SCALARS), rule)
        result["gates"][rule] = {"kind": "rule", "target": "-", "level": "token",
                                 "thresholds": _rule_units(rule, _thresholds(val, s, g.budgets)),
                                 "auc_mismatch": roc_auc(y["mismatch"], s), "auc_critical": roc_auc(y["critical"], s)}
        if rule == "entropy":  # at its tuned temperature; the thresholds at temperature 1 kept beside
            entry = result["gates"][rule]
            entry |= {"untuned_thresholds": entry["thresholds"]} | tune_entropy(val, g.budgets, g.entropy_temperatures)
        blocks = _block_thresholds(val, s, g.budgets, params.gates.traces.block_len)
        result["gates"][rule + BLOCK_SUFFIX] = {"kind": "rule", "target": "-", "level": "block",
                                                "thresholds": _rule_units(rule, blocks)}
    calibration_plot(curves, out / "calibration.png")
    (out / "gates.json").write_text(json.dumps(result, indent=1))
    return result


# the trace columns a gate's target and its held-out clips are read from (fit_token_gate)
_LABEL_COLUMNS = ("impact", "mismatch", "critical", "clip_id")


def fit_gate(job: tuple) -> TokenGateModel:
    """One learned gate fitted: (name, trace features, label columns, hidden size, end token, seed,
    the critical target's row weights or None)."""
    name, x, labels, dim, eos, seed, weights = job
    _, kind, target = name.split("-", 2)
    try:
        return fit_token_gate(x, labels, kind, target, dim, eos, seed,
                              sample_weight=weights if target == "critical" else None)
    except ValueError as exc:  # say where the traces are and what would give more of them
        raise ValueError(f"data/traces/train.parquet cannot train gate {name}: {exc} (trace more clips: "
                         "params gates.traces.train_clips, then dvc repro traces)") from exc


def tune_entropy(val: pd.DataFrame, budgets, temperatures) -> dict:
    """The per-token entropy baseline at its best temperature, per budget and language: among
    `temperatures`, the one whose flags at the budget capture the most of the validation tokens'
    gain (`captured`, the criterion the gain gates are chosen by; a tie goes to the temperature
    nearest 1). Returns its thresholds and temperatures, and what every temperature captured."""
    if "entropy_at" not in val.columns:
        raise ValueError("data/traces/val.parquet has no column entropy_at (each token's entropy at "
                         "params gates.entropy_temperatures): trace again (dvc repro traces)")
    at = np.stack(val["entropy_at"].to_numpy()).astype(float)
    if at.shape[1] != len(temperatures):
        raise ValueError(f"data/traces/val.parquet keeps the entropy at {at.shape[1]} temperatures, params "
                         f"gates.entropy_temperatures names {len(temperatures)}: trace again (dvc repro traces)")
    by_t = {float(t): captured(val, at[:, k], budgets) for k, t in enumerate(temperatures)}
    out = {"thresholds": {}, "temperature": {}, "captured_by_temperature": {f"{t:g}": c for t, c in by_t.items()}}
    for b in budgets:
        out["thresholds"][str(b)], out["temperature"][str(b)] = {}, {}
        for lang in sorted(val["language"].unique()):
            best = max(by_t, key=lambda t: (round(by_t[t][str(b)][lang], 12), -abs(np.log(t))))
            mask = (val["language"] == lang).to_numpy()
            k = list(by_t).index(best)
            out["thresholds"][str(b)][lang] = threshold_for_share(at[mask, k], b)
            out["temperature"][str(b)][lang] = best
    return out


def entropy_section(entry: dict) -> str:
    """gates.md's account of the entropy baseline's tuning: per budget and language the temperature
    chosen, and the validation gain its flags capture against temperature 1's."""
    by_t = entry["captured_by_temperature"]
    rows = []
    for b, per in entry["temperature"].items():
        for lang, t in per.items():
            raw = by_t.get("1", {}).get(b, {}).get(lang)
            rows.append([lang, b, f"{t:g}", "–" if raw is None else f"{100 * raw:.1f}",
                         f"{100 * by_t[f'{t:g}'][b][lang]:.1f}"])
    return ("## The entropy baseline's temperature (validation traces)\n\n"
            "The `entropy` rows score each token by the entropy of softmax(logits / T), with T chosen per budget and "
            f"language among {', '.join(by_t)} (`gates.entropy_temperatures`): the one whose flags at the budget "
            "hold the most of the validation tokens' gain, the criterion the gain gates are chosen by. Captured: "
            "the share (%) of that gain the flags hold.\n\n"
            + md_table(["lang", "budget rho*", "T", "captured at T = 1 %", "captured at T %"], rows) + "\n")


def _choice_key(entry: dict, target: str, budget: float) -> float:
    """How a target's classifiers are ranked on validation: AUC on the target's labels, or for the
    gain target (no labels to rank) the gain its flags capture at `budget`, mean over languages."""
    if target == "gain":
        per = entry["captured"][str(budget)]
        return float(np.mean(list(per.values()))) if per else 0.0
    return entry[f"auc_{target}"] or 0.0


def _rule_units(rule: str, thresholds: dict) -> dict:
    """Thresholds on the score scale back in the gate's own units (margin delta, log-prob)."""
    sign = -1.0 if rule in ("margin", "logprob") else 1.0
    return {b: {lang: sign * t for lang, t in per.items()} for b, per in thresholds.items()}


def _thresholds(val: pd.DataFrame, scores: np.ndarray, budgets) -> dict[str, dict[str, float]]:
    """budget -> language -> threshold flagging that share of the language's validation tokens."""
    out = {str(b): {} for b in budgets}
    for lang in sorted(val["language"].unique()):
        mask = (val["language"] == lang).to_numpy()
        for b in budgets:
            out[str(b)][lang] = threshold_for_share(scores[mask], b)
    return out


def _block_thresholds(val: pd.DataFrame, scores: np.ndarray, budgets, block_len: int) -> dict:
    """Block gates: blocks of `block_len` consecutive tokens of each traced caption, score = max."""
    df = val[["clip_id", "language", "pos"]].copy()
    df["block"] = df["pos"] // block_len
    df["score"] = scores
    out = {str(b): {} for b in budgets}
    for lang, part in df.groupby("language"):
        blocks = part.groupby(["clip_id", "block"]).agg(score=("score", "max"), size=("score", "size"))
        for b in budgets:
            out[str(b)][lang] = threshold_for_budget(blocks, b)
    return out


def read_gates_json(params: Params) -> dict:
    """What the `gates` stage wrote: thresholds per gate, budget and language, the gates key, versions."""
    path = gate_dir(params) / "gates.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no trained gates (run the `gates` stage first: dvc repro gates)")
    return json.loads(path.read_text())
