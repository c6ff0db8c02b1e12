"""Per-token uncertainty of a drafted block: what the gates and learned gates read."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class TokenStats:
    token: int
    entropy: float  # nats, of the edge's next-token distribution (eq. 1 of UGSD)
    top1: float  # probability of the most likely token
    margin: float  # top-1 minus top-2 probability
    logprob: float  # log-probability of the drafted token
    rank: int  # rank of the drafted token under the edge itself (1 = its argmax)


@dataclass
class Block:
    """A drafted block: the tokens, their edge statistics, and their edge distributions (for
    spec_sampling). `start` is the caption position of the first token."""

    start: int
    tokens: list[int] = field(default_factory=list)
    stats: list[TokenStats] = field(default_factory=list)
    q: list[torch.Tensor] = field(default_factory=list)  # (V,) probabilities the tokens were drawn from

    def __len__(self) -> int:
        return len(self.tokens)


def token_stats(logits: torch.Tensor, token: int, temperature: float = 1.0) -> tuple[TokenStats, torch.Tensor]:
    """Statistics of one drafted token and the distribution it was drawn from (softmax(logits / T))."""
    t = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits.double() / t, dim=-1)
    p = logp.exp()
    top2 = torch.topk(p, 2)
    lp = float(logp[token])
    rank = int((logp > lp).sum()) + 1
    entropy = float(-(p * logp).nan_to_num().sum())
    stats = TokenStats(token, entropy, float(top2.values[0]), float(top2.values[0] - top2.values[1]), lp, rank)
    return stats, p
