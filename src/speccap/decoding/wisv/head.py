"""WISV's decision head as a decoder uses it: the channel state it reads (CSI), the network
(DecisionHead) and its file (save_head, load_head). Training it is decoding/wisv/training.py's job; the rule
that asks it is decoding/wisv/rule.py."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..stats import CLOUD_SCALARS


@dataclass(frozen=True)
class CSI:
    uplink_mbps: float
    downlink_mbps: float
    rtt_ms: float
    per: float = 0.0  # packet error rate

    def __post_init__(self):
        if self.uplink_mbps <= 0 or self.downlink_mbps <= 0 or self.rtt_ms < 0 or not 0 <= self.per < 1:
            raise ValueError(f"bad channel state {self}")

    def vector(self) -> np.ndarray:
        """The head's CSI input, scaled to about unit range."""
        return np.array([math.log10(self.uplink_mbps), math.log10(self.downlink_mbps), self.rtt_ms / 100.0,
                         10.0 * self.per], dtype=np.float32)


class DecisionHead(nn.Module):
    """P(reject) of a mismatch from the edge's and the cloud's hidden states of the draft token, the
    CSI and (with `d_scalar`) the cloud's scalars about the token: 2 layers, ReLU, dropout, sigmoid.

    `rank` > 0: each hidden state goes through a learned projection to `rank` dimensions first, so
    a few thousand judged mismatches train a few thousand weights instead of tens of thousands
    (the raw concatenation, `rank` 0, learned its training traces and nothing else). Inputs are
    standardized with the training rows' means and spreads (kept as buffers, saved with the head).

    `factored`: the two questions the relabeled target mixes are asked apart. The network reads
    the token only (states and scalars, not the channel) and gives a criticality logit z, which
    train_head fits to the raw critical labels too; the channel adds a learned linear term, so
    P(reject) = sigmoid(z + w . CSI + b): a CSI-dependent threshold on one criticality score, the
    form of the relabeling's own rule (repair where the importance exceeds lambda(CSI)). Without
    it the network reads the CSI beside the token and learns only the relabeled target, where a
    third of the critical mismatches are labeled tolerable by the channel's draw."""

    def __init__(self, d_edge: int, d_cloud: int, d_csi: int = 4, hidden: int = 64, dropout: float = 0.1,
                 rank: int = 0, d_scalar: int = 0, factored: bool = False):
        super().__init__()
        self.dims = (d_edge, d_cloud, d_csi)
        self.rank, self.d_scalar, self.factored = rank, d_scalar, factored
        if rank:
            self.proj_edge = nn.Linear(d_edge, rank, bias=False)
            self.proj_cloud = nn.Linear(d_cloud, rank, bias=False)
        d_in = (2 * rank if rank else d_edge + d_cloud) + (0 if factored else d_csi) + d_scalar
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 1))
        if factored:
            self.channel = nn.Linear(d_csi, 1)
        for name, d in (("edge", d_edge), ("cloud", d_cloud), ("scalar", d_scalar)):
            self.register_buffer(f"{name}_mean", torch.zeros(d))
            self.register_buffer(f"{name}_std", torch.ones(d))

    def standardize_with(self, h_edge: np.ndarray, h_cloud: np.ndarray, scalars: np.ndarray | None) -> None:
        for name, x in (("edge", h_edge), ("cloud", h_cloud), ("scalar", scalars)):
            if x is not None and x.shape[1]:
                getattr(self, f"{name}_mean").copy_(torch.from_numpy(x.mean(0).astype(np.float32)))
                getattr(self, f"{name}_std").copy_(torch.from_numpy(x.std(0).astype(np.float32) + 1e-6))

    def inputs(self, h_edge: torch.Tensor, h_cloud: torch.Tensor, csi: torch.Tensor,
               scalars: torch.Tensor | None = None) -> torch.Tensor:
        """The network's input row: the (projected) states, the CSI unless factored, the scalars."""
        he = (h_edge - self.edge_mean) / self.edge_std
        hc = (h_cloud - self.cloud_mean) / self.cloud_std
        if self.rank:
            he, hc = self.proj_edge(he), self.proj_cloud(hc)
        parts = [he, hc] if self.factored else [he, hc, csi]
        if self.d_scalar:
            if scalars is None:
                raise ValueError(f"this WISV head also reads the cloud's {self.d_scalar} scalars about each token "
                                 f"({', '.join(CLOUD_SCALARS)})")
            parts.append((scalars - self.scalar_mean) / self.scalar_std)
        return torch.cat(parts, dim=-1)

    def both_logits(self, h_edge: torch.Tensor, h_cloud: torch.Tensor, csi: torch.Tensor,
                    scalars: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(decision logit, criticality logit). Unfactored, the two are one: the network's output."""
        z = self.net(self.inputs(h_edge, h_cloud, csi, scalars)).squeeze(-1)
        if not self.factored:
            return z, z
        return z + self.channel(csi).squeeze(-1), z

    def forward(self, h_edge: torch.Tensor, h_cloud: torch.Tensor, csi: torch.Tensor,
                scalars: torch.Tensor | None = None) -> torch.Tensor:
        return torch.sigmoid(self.both_logits(h_edge, h_cloud, csi, scalars)[0])

    def criticality(self, h_edge: torch.Tensor, h_cloud: torch.Tensor, csi: torch.Tensor,
                    scalars: torch.Tensor | None = None) -> torch.Tensor:
        """P(critical) of a factored head (the channel left out); an unfactored head's P(reject)."""
        return torch.sigmoid(self.both_logits(h_edge, h_cloud, csi, scalars)[1])


def save_head(head: DecisionHead, path: str | Path, meta: dict) -> None:
    """The head's weights and shape (<path>) and what it was trained on (<path>.json)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    d_edge, d_cloud, d_csi = head.dims
    meta = {"rank": head.rank, "d_scalar": head.d_scalar, "factored": head.factored, **meta}
    torch.save({"state": head.state_dict(), "dims": head.dims, "hidden": head.net[0].out_features,
                "dropout": head.net[2].p, "rank": head.rank, "d_scalar": head.d_scalar,
                "factored": head.factored}, path)
    path.with_suffix(".json").write_text(json.dumps({"d_edge": d_edge, "d_cloud": d_cloud, "d_csi": d_csi, **meta},
                                                    indent=1))


def load_head(path: str | Path) -> DecisionHead:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no WISV decision head (train one with the wisv_head stage: "
                                "dvc repro wisv_head)")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
        head = DecisionHead(*blob["dims"], hidden=blob["hidden"], dropout=blob["dropout"], rank=blob.get("rank", 0),
                            d_scalar=blob.get("d_scalar", 0), factored=blob.get("factored", False))
        # a head saved before the standardization buffers existed reads its inputs as they come
        missing, unexpected = head.load_state_dict(blob["state"], strict=False)
        if unexpected or any(not k.endswith(("_mean", "_std")) for k in missing):
            raise RuntimeError(f"weights do not fit: missing {missing}, unexpected {unexpected}")
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same clear message
        raise ValueError(f"{path}: not a WISV decision head ({type(exc).__name__}: {exc})") from None
    return head.eval()
