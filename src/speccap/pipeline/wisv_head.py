"""WISV's head in the pipeline (stage `wisv_head`, start to end): its traces, its training and its
registration in MLflow.

Traces: every block verified greedily (rank 1: every mismatch is one WISV localizes), the edge's
and the cloud's last-layer hidden states kept at each block's first mismatch, judged critical or
not as for the learned gates (gating/traces.py); or, with wisv.labels: shadow, the token gates'
on-policy traces. Each traced caption is one episode, relabeled under `wisv.csi_draws` drawn
channels (decoding/wisv/training.py), and the head learns P(repair) from [edge hidden, cloud hidden, CSI].
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from ..config import Params
from ..decoding.stats import CLOUD_SCALARS
from ..decoding.wisv.head import save_head
from ..decoding.wisv.training import head_dataset, repair_budget, train_head
from ..gating.traces import TraceSettings, verifying_every_block
from ..tracking import Tracker
from .gates import calibration_plot, roc_auc
from .saved import head_path
from .traces import TRACE_DIR, collect, summary, trace_clips, trace_one, traces_key
from .workers import Pool

WISV_TRACE_DIR = Path("data/wisv_traces")


def trace_settings(params: Params):
    t = params.wisv.traces
    return TraceSettings(verifying_every_block(t.block_len, 1, params.models.max_new_tokens),
                         critical_margin=t.critical_margin, hidden=True)


def shadow_traces(params: Params) -> dict[str, pd.DataFrame]:
    """The on-policy traces of the `traces` stage (data/traces/{train,val}.parquet) as WISV's
    training rows (wisv.labels: shadow): every mismatch judged the way the deployed loop goes on,
    the emotion hit inside the impact, both states and the cloud's scalars kept (gating.shadow)."""
    out = {}
    for split in ("train", "val"):
        path = TRACE_DIR / f"{split}.parquet"
        if not path.exists():
            raise FileNotFoundError(f"{path}: no on-policy traces for WISV's head (wisv.labels: shadow): run the "
                                    "traces stage first (dvc repro traces)")
        df = pd.read_parquet(path)
        if "h_edge" not in df.columns:
            raise ValueError(f"{path}: these traces keep no WISV inputs at their mismatches (made before they "
                             "did): trace again (dvc repro traces)")
        out[split] = df
    return out


def judged(df: pd.DataFrame) -> pd.DataFrame:
    """The judged mismatches that carry hidden states (end-of-caption ones carry none)."""
    if "h_edge" not in df.columns:
        return df.iloc[0:0]
    return df[df["h_edge"].notna()]


def train_wisv_head(params: Params, train: pd.DataFrame, val: pd.DataFrame, out_dir: Path | None = None) -> dict:
    """Relabel, train, measure on validation, save the head and its plot. Returns the head's report."""
    import torch

    w = params.wisv
    opts = dict(csi_draws=w.csi_draws, kappa=w.kappa, temperature=w.policy_temperature, b_min=w.budget_min,
                b_max=w.budget_max)
    for split, df in (("train", train), ("validation", val)):
        if judged(df).empty:
            raise ValueError(f"the WISV {split} traces hold no judged mismatches with hidden states: trace more "
                             f"clips (wisv.traces.train_clips / val_clips) or check the models")
    tr = head_dataset(judged(train), np.random.default_rng(params.seed), **opts)
    va = head_dataset(judged(val), np.random.default_rng(params.seed + 1), **opts)
    if w.scalars and not tr["scalars"].shape[1]:
        where, again = ((TRACE_DIR, "dvc repro traces") if w.labels == "shadow" else
                        (WISV_TRACE_DIR, f"dvc repro wisv_head after removing {WISV_TRACE_DIR}"))
        raise ValueError(f"{where}: these traces lack the cloud's scalars about each mismatch (c_scalars): "
                         f"trace again ({again}), or set params wisv.scalars: false")
    head = train_head(tr["h_edge"], tr["h_cloud"], tr["csi"], tr["label"], w.epochs, w.lr, w.hidden, params.seed,
                      w.dropout, scalars=tr["scalars"] if w.scalars else None, rank=w.rank,
                      weight_decay=w.weight_decay, groups=tr["group"], patience=w.patience,
                      critical=tr["critical"], critical_weight=w.critical_weight)
    keys = ("h_edge", "h_cloud", "csi") + (("scalars",) if w.scalars else ())
    with torch.no_grad():
        decision, crit = head.both_logits(*(torch.from_numpy(va[k]) for k in keys))
        p_val, crit_val = torch.sigmoid(decision).numpy(), torch.sigmoid(crit).numpy()
        p_tr = head(*(torch.from_numpy(tr[k]) for k in keys)).numpy()
    reject = p_val >= w.tau
    crit = va["critical"] == 1
    lo, hi = np.quantile(va["quality"], [1 / 3, 2 / 3])
    poor, good = va["quality"] <= lo, va["quality"] >= hi
    report = {
        "train_rows": int(len(tr["label"])), "val_rows": int(len(va["label"])),
        "train_mismatches": int(len(judged(train))), "val_mismatches": int(len(judged(val))),
        "train_repair_share": float(tr["label"].mean()), "val_repair_share": float(va["label"].mean()),
        "val_critical_share": float(crit.mean()),
        "rank": w.rank, "scalars": w.scalars, "factored": head.factored,
        **{f"fit_{k}": v for k, v in head.history.items()},
        # what the cloud's scalars alone say of criticality (each as a score; its better direction)
        **_scalar_aucs(va),
        "train_auc": roc_auc(tr["label"], p_tr), "val_auc": roc_auc(va["label"], p_val),
        # the raw critical flags ranked by the head's criticality score (a factored head's, without
        # the channel term; otherwise its P(reject)) and by its decision
        "val_auc_critical": roc_auc(va["critical"], crit_val),
        "val_auc_decision_critical": roc_auc(va["critical"], p_val),
        # what the relabeled target allows at best: a head that knew each raw critical flag and
        # scored it by the channel's repair budget (the drawn relabeling is not predictable beyond that)
        "val_auc_ceiling": label_ceiling(va, opts["b_min"], opts["b_max"]),
        "val_accuracy": float((reject == (va["label"] == 1)).mean()), "tau": w.tau,
        # CSI-awareness: repairs asked for on poor vs good channels (labels, then the head)
        "label_repair_poor": float(va["label"][poor].mean()) if poor.any() else None,
        "label_repair_good": float(va["label"][good].mean()) if good.any() else None,
        "head_reject_poor": float(reject[poor].mean()) if poor.any() else None,
        "head_reject_good": float(reject[good].mean()) if good.any() else None,
        "head_reject_critical": float(reject[crit].mean()) if crit.any() else None,
        "head_reject_noncritical": float(reject[~crit].mean()) if (~crit).any() else None,
    }
    out = out_dir or head_path(params).parent
    save_head(head, out / "head.pt", {"report": report, "tau": w.tau})
    _quality_plot(va, p_val, w.tau, out / "head_vs_channel.png")
    _calibration_plot(va, p_val, out / "calibration.png")
    return report


def label_ceiling(va: dict, b_min: float, b_max: float) -> float | None:
    """AUC on the relabeled targets of the score critical x B(q): the raw critical flag known, the
    channel's repair budget B(q) (decoding.wisv.training.repair_budget) ordering the critical rows. Relabeling
    keeps a critical mismatch with a probability that rises with B(q) and with the importance of
    its neighbours (unknown when a head decides), so no head can rank the labels much better."""
    budget = np.array([repair_budget(q, b_min, b_max) for q in va["quality"]])
    return roc_auc(va["label"], va["critical"] * (1.0 + budget))


def _scalar_aucs(va: dict) -> dict:
    """Validation AUC of each cloud scalar alone on the raw critical labels (a baseline the head
    should beat; max(AUC, 1 - AUC): either direction may be the informative one)."""
    out = {}
    for k, name in enumerate(CLOUD_SCALARS[: va["scalars"].shape[1]]):
        auc = roc_auc(va["critical"], va["scalars"][:, k])
        out[f"val_auc_critical_{name}"] = None if auc is None else max(auc, 1 - auc)
    return out


def _calibration_plot(va: dict, p: np.ndarray, path: Path) -> None:
    """Reliability of P(reject) on validation against the repair labels and the raw critical flags,
    in deciles of the prediction (the token gates' plot)."""
    from sklearn.calibration import calibration_curve

    curves = {}
    for target, name in (("label", "relabeled (repair)"), ("critical", "raw critical")):
        y = va[target]
        if 0 < y.sum() < len(y):
            pred, frac = calibration_curve(y, p, n_bins=10, strategy="quantile")
            curves[name] = (pred, frac)
    path.parent.mkdir(parents=True, exist_ok=True)
    calibration_plot(curves, path, "WISV head calibration (validation)", "observed share")


def _quality_plot(va: dict, p: np.ndarray, tau: float, path: Path) -> None:
    """Repair share against channel quality: the relabeled labels and the head's decisions."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    bins = np.linspace(0, 1, 6)
    idx = np.clip(np.digitize(va["quality"], bins) - 1, 0, len(bins) - 2)
    mid = (bins[:-1] + bins[1:]) / 2
    crit = va["critical"] == 1
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for mask, name, style in ((crit, "critical", "-"), (~crit, "not critical", ":")):
        lab = [va["label"][(idx == b) & mask].mean() if ((idx == b) & mask).any() else np.nan for b in range(len(mid))]
        hd = [(p[(idx == b) & mask] >= tau).mean() if ((idx == b) & mask).any() else np.nan for b in range(len(mid))]
        ax.plot(mid, lab, "o" + style, color="C0", label=f"labels ({name})")
        ax.plot(mid, hd, "s" + style, color="C1", label=f"head, P >= {tau:g} ({name})")
    ax.set_xlabel("channel quality (CSI)")
    ax.set_ylabel("share of mismatches repaired")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("WISV: repairs against channel quality (validation)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- evaluation ----


def run_wisv_head(params: Params, params_path: str | None) -> dict:
    """The `wisv_head` stage, start to end: the judged mismatches (the `traces` stage's with
    wisv.labels: shadow, else traced here), the head trained and measured, logged and registered in
    MLflow; models/wisv/report.json is what it returns."""
    w = params.wisv
    if w.labels == "shadow":  # the on-policy traces of the `traces` stage, shared with the token gates
        tables = shadow_traces(params)
        WISV_TRACE_DIR.mkdir(parents=True, exist_ok=True)  # a DVC output either way (empty here)
        key_of_traces = traces_key(params)  # the traces stage's own key
    else:
        settings = trace_settings(params)
        tables = own_traces(params, params_path, settings)
        key_of_traces = traces_key(params, settings)
    report = train_wisv_head(params, tables["train"], tables["val"])
    report["labels"] = w.labels
    report["traces"] = summary(tables)
    path = head_path(params)
    key = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    report["head_key"] = key
    report["version"] = register_head(params, path, key, tables["val"], key_of_traces, report)
    (path.parent / "report.json").write_text(json.dumps(report, indent=1))
    return report


def register_head(params: Params, path: Path, key: str, val: pd.DataFrame, key_of_traces: str, report: dict) -> str:
    """The head logged as a pyfunc model (a few validation mismatches its input example) and
    registered under wisv.registry_name: its version."""
    w = params.wisv
    tracker = Tracker.for_stage(params.tracking.uri, params.tracking.experiment, "wisv_head")
    ex = judged(val).head(3)
    parts = [pd.DataFrame(ex["h_edge"].tolist()).add_prefix("e"), pd.DataFrame(ex["h_cloud"].tolist()).add_prefix("c"),
             pd.DataFrame([[1.3, 2.0, 0.05, 0.0]] * len(ex)).add_prefix("csi")]
    if w.scalars:
        parts.append(pd.DataFrame(ex["c_scalars"].tolist()).add_prefix("s"))
    example = pd.concat(parts, axis=1).astype("float32")
    metrics = {k: v for k, v in report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    _, version = tracker.log_wisv_head(
        w.registry_name, f"wisv-head-{key}", path, example,
        {"wisv": {k: v for k, v in w.__dict__.items() if k != "channels"}, "traces_key": key_of_traces},
        metrics, artifacts=[path.parent / "head_vs_channel.png", path.parent / "calibration.png",
                            path.with_suffix(".json")],
        tags={"stage": "wisv_head", "head_key": key})
    return version


def own_traces(params: Params, params_path: str | None, settings) -> dict:
    """wisv.labels: own. Every block verified greedily, both states at each block's first mismatch,
    judged by the cloud finishing (data/wisv_traces, resumable)."""
    w = params.wisv
    total = sum(len(trace_clips(params, s, lang, w.traces)) for s in ("train", "val") for lang in params.data.languages)
    pool = Pool.for_stage(params, params_path, "wisv_head", fn=trace_one)
    try:
        with tqdm(total=total, desc="wisv traces", unit="clip") as bar:
            tables = collect(params, pool, WISV_TRACE_DIR, progress=bar.update, settings=settings, counts=w.traces)
    finally:
        pool.close()
    for split, df in tables.items():
        df.to_parquet(WISV_TRACE_DIR / f"{split}.parquet", index=False)
    return tables
