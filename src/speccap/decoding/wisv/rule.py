"""The WISV verification rule: greedy mismatch localization, and a CSI-aware head that may let a
mismatch through.

The cloud compares each draft token with its own argmax. Where they differ, the decision head
(decoding.wisv.training.DecisionHead) reads the edge's and the cloud's last-layer hidden states of that token,
the channel state and what the cloud's own forward says about the token (decoding.wisv.training.cloud_scalars:
its probability, rank, the cloud's top-1 probability and entropy), and gives P(reject). The mismatch is tolerated (the draft token accepted)
when P(reject) < tau; the first mismatch the head rejects is replaced by the cloud's argmax, as in
greedy verification. With tau = 0 the rule IS greedy verification. Mismatches about the end of the
caption (the draft ends it, or the cloud would end it) are never tolerated: the head was not
trained to judge a caption's length. `max_rank` (> 1) caps what may be tolerated: a draft token
outside the cloud's top `max_rank` is repaired whatever the head says (WISV within rank-R: the head
chooses among the mismatches rank-R would accept). On the embedded testbed's validation clips a cap
helps en and costs zh more (reports/wisv_rank_cap.md), so the default is none.

How the edge's hidden states travel is the upload protocol (decoding/wisv/upload.py): `full` sends
them all with the token ids; `selective` sends the ids, the cloud asks for the mismatch positions
(`Verdict.asked`), the edge sends those states: one more round trip, fewer bytes; `auto` picks per
round on the link model from the caption's running mismatch rate.
"""

from __future__ import annotations

import numpy as np
import torch

from ..link import Link
from ..stats import cloud_scalars
from ..verify import Rule, Verdict, cloud_rank
from .head import CSI, DecisionHead

PROTOCOLS = ("full", "selective", "auto")


def csi_of(link: Link) -> CSI:
    """The channel state the device's modem reports now (the Markov state is read, not advanced)."""
    return CSI(link.rate_now("up") / 1e6, link.rate_now("down") / 1e6, link.p.rtt_ms, link.p.packet_error_rate)


class WISV(Rule):
    name = "wisv"
    needs_hidden = True

    def __init__(self, head: DecisionHead, tau: float = 0.5, protocol: str = "auto", max_rank: int = 0):
        if not 0 <= tau <= 1:
            raise ValueError(f"wisv: tau is a probability threshold in [0, 1], got {tau}")
        if max_rank < 0 or max_rank == 1:
            raise ValueError(f"wisv: max_rank is 0 (no cap) or >= 2 (1 tolerates nothing: tau = 0 does that), "
                             f"got {max_rank}")
        if protocol not in PROTOCOLS:
            raise ValueError(f"wisv: unknown upload protocol {protocol!r} (expected one of {PROTOCOLS})")
        # head None: the edge's copy of the rule over the network (the server holds the head; the edge
        # needs only tau and the upload protocol)
        self.head, self.tau, self.protocol = (head.eval() if head is not None else None), float(tau), protocol
        self.max_rank = int(max_rank)

    @property
    def r(self) -> int:
        """What the OPEN packet's rank field carries for WISV: the rank cap (1: none)."""
        return self.max_rank or 1

    def verify(self, draft, rows, q, eos, rng, ranks=None) -> Verdict:
        raise ValueError("wisv verifies with hidden states and the channel state: call verify_hidden")

    @staticmethod
    def questions(draft: list[int], rows: torch.Tensor, eos: int) -> list[int]:
        """The draft positions whose edge hidden state the head needs: every mismatch up to the first
        one it may not judge (an end-of-caption one). The selective protocol asks for these only."""
        top = rows.argmax(dim=-1).tolist()
        asked: list[int] = []
        for i, tok in enumerate(draft):
            if tok != top[i]:
                if tok == eos or top[i] == eos:
                    break
                asked.append(i)
        return asked

    def verify_hidden(self, draft: list[int], rows: torch.Tensor, edge_hidden: list, cloud_hidden: torch.Tensor,
                      csi: CSI | None, eos: int) -> Verdict:
        """`edge_hidden[i]`: the edge's state after draft token i, needed at the `questions` positions
        (None elsewhere is fine: what the selective protocol delivers)."""
        if edge_hidden is None or len(edge_hidden) != len(draft) or cloud_hidden is None:
            raise ValueError("wisv needs the edge's and the cloud's hidden state of every draft token")
        if csi is None:
            raise ValueError("wisv needs the channel state (CSI) of the round")
        if self.head is None:
            raise ValueError("wisv: this copy of the rule has no decision head (the verifier server holds it)")
        top = rows.argmax(dim=-1).tolist()
        ranks: list[int] = []
        asked = [i for i in self.questions(draft, rows, eos) if edge_hidden[i] is not None]
        p_reject = {}
        if asked:  # one batched call of the head for the whole block
            he = torch.stack([edge_hidden[i] for i in asked]).float()
            hc = cloud_hidden[asked].float()
            if (he.shape[-1], hc.shape[-1]) != self.head.dims[:2]:
                raise ValueError(f"wisv: the head reads hidden states of sizes {self.head.dims[:2]} (edge, cloud), "
                                 f"these models give {(he.shape[-1], hc.shape[-1])}: train it for these models")
            with torch.no_grad():
                c = torch.from_numpy(np.repeat(csi.vector()[None], len(asked), axis=0))
                extra = (torch.from_numpy(np.stack([cloud_scalars(rows[i], draft[i]) for i in asked])),) \
                    if self.head.d_scalar else ()
                p_reject = dict(zip(asked, self.head(he, hc, c, *extra).tolist()))
        tolerated = 0
        for i, tok in enumerate(draft):
            ranks.append(cloud_rank(rows[i], tok))
            if tok == top[i]:
                continue
            if i not in p_reject or p_reject[i] >= self.tau or (self.max_rank and ranks[i] > self.max_rank):
                return Verdict(i, top[i], True, ranks, tolerated, asked)
            tolerated += 1
        if draft and draft[-1] == eos:
            return Verdict(len(draft), None, False, ranks, tolerated, asked)
        return Verdict(len(draft), top[len(draft)], False, ranks, tolerated, asked)

    def describe(self) -> dict:
        return {"rule": self.name, "tau": self.tau, "protocol": self.protocol, "max_rank": self.max_rank}
