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
    """A small torch classifier with the scikit-learn calls the gate uses (fit, predict_proba)."""

    def __init__(self, hidden: int = 64, epochs: int = 60, lr: float = 3e-3, seed: int = 0, regression: bool = False):
        self.hidden, self.epochs, self.lr, self.seed, self.regression = hidden, epochs, lr, seed, regression

    def _net(self, d: int):
        import torch
        return torch.nn.Sequential(torch.nn.Linear(d, self.hidden), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                   torch.nn.Linear(self.hidden, 1))

    def fit(self, x: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None,
            sample_weight: np.ndarray | None = None):
        import torch
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
        # kept as numpy: the gate scores one token at a time, and a torch call per token costs ~1 ms
        self.weights = [net[0].weight.detach().numpy().T.copy(), net[0].bias.detach().numpy().copy(),
                        net[3].weight.detach().numpy().T.copy(), net[3].bias.detach().numpy().copy()]
        return self

    def _output(self, x: np.ndarray) -> np.ndarray:
        w1, b1, w2, b2 = self.weights
        h = np.maximum(((x - self.mean) / self.std).astype(np.float32) @ w1 + b1, 0.0)
        return (h @ w2 + b2)[:, 0]

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The regression's prediction, in the target's units."""
        return self._output(x) * self.scale

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        p = 1.0 / (1.0 + np.exp(-self._output(x)))
        return np.stack([1 - p, p], axis=1)


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


@dataclass
class TokenGateModel:
    """A fitted token classifier and the columns it reads (token_columns(dim))."""

    kind: str
    target: str
    dim: int  # edge hidden size
    eos: int  # the end token's id (its row has is_end = 1)
    clf: object
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

    def token_scores(self, x: np.ndarray) -> np.ndarray:
        # The loop scores one token at a time: the scikit-learn wrappers cost ~1 ms a call, so the
        # fitted models are applied directly (the same numbers, tested)
        x = np.asarray(x, dtype=np.float32)
        if self.kind == "lightgbm":
            return self.clf.booster_.predict(x, num_threads=1)
        if self.kind == "logistic":
            scaler, lr = self.clf[0], self.clf[-1]
            coef = lr.coef_.reshape(-1)  # (d,) for ridge, (1, d) for the logistic regression
            z = ((self._inputs(x) - scaler.mean_) / scaler.scale_) @ coef + float(np.ravel(lr.intercept_)[0])
            return z if self.regression else 1.0 / (1.0 + np.exp(-z))
        if self.regression:
            return self.clf.predict(self._inputs(x))
        return self.clf.predict_proba(self._inputs(x))[:, 1]


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
    model = TokenGateModel(kind, target, dim, eos, _classifier(kind, seed, regression))
    rate = "mean" if regression else "rate"
    model.meta = {"train_tokens": int(len(y)), f"train_{target}_{rate}": float(y.mean())}
    if kind == "lightgbm":  # the token id column as a category (by index: ids have no order)
        model.clf.fit(x, y, sample_weight=sample_weight, categorical_feature=[len(TOKEN_SCALARS)])
    elif kind == "mlp":
        model.clf.fit(model._inputs(x), y, groups=labels["clip_id"].to_numpy() if "clip_id" in labels else None,
                      sample_weight=sample_weight)
    else:
        step = "ridge" if regression else "logisticregression"
        model.clf.fit(model._inputs(x), y, **{f"{step}__sample_weight": sample_weight})
    return model


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
