"""Learned token gates: classifiers on the on-policy traces that score each token as it is drafted.

Features (gating.features.token_rows): the edge's uncertainty about the token, its position, the
clip, the token's id and the edge's last-layer hidden state before it (the state that drafted it). Targets:

- `gain`: the quality points correcting it gains (the impact of gating.shadow, 0 where the cloud
  keeps the token or the correction loses), regressed: its score is the expected gain. A gate at
  a budget flags a fixed share of the tokens, so what it should rank by is what each flag is
  expected to buy; on the testbed's zh traces the critical tokens outnumber a 5% budget and their
  gains span 1 to 40 points (a cue word that commits the emotion against a synonym), which a
  yes/no target cannot tell apart;
- `critical`: P(the cloud would replace it AND the correction gains quality);
- `mismatch`: P(the cloud would replace it).

Three models (for `gain`, each one's least-squares counterpart):

- `logistic`: standardized scalars and hidden state, balanced classes (the linear baseline; ridge
  regression for `gain`);
- `lightgbm`: the same plus the token id as a categorical feature;
- `mlp`: one hidden layer in torch on the standardized inputs, early-stopped on a held-out tenth
  of the training clips.

A token is verified when its score is above the threshold of its language; the threshold for a
budget rho* flags rho* of the validation tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..decoding.stats import Block
from .features import TOKEN_SCALARS, token_columns, token_rows
from .learned import LearnedGate, threshold_for_budget

TOKEN_KINDS = ("logistic", "lightgbm", "mlp")
TOKEN_TARGETS = ("gain", "critical", "mismatch")
REGRESSION_TARGETS = ("gain",)


def target_values(labels: pd.DataFrame, target: str) -> np.ndarray:
    """What a gate of `target` learns per trace row: the gain in points (>= 0) or the yes/no label."""
    if target == "gain":
        return np.clip(labels["impact"].to_numpy(float), 0.0, None)
    return labels[target].to_numpy(bool)


class _MLP:
    """A small torch network fitted like a scikit-learn model; it scores through MLPScorer."""

    def __init__(self, hidden: int = 64, epochs: int = 60, lr: float = 3e-3, seed: int = 0, regression: bool = False):
        self.hidden, self.epochs, self.lr, self.seed, self.regression = hidden, epochs, lr, seed, regression

    def _net(self, d: int):
        import torch
        return torch.nn.Sequential(torch.nn.Linear(d, self.hidden), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                   torch.nn.Linear(self.hidden, 1))

    def fit(self, x: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None,
            sample_weight: np.ndarray | None = None):
        import torch
        # one thread, whatever the machine: then its sums cannot depend on how many there are (at this
        # size one is also the fastest), and the gates stage fits LightGBM on another core meanwhile
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._fit(torch, x, y, groups, sample_weight)
        finally:
            torch.set_num_threads(threads)

    def _fit(self, torch, x: np.ndarray, y: np.ndarray, groups: np.ndarray | None, sample_weight: np.ndarray | None):
        torch.manual_seed(self.seed)
        rng = np.random.default_rng(self.seed)
        self.scale = 1.0
        self.mean, self.std = x.mean(0), x.std(0) + 1e-6
        xs = (x - self.mean) / self.std
        # early stopping on a tenth of the training clips (whole clips: tokens of a clip are alike)
        groups = np.arange(len(y)) if groups is None else groups
        uniq = np.unique(groups)
        held = np.isin(groups, rng.choice(uniq, size=max(1, len(uniq) // 10), replace=False))
        if held.all() or not y[~held].any():
            held = np.zeros(len(y), bool)
        xt, yt = torch.from_numpy(xs[~held]).float(), torch.from_numpy(y[~held].astype(np.float32))
        xv, yv = torch.from_numpy(xs[held]).float(), torch.from_numpy(y[held].astype(np.float32))
        w = np.ones(len(y), np.float32) if sample_weight is None else np.asarray(sample_weight, np.float32)
        wt, wv = torch.from_numpy(w[~held]), torch.from_numpy(w[held])
        net = self._net(x.shape[1])
        if self.regression:  # squared error on the target in its own units (gain points)
            self.scale = float(yt.std()) or 1.0  # trained on target / scale: unit-sized outputs
            yt, yv = yt / self.scale, yv / self.scale
            elementwise = torch.nn.MSELoss(reduction="none")
        else:
            pos = float(yt.sum())
            elementwise = torch.nn.BCEWithLogitsLoss(
                pos_weight=torch.tensor(max(len(yt) - pos, 1.0) / max(pos, 1.0)), reduction="none")

        def loss_fn(out, target, weight):
            return (elementwise(out, target) * weight).sum() / weight.sum()
        opt = torch.optim.Adam(net.parameters(), lr=self.lr, weight_decay=1e-4)
        best, best_state, bad = np.inf, None, 0
        for _ in range(self.epochs):
            net.train()
            perm = torch.from_numpy(rng.permutation(len(yt)))
            for k in range(0, len(perm), 256):
                idx = perm[k:k + 256]
                opt.zero_grad()
                loss_fn(net(xt[idx]).squeeze(-1), yt[idx], wt[idx]).backward()
                opt.step()
            if not len(yv):
                continue
            net.eval()
            with torch.no_grad():
                val = float(loss_fn(net(xv).squeeze(-1), yv, wv))
            if val < best - 1e-4:
                best, best_state, bad = val, {k: v.clone() for k, v in net.state_dict().items()}, 0
            else:
                bad += 1
                if bad >= 6:
                    break
        if best_state is not None:
            net.load_state_dict(best_state)
        self.weights = [net[0].weight.detach().numpy().T.copy(), net[0].bias.detach().numpy().copy(),
                        net[3].weight.detach().numpy().T.copy(), net[3].bias.detach().numpy().copy()]
        return self


def _classifier(kind: str, seed: int, regression: bool = False):
    """The model of `kind`; with `regression`, its least-squares counterpart (same inputs and capacity)."""
    if kind == "logistic":
        from sklearn.linear_model import LogisticRegression, Ridge
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
        return make_pipeline(StandardScaler(), Ridge(alpha=10.0) if regression else
                             LogisticRegression(C=0.1, max_iter=3000, class_weight="balanced"))
    if kind == "lightgbm":
        from lightgbm import LGBMClassifier, LGBMRegressor
        return (LGBMRegressor if regression else LGBMClassifier)(
            n_estimators=300, learning_rate=0.04, num_leaves=15, min_child_samples=20, subsample=0.8,
            subsample_freq=1, colsample_bytree=0.5, reg_lambda=1.0, random_state=seed, n_jobs=1, deterministic=True,
            force_row_wise=True, verbose=-1)
    if kind == "mlp":
        return _MLP(seed=seed, regression=regression)
    raise ValueError(f"unknown token gate classifier {kind!r} (expected one of {TOKEN_KINDS})")


class LightGBMScorer:
    """A fitted LightGBM model, kept as LightGBM's own model text: the booster that scores is the
    one the text loads, so a gate read back from its file scores exactly as it did when trained."""

    format = "lightgbm-model-text"
    # each row walks the trees on its own: its score is the same bits in any batch (a matrix
    # product's is not: its sums are blocked by the batch's shape)
    exact_in_batch = True

    def __init__(self, model_text: str):
        import lightgbm
        self.model_text = model_text
        self.booster = lightgbm.Booster(model_str=model_text)

    def __reduce__(self):
        # sent between processes as its text: the receiver's booster is the one the text loads
        return (LightGBMScorer, (self.model_text,))

    def scores(self, x: np.ndarray) -> np.ndarray:
        return self.booster.predict(x, num_threads=1)

    def importances(self) -> np.ndarray:
        return np.asarray(self.booster.feature_importance("gain"), dtype=float)

    def to_json(self) -> dict:
        return {"format": self.format, "model": self.model_text}

    @classmethod
    def from_json(cls, d: dict) -> LightGBMScorer:
        return cls(d["model"])


class LinearScorer:
    """Standardized inputs times coefficients plus an intercept; through the logistic function for a
    classifier (the scikit-learn pipeline's numbers, applied directly: its wrappers cost ~1 ms a call)."""

    format = "linear"
    exact_in_batch = False

    def __init__(self, mean, scale, coef, intercept: float, logistic: bool):
        self.mean, self.scale = np.asarray(mean, dtype=float), np.asarray(scale, dtype=float)
        self.coef, self.intercept, self.logistic = np.asarray(coef, dtype=float), float(intercept), bool(logistic)

    def scores(self, x: np.ndarray) -> np.ndarray:
        z = ((x - self.mean) / self.scale) @ self.coef + self.intercept
        return 1.0 / (1.0 + np.exp(-z)) if self.logistic else z

    def importances(self) -> np.ndarray:
        return self.coef

    def to_json(self) -> dict:
        return {"format": self.format, "mean": self.mean.tolist(), "scale": self.scale.tolist(),
                "coef": self.coef.tolist(), "intercept": self.intercept, "logistic": self.logistic}

    @classmethod
    def from_json(cls, d: dict) -> LinearScorer:
        return cls(d["mean"], d["scale"], d["coef"], d["intercept"], d["logistic"])


class MLPScorer:
    """The MLP's standardization and two layers in float32 numpy (a torch call per token costs ~1 ms)."""

    format = "mlp-relu"
    exact_in_batch = False

    def __init__(self, mean, std, weights, scale: float, logistic: bool):
        f32 = np.float32
        self.mean, self.std = np.asarray(mean, dtype=f32), np.asarray(std, dtype=f32)
        self.weights = [np.asarray(w, dtype=f32) for w in weights]
        self.scale, self.logistic = float(scale), bool(logistic)

    def scores(self, x: np.ndarray) -> np.ndarray:
        w1, b1, w2, b2 = self.weights
        h = np.maximum(((x - self.mean) / self.std).astype(np.float32) @ w1 + b1, 0.0)
        out = (h @ w2 + b2)[:, 0]
        return 1.0 / (1.0 + np.exp(-out)) if self.logistic else out * self.scale

    def importances(self) -> None:
        return None

    def to_json(self) -> dict:
        return {"format": self.format, "mean": self.mean.tolist(), "std": self.std.tolist(),
                "weights": [w.tolist() for w in self.weights], "scale": self.scale, "logistic": self.logistic}

    @classmethod
    def from_json(cls, d: dict) -> MLPScorer:
        return cls(d["mean"], d["std"], d["weights"], d["scale"], d["logistic"])


SCORERS = {c.format: c for c in (LightGBMScorer, LinearScorer, MLPScorer)}


def scorer_of(kind: str, fitted, regression: bool):
    """The portable scorer of a fitted `_classifier(kind)`: what the gate keeps and ships."""
    if kind == "lightgbm":
        return LightGBMScorer(fitted.booster_.model_to_string())
    if kind == "logistic":
        scaler, lr = fitted[0], fitted[-1]
        return LinearScorer(scaler.mean_, scaler.scale_, lr.coef_.reshape(-1), np.ravel(lr.intercept_)[0],
                            logistic=not regression)
    if kind == "mlp":
        return MLPScorer(fitted.mean, fitted.std, fitted.weights, fitted.scale, logistic=not regression)
    raise ValueError(f"unknown token gate classifier {kind!r} (expected one of {TOKEN_KINDS})")


@dataclass
class TokenGateModel:
    """A token classifier, as the portable scorer of its fitted model, and the columns it reads
    (token_columns(dim))."""

    kind: str
    target: str
    dim: int  # edge hidden size
    eos: int  # the end token's id (its row has is_end = 1)
    scorer: LightGBMScorer | LinearScorer | MLPScorer
    meta: dict = field(default_factory=dict)
    level: str = "token"

    @property
    def columns(self) -> tuple[str, ...]:
        return token_columns(self.dim)

    @property
    def regression(self) -> bool:
        """A score in the target's units (expected gain points), not a probability."""
        return self.target in REGRESSION_TARGETS

    def _inputs(self, x: np.ndarray) -> np.ndarray:
        """logistic / mlp: without the raw token id (ids have no order); the token's uncertainty and
        the state that drafted it stand for it (LightGBM reads the id as a category)."""
        return np.delete(x, len(TOKEN_SCALARS), axis=1)

    @property
    def exact_in_batch(self) -> bool:
        """Whether a row's score is the same bits whichever rows are scored with it."""
        return self.scorer.exact_in_batch

    def token_scores(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        return self.scorer.scores(x if self.kind == "lightgbm" else self._inputs(x))

    def importances(self) -> tuple[tuple[str, ...], np.ndarray] | None:
        """(columns, LightGBM's gain or the linear coefficients) per column read; None for the MLP."""
        vals = self.scorer.importances()
        if vals is None:
            return None
        cols = self.columns if self.kind == "lightgbm" else self.columns[:len(TOKEN_SCALARS)] + \
            self.columns[len(TOKEN_SCALARS) + 1:]  # the linear model does not read the raw id
        return cols, vals


def fit_token_gate(x: np.ndarray, labels: pd.DataFrame, kind: str, target: str, dim: int, eos: int,
                   seed: int = 0, sample_weight: np.ndarray | None = None) -> TokenGateModel:
    """Fit on trace rows: `x` from token_rows, `labels` the per-token label table (gating.shadow).
    `sample_weight`: one weight per row (e.g. `impact_weights`)."""
    if target not in TOKEN_TARGETS:
        raise ValueError(f"unknown token gate target {target!r} (expected one of {TOKEN_TARGETS})")
    if target in REGRESSION_TARGETS and "impact" not in labels.columns:
        raise ValueError(f"target {target!r} learns the traces' impact column, which these traces lack: trace again "
                         "(dvc repro traces)")
    y = target_values(labels, target)
    regression = target in REGRESSION_TARGETS
    if (y > 0).all() or not (y > 0).any():
        what = "with a positive gain" if regression else f"{target} ones"
        raise ValueError(f"the traces hold {len(y)} tokens, {int((y > 0).sum())} {what}: need both classes "
                         "(trace more clips: params gates.traces.train_clips)")
    if sample_weight is not None and len(sample_weight) != len(y):
        raise ValueError(f"sample weights: {len(sample_weight)} for {len(y)} rows")
    clf = fit_estimator(x, labels, kind, target, seed, sample_weight)
    rate = "mean" if regression else "rate"
    return TokenGateModel(kind, target, dim, eos, scorer_of(kind, clf, regression),
                          {"train_tokens": int(len(y)), f"train_{target}_{rate}": float(y.mean())})


def fit_estimator(x: np.ndarray, labels: pd.DataFrame, kind: str, target: str, seed: int = 0,
                  sample_weight: np.ndarray | None = None):
    """The fitted scikit-learn, LightGBM or torch model of `kind` for `target` (checked by fit_token_gate)."""
    regression = target in REGRESSION_TARGETS
    y = target_values(labels, target)
    clf = _classifier(kind, seed, regression)
    if kind == "lightgbm":  # the token id column as a category (by index: ids have no order)
        return clf.fit(x, y, sample_weight=sample_weight, categorical_feature=[len(TOKEN_SCALARS)])
    inputs = np.delete(x, len(TOKEN_SCALARS), axis=1)
    if kind == "mlp":
        return clf.fit(inputs, y, groups=labels["clip_id"].to_numpy() if "clip_id" in labels else None,
                       sample_weight=sample_weight)
    step = "ridge" if regression else "logisticregression"
    return clf.fit(inputs, y, **{f"{step}__sample_weight": sample_weight})


def impact_weights(labels: pd.DataFrame, weight: float) -> np.ndarray:
    """Row weights for the `critical` target: a critical token weighs 1 + `weight` x its impact (the
    quality points correcting it gains), every other token 1. A budget of flags is then spent on
    the tokens that carry the gap (the quote's first word, the emotion word: tens of points) before
    those that pass the critical margin by little."""
    impact = np.clip(labels["impact"].to_numpy(float), 0.0, None)
    return np.where(labels["critical"].to_numpy(bool), 1.0 + weight * impact, 1.0)


def threshold_for_share(scores: np.ndarray, rho: float) -> float:
    """The threshold above which `rho` of the tokens score (the budget's share of flags): the block
    rule of gating.learned with every token a block of its own."""
    return threshold_for_budget(pd.DataFrame({"score": np.asarray(scores, dtype=float), "size": 1}), rho)


class LearnedTokenGate(LearnedGate):
    """Verify a token at once when its score is above its language's threshold (the thresholds
    and their description as for the block gates)."""

    needs_hidden = True

    def __init__(self, model: TokenGateModel, threshold: float | dict, name: str | None = None,
                 verify: str = "alone", verify_rank: dict[str, int] | None = None):
        super().__init__(model, threshold, name or f"tok-{model.kind}-{model.target}")
        self.at_token_level(verify)
        self.verify_rank = dict(verify_rank) if verify_rank else None

    def score(self, block: Block) -> float:
        return float(self.model.token_scores(token_rows(block, self.model.dim, self.model.eos)).max())

    def token_score(self, block: Block, i: int) -> float:
        return float(self.model.token_scores(token_rows(block, self.model.dim, self.model.eos, first=i)[:1])[0])
