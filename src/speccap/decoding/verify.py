"""Verification rules: the cloud's verdict on a drafted block, from ONE forward pass.

`rows` are the cloud's next-token logits before each draft token plus one after the last
(L + 1 rows): row i scores draft token i given everything before it. A verdict accepts a
prefix of the draft and supplies one token from the cloud: the correction of the first
rejected position, or, when the whole block is accepted, a bonus token from the last row
(free: the cloud computed it anyway). No token follows an accepted end-of-sequence.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Verdict:
    accepted: int
    token: int | None  # correction or bonus; None when the accepted block ended the caption
    corrected: bool  # the token replaces a rejected draft token
    ranks: list[int] = field(default_factory=list)  # cloud rank of each examined draft token
    # WISV: mismatches the decision head let through, and the positions whose edge hidden states
    # the cloud needed (the selective-hidden protocol asks the edge for exactly these)
    tolerated: int = 0
    asked: list[int] = field(default_factory=list)


def cloud_rank(row: torch.Tensor, token: int) -> int:
    """1 + how many tokens the cloud scores strictly higher than `token`."""
    return int((row > row[token]).sum()) + 1


class Rule(ABC):
    name = "rule"
    needs_q = False  # whether the edge must send its draft distributions
    # Q-S / S-Q: the edge sends edge_distribution(p) instead of p, and samples from it when True
    edge_distribution = None
    sample_quantized = False
    # WISV: the edge sends each drafted token's last hidden state, the cloud's verify forward keeps
    # its own, and the verdict comes from verify_hidden (with the channel state) instead of verify
    needs_hidden = False

    def q_payload(self, q: list[torch.Tensor]) -> bytes:
        """The draft distributions as they travel after a VERIFY: dense float16 rows (the cost Q-S attacks)."""
        from .packets import q_payload
        return q_payload(q, "float16")

    @abstractmethod
    def verify(self, draft: list[int], rows: torch.Tensor, q: list[torch.Tensor] | None, eos: int,
               rng: np.random.Generator | None) -> Verdict:
        ...

    def describe(self) -> dict:
        return {"rule": self.name}


class Rank(Rule):
    """UGSD eq. 3-4: accept while the draft token's rank under the cloud is <= R; the first
    violator is replaced by the cloud's argmax. R = 1 is greedy verification."""

    def __init__(self, r: int = 20):
        if r < 1:
            raise ValueError(f"rank rule needs R >= 1, got {r}")
        self.r = int(r)
        self.name = "greedy" if self.r == 1 else "rank"

    def verify(self, draft, rows, q, eos, rng) -> Verdict:
        ranks = []
        for i, tok in enumerate(draft):
            rank = cloud_rank(rows[i], tok)
            ranks.append(rank)
            if rank > self.r:
                return Verdict(i, int(torch.argmax(rows[i])), True, ranks)
        if draft and draft[-1] == eos:
            return Verdict(len(draft), None, False, ranks)
        return Verdict(len(draft), int(torch.argmax(rows[len(draft)])), False, ranks)

    def describe(self) -> dict:
        return {"rule": self.name, "rank": self.r}


class SpecSampling(Rule):
    """Leviathan et al. / Chen et al.: accept d with probability min(1, p(d) / q(d)); on rejection
    sample from norm(max(p - q, 0)); the output is distributed exactly as the cloud's p."""

    name = "spec_sampling"
    needs_q = True

    def __init__(self, temperature: float = 1.0):
        if temperature <= 0:
            raise ValueError("spec_sampling needs a temperature > 0")
        self.temperature = float(temperature)

    def _p(self, row: torch.Tensor) -> torch.Tensor:
        return torch.softmax(row.double() / self.temperature, dim=-1)

    def verify(self, draft, rows, q, eos, rng) -> Verdict:
        if q is None or len(q) != len(draft):
            raise ValueError("spec_sampling needs the draft distribution of every drafted token")
        ranks = []
        for i, tok in enumerate(draft):
            p = self._p(rows[i])
            ranks.append(cloud_rank(rows[i], tok))
            qi = q[i].double()
            if rng.random() >= min(1.0, float(p[tok] / qi[tok])):
                residual = torch.clamp(p - qi, min=0)
                total = float(residual.sum())
                # p == q up to rounding: the residual is empty, and p itself is the right law
                law = residual / total if total > 1e-12 else p
                return Verdict(i, _sample(law, rng), True, ranks)
        if draft and draft[-1] == eos:
            return Verdict(len(draft), None, False, ranks)
        return Verdict(len(draft), _sample(self._p(rows[len(draft)]), rng), False, ranks)

    def describe(self) -> dict:
        return {"rule": self.name, "temperature": self.temperature}


def _sample(p: torch.Tensor, rng: np.random.Generator) -> int:
    p = p.numpy()
    return int(rng.choice(len(p), p=p / p.sum()))


def make_rule(name: str, rank: int = 20, temperature: float = 1.0, level: int = 16) -> Rule:
    if name == "wisv":
        raise ValueError("the wisv rule needs its trained decision head: build it with "
                         "speccap.decoding.wisv.WISV(load_head(path), tau) (the wisv_head stage trains one)")
    if name in ("qs", "sq"):
        from .qs import QuantizeSample, SampleQuantize
        return (QuantizeSample if name == "qs" else SampleQuantize)(level, temperature)
    if name == "greedy":
        return Rank(1)
    if name == "rank":
        return Rank(rank)
    if name == "spec_sampling":
        return SpecSampling(temperature)
    raise ValueError(f"unknown verification rule {name!r} (expected greedy, rank, spec_sampling, qs or sq)")


def rule_for_gate(rule: Rule, gate, language: str) -> Rule:
    """The rule a token gate's flagged tokens are judged by in `language`: rank-R with the gate's
    own R for it (`gate.verify_rank`, chosen on validation) when it has one and `rule` is of the
    rank family (greedy, rank); otherwise `rule` unchanged (a sampling or WISV rule is the caller's
    explicit choice, and a block gate has no R of its own)."""
    ranks = getattr(gate, "verify_rank", None) or {}
    if getattr(gate, "level", "block") != "token" or language not in ranks or not isinstance(rule, Rank):
        return rule
    return Rank(ranks[language])
