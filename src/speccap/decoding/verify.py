"""Verification rules: the cloud's verdict on a drafted block, from ONE forward pass.

`rows` are the cloud's next-token logits before each draft token plus one after the last
(L + 1 rows): row i scores draft token i given everything before it. A verdict accepts a
prefix of the draft and supplies one token from the cloud: the correction of the first
rejected position, or, when the whole block is accepted, a bonus token from the last row
(free: the cloud computed it anyway). No token follows an accepted end-of-sequence.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np
import torch

from ..models.generate import draw


@dataclass
class Verdict:
    accepted: int
    # correction or bonus; None when the accepted block ended the caption, or (an oracle at a
    # budget, Rank.max_corrections) when the accepted block gets no bonus and the edge goes on
    token: int | None
    corrected: bool  # the token replaces a rejected draft token
    ranks: list[int] = field(default_factory=list)  # cloud rank of each examined draft token
    # WISV: mismatches the decision head let through, and the positions whose edge hidden states
    # the cloud needed (the selective-hidden protocol asks the edge for exactly these)
    tolerated: int = 0
    asked: list[int] = field(default_factory=list)


def examined(accepted: int, n_draft: int) -> int:
    """How many draft positions a verdict examined: the accepted ones and the rejected one, if any
    (every rule stops at its rejection), which any transport's edge knows from the verdict alone."""
    return accepted + 1 if accepted < n_draft else n_draft


def cloud_rank(row: torch.Tensor, token: int) -> int:
    """1 + how many tokens the cloud scores strictly higher than `token`."""
    return int((row > row[token]).sum()) + 1


def cloud_ranks(rows: torch.Tensor, tokens: list[int]) -> list[int]:
    """cloud_rank(rows[i], tokens[i]) for every i, in one pass over the rows (a verdict reads the
    ranks of a whole block: one tensor operation, not one per token)."""
    if not tokens:
        return []
    scored = rows[: len(tokens)]
    own = scored.gather(1, torch.tensor(tokens, device=scored.device)[:, None])
    return ((scored > own).sum(1) + 1).tolist()


class Rule(ABC):
    name = "rule"
    needs_q = False  # whether the edge must send its draft distributions
    # Q-S / S-Q: the edge sends edge_distribution(p) instead of p, and samples from it when True
    edge_distribution = None
    sample_quantized = False
    # WISV: the edge sends each drafted token's last hidden state, the cloud's verify forward keeps
    # its own, and the verdict comes from verify_hidden (with the channel state) instead of verify
    needs_hidden = False

    def for_caption(self) -> "Rule":
        """The rule one caption's cloud session judges by: itself, unless it keeps count within a
        caption (Rank with a correction allowance), which starts every caption afresh."""
        return self

    @abstractmethod
    def verify(self, draft: list[int], rows: torch.Tensor, q: list[torch.Tensor] | None, eos: int,
               rng: np.random.Generator | None, ranks: list[int] | None = None) -> Verdict:
        """The verdict on `draft` from the cloud's `rows` (row i scores draft token i; one more after
        the last). `ranks`: `cloud_ranks(rows, draft)`, where the caller has them from its forward
        (models.base.fed_ranks); computed here otherwise."""

    def describe(self) -> dict:
        return {"rule": self.name}


class Rank(Rule):
    """UGSD eq. 3-4: accept while the draft token's rank under the cloud is <= R; the first
    violator is replaced by the cloud's argmax. R = 1 is greedy verification.

    `max_corrections` = k makes it the oracle at a budget: with gate `always` every token is
    judged, the first k violators of a caption are replaced and later ones are kept as drafted
    (counted as tolerated), and an accepted token gets no bonus token (`token` None, the caption
    not ended): every position is drafted by the edge, so the caption is what a gate that
    escalates exactly the first k tokens the cloud replaces would write, and corrected / drafted
    is its escalation rate. `plan` generalizes it: the violators replaced are those whose place in
    the order the caption meets them (0 = the first, replaced or not) is in the plan, so
    `max_corrections` = k is the plan {0, ..., k-1} (gating.ceiling searches plans). The count lives
    in the copy `for_caption` returns. Blocking loop only."""

    def __init__(self, r: int = 20, max_corrections: int | None = None, plan: frozenset[int] | None = None):
        if r < 1:
            raise ValueError(f"rank rule needs R >= 1, got {r}")
        if max_corrections is not None and max_corrections < 0:
            raise ValueError(f"a correction allowance must be >= 0, got {max_corrections}")
        if max_corrections is not None and plan is not None:
            raise ValueError("a correction allowance is the plan of the first k violators: give one of the two")
        self.r = int(r)
        self.name = "greedy" if self.r == 1 else "rank"
        self.max_corrections = max_corrections
        self.plan = frozenset(range(max_corrections)) if max_corrections is not None else \
            None if plan is None else frozenset(plan)
        self.met = 0  # violators this caption has met so far (for_caption starts each caption at 0)

    def for_caption(self) -> "Rank":
        if self.plan is None:
            return self
        return Rank(self.r, self.max_corrections, None if self.max_corrections is not None else self.plan)

    def verify(self, draft, rows, q, eos, rng, ranks=None) -> Verdict:
        seen, tolerated = [], 0
        for i, rank in enumerate(cloud_ranks(rows, draft) if ranks is None else ranks):
            seen.append(rank)
            if rank > self.r:
                met, self.met = self.met, self.met + 1
                if self.plan is None or met in self.plan:
                    return Verdict(i, int(torch.argmax(rows[i])), True, seen, tolerated=tolerated)
                tolerated += 1  # not in the plan: the edge's token stands
        if (draft and draft[-1] == eos) or self.plan is not None:  # ended, or no bonus (an oracle's plan)
            return Verdict(len(draft), None, False, seen, tolerated=tolerated)
        return Verdict(len(draft), int(torch.argmax(rows[len(draft)])), False, seen, tolerated=tolerated)

    def describe(self) -> dict:
        out = {"rule": self.name, "rank": self.r}
        if self.max_corrections is not None:
            out["max_corrections"] = self.max_corrections
        elif self.plan is not None:
            out["plan"] = sorted(self.plan)
        return out


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

    def verify(self, draft, rows, q, eos, rng, ranks=None) -> Verdict:
        if q is None or len(q) != len(draft):
            raise ValueError("spec_sampling needs the draft distribution of every drafted token")
        # the block's laws and ranks in one tensor operation each (a row gets the numbers it gets
        # alone); each token's test then reads plain floats
        laws = self._p(rows[: len(draft) + 1])
        p_draft = laws[list(range(len(draft))), draft].tolist()
        all_ranks = cloud_ranks(rows, draft) if ranks is None else list(ranks)
        for i, tok in enumerate(draft):
            q_tok = float(q[i][tok])  # 0 only where a float16 q underflowed: then accepted, p / 0 being inf
            if rng.random() >= min(1.0, p_draft[i] / q_tok if q_tok else math.inf):
                ranks = all_ranks[: i + 1]
                p, qi = laws[i].cpu(), q[i].double().cpu()  # (a GPU's law: drawn on the CPU)
                residual = torch.clamp(p - qi, min=0)
                total = float(residual.sum())
                # p == q up to rounding: the residual is empty, and p itself is the right law
                law = residual / total if total > 1e-12 else p
                return Verdict(i, draw(law, rng), True, ranks)
        if draft and draft[-1] == eos:
            return Verdict(len(draft), None, False, all_ranks)
        return Verdict(len(draft), draw(laws[len(draft)], rng), False, all_ranks)

    def describe(self) -> dict:
        return {"rule": self.name, "temperature": self.temperature}




def rule_for_gate(rule: Rule, gate, language: str) -> Rule:
    """The rule a token gate's flagged tokens are judged by in `language`: rank-R with the gate's
    own R for it (`gate.verify_rank`, chosen on validation) when it has one and `rule` is of the
    rank family (greedy, rank); otherwise `rule` unchanged (a sampling or WISV rule is the caller's
    explicit choice, and a block gate has no R of its own)."""
    ranks = getattr(gate, "verify_rank", None) or {}
    if getattr(gate, "level", "block") != "token" or language not in ranks or not isinstance(rule, Rank):
        return rule
    return Rank(ranks[language])
