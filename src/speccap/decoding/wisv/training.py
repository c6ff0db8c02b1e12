"""WISV's training side: channel state, CSI-aware relabeling of critical mismatches, the decision head.

WISV tolerates a mismatch (the cloud's argmax differs from the draft) when a head, reading the
edge's and the cloud's last hidden states and the channel state (CSI), says a repair is not worth a
round. Its labels come from the traces' critical mismatches (the draft token costs quality), made
CSI-aware: on a poor channel fewer repairs are affordable, so some critical mismatches are relabeled
as tolerable, the least important first.

- smoothed importance of mismatch m: s_m = sum over mismatches m' of c_m' * kappa^|m - m'|
  (c: 1 if critical; positions in the caption), so clustered critical mismatches weigh more;
- channel quality q in [0, 1] from the CSI (uplink/downlink rate, RTT, packet error rate);
- repair budget B(q) = b_min + (b_max - b_min) q: the share of critical mismatches to repair;
- Lagrangian rule: repair where s_m > lambda (maximizes repaired importance under the budget); its
  entropy-regularized policy P(repair) = sigmoid((s_m - lambda) / T), drawn per critical mismatch,
  with lambda set so that the expected repaired share of the episode's critical mismatches is B;
- labels only relax: a critical mismatch may become tolerable, a tolerable one never critical;
- several CSI draws per episode, so the head sees each caption under several channels.

The rule that uses the head is decoding/wisv/rule.py; the traces with hidden states come from
gating/traces.py (TraceSettings.hidden); the wisv_head stage trains and registers the head
(pipeline/wisv_head.py) and the wisv_eval stage evaluates it over channels (pipeline/wisv.py).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from .head import CSI, DecisionHead


def channel_quality(csi: CSI, rate_lo: float = 0.1, rate_hi: float = 1000.0, rtt_scale_ms: float = 200.0) -> float:
    """A scalar in [0, 1]: the uplink rate on a log scale between rate_lo and rate_hi Mbps,
    discounted by RTT and loss. Increasing in the rates, decreasing in RTT and loss."""
    up = (math.log10(csi.uplink_mbps) - math.log10(rate_lo)) / (math.log10(rate_hi) - math.log10(rate_lo))
    down = (math.log10(csi.downlink_mbps) - math.log10(rate_lo)) / (math.log10(rate_hi) - math.log10(rate_lo))
    rate = min(max(0.75 * up + 0.25 * down, 0.0), 1.0)
    return rate * math.exp(-csi.rtt_ms / rtt_scale_ms) * (1.0 - csi.per)


def repair_budget(quality: float, b_min: float = 0.2, b_max: float = 1.0) -> float:
    if not 0 <= b_min <= b_max <= 1:
        raise ValueError("need 0 <= b_min <= b_max <= 1")
    return b_min + (b_max - b_min) * min(max(quality, 0.0), 1.0)


def smoothed_importance(positions, critical, kappa: float = 0.5) -> np.ndarray:
    """s_m = sum_m' c_m' kappa^|pos_m - pos_m'| over one episode's mismatches."""
    pos = np.asarray(positions, dtype=np.float64)
    c = np.asarray(critical, dtype=np.float64)
    if pos.shape != c.shape:
        raise ValueError("positions and critical flags must have the same length")
    if not 0 <= kappa < 1:
        raise ValueError(f"kappa must be in [0, 1), got {kappa}")
    return (kappa ** np.abs(pos[:, None] - pos[None, :]) * c[None, :]).sum(axis=1)


def repair_threshold(s_critical: np.ndarray, budget: float, temperature: float = 0.1) -> float:
    """lambda such that the policy sigmoid((s - lambda) / T) repairs, in expectation, the `budget`
    share of these critical mismatches (the Lagrange multiplier of the budget constraint; as T -> 0
    the top-`budget` share by importance). Found by bisection: the expected share falls with lambda."""
    s = np.asarray(s_critical, dtype=np.float64)
    if len(s) == 0:
        return math.inf
    if budget >= 1:
        return -math.inf
    if budget <= 0:
        return math.inf
    t = max(temperature, 1e-9)
    lo, hi = float(s.min()) - 50 * t, float(s.max()) + 50 * t
    for _ in range(100):
        mid = (lo + hi) / 2
        if repair_probability(s, mid, t).mean() > budget:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def repair_probability(s, lam: float, temperature: float = 0.1) -> np.ndarray:
    """sigmoid((s - lambda) / T); T -> 0 is the hard Lagrangian rule."""
    s = np.asarray(s, dtype=np.float64)
    if math.isinf(lam):
        return np.full_like(s, 0.0 if lam > 0 else 1.0)
    z = np.clip((s - lam) / max(temperature, 1e-9), -500, 500)  # exp() of more overflows; the result is 0 or 1
    return 1.0 / (1.0 + np.exp(-z))


def relabel(positions, critical, csi: CSI, rng: np.random.Generator, kappa: float = 0.5, temperature: float = 0.1,
            b_min: float = 0.2, b_max: float = 1.0) -> np.ndarray:
    """One episode's labels under one channel: 1 = repair (reject the draft), 0 = tolerate."""
    c = np.asarray(critical, dtype=bool)
    s = smoothed_importance(positions, c, kappa)
    lam = repair_threshold(s[c], repair_budget(channel_quality(csi), b_min, b_max), temperature)
    keep = rng.random(len(c)) < repair_probability(s, lam, temperature)
    return (c & keep).astype(np.int64)  # labels only relax


def draw_csi(rng: np.random.Generator, n: int) -> list[CSI]:
    """Channels for training: rates log-uniform 0.2-1000 Mbps (downlink >= uplink), RTT 1-200 ms,
    loss 0-5%."""
    out = []
    for _ in range(n):
        up = 10 ** rng.uniform(math.log10(0.2), 3)
        out.append(CSI(up, up * 10 ** rng.uniform(0, 1), 10 ** rng.uniform(0, math.log10(200)),
                       rng.uniform(0, 0.05)))
    return out


def _held_out(groups: np.ndarray | None, n: int, seed: int, share: float = 0.15) -> np.ndarray:
    """Rows of a `share` of the groups (whole captions: rows of one caption are alike), for early
    stopping; none without groups."""
    if groups is None or share <= 0:
        return np.zeros(n, bool)
    uniq = np.unique(groups)
    if len(uniq) < 5:
        return np.zeros(n, bool)
    rng = np.random.default_rng(seed)
    return np.isin(groups, rng.choice(uniq, size=max(1, int(len(uniq) * share)), replace=False))


def train_head(h_edge: np.ndarray, h_cloud: np.ndarray, csi: np.ndarray, labels: np.ndarray, epochs: int = 200,
               lr: float = 1e-2, hidden: int = 64, seed: int = 0, dropout: float = 0.1, scalars: np.ndarray | None = None,
               rank: int = 0, weight_decay: float = 0.0, groups: np.ndarray | None = None,
               patience: int = 0, critical: np.ndarray | None = None, critical_weight: float = 0.0) -> DecisionHead:
    """BCE with class balancing (positives weighted by negatives / positives), full batch, AdamW.
    With `groups` (a caption id per row) and `patience` > 0: early stopping on the rows of 15% of
    the captions, held out of training: the weights of the epoch with the lowest held-out loss are
    kept, and training stops `patience` epochs after it. `head.history` says what happened.

    `critical_weight` > 0 (with `critical`, the raw critical flag of each row) trains a factored
    head (DecisionHead.factored): its criticality logit also learns the raw flags, with this weight
    on that loss beside the relabeled target's."""
    torch.manual_seed(seed)
    y_all = np.asarray(labels, dtype=np.float32)
    factored = critical_weight > 0
    if factored:
        if critical is None or len(critical) != len(y_all):
            raise ValueError("a factored head (critical_weight > 0) needs the raw critical flag of every row")
        c_all = np.asarray(critical, dtype=np.float32)
    held = _held_out(groups, len(y_all), seed) if patience > 0 else np.zeros(len(y_all), bool)
    if held.all() or not y_all[~held].any() or y_all[~held].all():
        held = np.zeros(len(y_all), bool)
    fit = ~held
    pos = float(y_all[fit].sum())
    if pos == 0 or pos == fit.sum():
        raise ValueError("the head needs both repaired and tolerated mismatches to learn from")
    head = DecisionHead(h_edge.shape[1], h_cloud.shape[1], csi.shape[1], hidden, dropout, rank,
                        0 if scalars is None else scalars.shape[1], factored)
    head.standardize_with(h_edge[fit], h_cloud[fit], None if scalars is None else scalars[fit])

    def tensors(mask):
        t = [torch.from_numpy(np.ascontiguousarray(a[mask], dtype=np.float32)) for a in (h_edge, h_cloud, csi)]
        t.append(None if scalars is None else torch.from_numpy(np.ascontiguousarray(scalars[mask], dtype=np.float32)))
        return t, torch.from_numpy(y_all[mask]), torch.from_numpy(c_all[mask]) if factored else None

    def balanced_bce(y):
        p = float(y.sum())
        return nn.BCEWithLogitsLoss(pos_weight=torch.tensor((len(y) - p) / max(p, 1.0)))

    (xt, yt, ct), (xv, yv, cv) = tensors(fit), tensors(held)
    label_loss = balanced_bce(yt)
    crit_loss = balanced_bce(ct) if factored else None

    def loss_of(x, y, c):
        decision, crit = head.both_logits(*x)
        loss = label_loss(decision, y)
        return loss + critical_weight * crit_loss(crit, c) if factored else loss

    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    best, best_state, best_epoch, epoch = math.inf, None, 0, 0
    for epoch in range(1, epochs + 1):
        head.train()
        opt.zero_grad()
        loss = loss_of(xt, yt, ct)
        loss.backward()
        opt.step()
        if len(yv):
            head.eval()
            with torch.no_grad():
                val = float(loss_of(xv, yv, cv))
            if val < best - 1e-5:
                best, best_epoch = val, epoch
                best_state = {k: v.clone() for k, v in head.state_dict().items()}
            elif epoch - best_epoch >= patience:
                break
    if best_state is not None:
        head.load_state_dict(best_state)
    head.eval()
    head.history = {"epochs_run": epoch, "best_epoch": best_epoch if best_state is not None else epoch,
                    "held_out_rows": int(held.sum()), "held_out_loss": None if best_state is None else best}
    return head


def head_dataset(judged, rng: np.random.Generator, csi_draws: int = 4, kappa: float = 0.5, temperature: float = 0.1,
                 b_min: float = 0.2, b_max: float = 1.0) -> dict[str, np.ndarray]:
    """The head's training rows from the judged mismatches of traced captions (rows with `clip_id`,
    `pos`, `critical`, `h_edge`, `h_cloud`): every caption is an episode, relabeled under
    `csi_draws` drawn channels. Returns h_edge, h_cloud, csi (n, 4), the cloud's scalars (n, 4; from
    column `c_scalars`, (n, 0) without it), label, the raw critical flag, the channel quality and the
    caption each row comes from (group)."""
    out: dict[str, list] = {"h_edge": [], "h_cloud": [], "csi": [], "label": [], "quality": [], "critical": [],
                            "scalars": [], "group": []}
    for g, (_, ep) in enumerate(judged.groupby("clip_id", sort=False)):
        crit = ep["critical"].to_numpy(float) > 0.5
        pos = ep["pos"].to_numpy()
        he, hc = np.stack(ep["h_edge"].to_numpy()), np.stack(ep["h_cloud"].to_numpy())
        sc = np.stack(ep["c_scalars"].to_numpy()) if "c_scalars" in ep else np.zeros((len(ep), 0))
        for csi in draw_csi(rng, csi_draws):
            out["label"].append(relabel(pos, crit, csi, rng, kappa, temperature, b_min, b_max))
            out["h_edge"].append(he)
            out["h_cloud"].append(hc)
            out["scalars"].append(sc)
            out["csi"].append(np.repeat(csi.vector()[None], len(ep), axis=0))
            out["quality"].append(np.full(len(ep), channel_quality(csi)))
            out["critical"].append(crit.astype(np.int64))
            out["group"].append(np.full(len(ep), g))
    if not out["label"]:
        raise ValueError("no judged mismatches with hidden states to train the WISV head on")
    return {k: np.concatenate(v).astype(np.int64 if k in ("label", "critical", "group") else np.float32)
            for k, v in out.items()}
