"""Learned gates: classifiers on the trace features, a block score, a threshold for a budget.

Two targets. `mismatch`: P(the cloud would replace this token). `critical`: P(mismatch) x
P(critical | mismatch), the second model trained on the first rejections of the traces, whose
impact is known: it escalates only the uncertain tokens whose repair matters (what the papers'
entropy gate cannot tell apart). Two classifiers: logistic regression (standardized features, the
simple baseline) and LightGBM. A block's score is the maximum over its tokens; the threshold is
picked on validation traces so that the blocks scoring above it hold a target share rho* of the
drafted tokens (the escalation budget).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..decoding.gates import ScoreGate
from ..decoding.stats import Block
from .features import FEATURES, block_features

KINDS = ("logistic", "lightgbm")
TARGETS = ("mismatch", "critical")


def make_classifier(kind: str, seed: int = 0):
    if kind == "logistic":
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
        return make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, class_weight="balanced"))
    if kind == "lightgbm":
        from lightgbm import LGBMClassifier
        return LGBMClassifier(n_estimators=200, learning_rate=0.05, num_leaves=15, min_child_samples=20,
                              subsample=0.8, subsample_freq=1, colsample_bytree=0.8, random_state=seed,
                              n_jobs=1, deterministic=True, force_row_wise=True, verbose=-1)
    raise ValueError(f"unknown gate classifier {kind!r} (expected one of {KINDS})")


@dataclass
class GateModel:
    """The classifier(s) behind a learned gate and what they predict."""

    kind: str
    target: str
    mismatch: object  # fitted classifier: P(mismatch | features)
    critical: object | None = None  # fitted classifier: P(critical | mismatch, features); None = constant
    critical_rate: float = 1.0  # P(critical | mismatch) in the traces, used when there is no second model
    meta: dict = field(default_factory=dict)

    def token_scores(self, x: np.ndarray) -> np.ndarray:
        p = self.mismatch.predict_proba(x)[:, 1]
        if self.target == "critical":
            p = p * (self.critical.predict_proba(x)[:, 1] if self.critical is not None else self.critical_rate)
        return p


def fit_gate(train: pd.DataFrame, kind: str, target: str, seed: int = 0) -> GateModel:
    """Fit on trace rows (gating.traces); raises if the traces cannot teach anything."""
    if target not in TARGETS:
        raise ValueError(f"unknown gate target {target!r} (expected one of {TARGETS})")
    x, y = train[list(FEATURES)].to_numpy(np.float32), train["mismatch"].to_numpy(bool)
    if y.all() or not y.any():
        raise ValueError(f"traces hold {len(y)} tokens, {int(y.sum())} mismatches: need both classes to train")
    model = GateModel(kind, target, make_classifier(kind, seed).fit(x, y))
    model.meta = {"train_tokens": int(len(y)), "train_mismatch_rate": float(y.mean())}
    if target == "critical":
        judged = train[train["first_reject"] & train["critical"].notna()]
        yc = judged["critical"].to_numpy(float) > 0.5
        model.critical_rate = float(yc.mean()) if len(yc) else 1.0
        model.meta.update(judged_mismatches=int(len(yc)), critical_rate=model.critical_rate)
        if 0 < yc.sum() < len(yc) and len(yc) >= 20:
            model.critical = make_classifier(kind, seed).fit(judged[list(FEATURES)].to_numpy(np.float32), yc)
    return model


def block_table(traces: pd.DataFrame, token_scores: np.ndarray) -> pd.DataFrame:
    """One row per traced block: its score (max over tokens) and its size in drafted tokens."""
    df = traces[["clip_id", "block"]].copy()
    df["score"] = token_scores
    return df.groupby(["clip_id", "block"], sort=False).agg(score=("score", "max"), size=("score", "size"))


def threshold_for_budget(blocks: pd.DataFrame, rho: float) -> float:
    """The threshold whose escalated blocks (score > threshold) hold about `rho` of the drafted
    tokens: blocks are taken from the highest score down until the budget is spent."""
    if not 0 < rho <= 1:
        raise ValueError(f"budget rho* must be in (0, 1], got {rho}")
    order = blocks.sort_values("score", ascending=False)
    share = order["size"].cumsum().to_numpy() / order["size"].sum()
    k = int(np.searchsorted(share, rho, side="left"))
    if k >= len(order) - 1:
        return float(order["score"].iloc[-1]) - 1e-9  # everything
    return float((order["score"].iloc[k] + order["score"].iloc[k + 1]) / 2)


def rule_token_scores(traces: pd.DataFrame, gate: str) -> np.ndarray:
    """Token scores of the rule gates, on the scale of their thresholds (block score = max), from
    a table with the columns entropy / margin / logprob (block or token traces)."""
    if gate == "entropy":
        return traces["entropy"].to_numpy(float)
    if gate == "margin":
        return -traces["margin"].to_numpy(float)
    if gate == "logprob":
        return -traces["logprob"].to_numpy(float)
    raise ValueError(f"no token score for gate {gate!r}")


class LearnedGate(ScoreGate):
    """Escalate a block when its highest token score is above the threshold: one number, or one
    per language ({"en": ..., "zh": ...}: the score distributions of the two languages differ, so a
    shared threshold would spend a different budget in each)."""

    def __init__(self, model: GateModel, threshold: float | dict, name: str | None = None):
        self.thresholds = dict(threshold) if isinstance(threshold, dict) else {}
        super().__init__(float(threshold) if not self.thresholds else max(self.thresholds.values()))
        self.model = model
        self.name = name or f"{model.kind}-{model.target}"

    def threshold_for(self, language: str) -> float:
        return self.thresholds.get(language, self.threshold)

    def score(self, block: Block) -> float:
        return float(self.model.token_scores(block_features(block)).max())

    def describe(self) -> dict:
        return {**super().describe(), "threshold": self.thresholds or self.threshold, "kind": self.model.kind,
                "target": self.model.target}
