"""WISV's two upload protocols, as real packets on the link model, and the choice between them.

- full-hidden: one round. Up: the VERIFY (token ids) and a HIDDEN packet with every drafted token's
  edge hidden state; down: the VERDICT.
- selective-hidden: token ids first; the cloud finds the mismatches and asks (MISMATCH, down) for
  the hidden states at those positions only; up: HIDDEN with k states; down: the VERDICT. One extra
  round trip, fewer bytes when mismatches are rare.

`choose` compares the two on the link model for the expected number of mismatches: on a long RTT
the extra round trip dominates (the WISV paper switches to full-hidden above ~10 ms RTT); on a
short RTT with a slow uplink and wide hidden states, selective wins. `auto` chooses per round with
the caption's `MismatchRate`, learned from the answers alone, so in-process and over a socket it
is the same number.
"""

from __future__ import annotations

import numpy as np

from .. import packets
from ..link import Link
from ..verify import examined


def full_hidden(session: int, seq: int, sync: list[int], draft: list[int], hidden: np.ndarray, bits: int) -> list:
    """[(direction, kind, payload)] of one full-hidden round (the verdict sized for one token)."""
    return [("up", "verify", packets.verify_packet(session, seq, sync, draft, bits)),
            ("up", "hidden", packets.hidden_packet(session, seq, list(range(len(draft))), hidden)),
            ("down", "verdict", packets.verdict_packet(session, seq, len(draft), 0, bits))]


def selective_hidden(session: int, seq: int, sync: list[int], draft: list[int], hidden: np.ndarray,
                     mismatches: list[int], bits: int) -> list:
    """[(direction, kind, payload)] of one selective-hidden round."""
    out = [("up", "verify", packets.verify_packet(session, seq, sync, draft, bits))]
    if mismatches:
        out += [("down", "mismatch", packets.mismatch_packet(session, seq, mismatches)),
                ("up", "hidden", packets.hidden_packet(session, seq, mismatches, hidden[mismatches]))]
    out.append(("down", "verdict", packets.verdict_packet(session, seq, len(draft), 0, bits)))
    return out


def seconds(exchange: list, link: Link) -> float:
    """Time on the link model for an exchange: packets in a row in one direction go back to back
    (one propagation delay), each change of direction waits for the other side (RTT/2 more)."""
    total, last = 0.0, None
    for direction, _, payload in exchange:
        total += link.send(payload, direction) - (link.rtt_s / 2 if direction == last else 0.0)
        last = direction
    return total


def expected_seconds(link: Link, n_draft: int, d_hidden: int, n_mismatch: float, bits: int) -> dict[str, float]:
    """Both protocols' link time for a block, with the expected number of mismatches (rounded up
    for the packet sizes), from the link's current rate and RTT (no losses)."""
    k = int(np.ceil(n_mismatch))
    h = np.zeros((n_draft, d_hidden), dtype=np.float16)
    ids = list(range(n_draft))

    def t(exchange):  # as seconds(), without drawing losses
        total, last = 0.0, None
        for direction, _, payload in exchange:
            total += (link.rtt_s / 2 if direction != last else 0.0) + 8 * (len(payload) + link.p.overhead_bytes) \
                / link.rate_now(direction)
            last = direction
        return total
    full = t(full_hidden(1, 1, [], ids, h, bits))
    sel = t(selective_hidden(1, 1, [], ids, h, list(range(min(k, n_draft))), bits))
    return {"full": full, "selective": sel}


class MismatchRate:
    """A caption's mismatches / examined draft tokens as the edge learns them from each round's
    answer, whatever carries it: the verdict says how many tokens were accepted (those and the
    rejected one were examined) and whether one was rejected (a mismatch); a selective round's
    MISMATCH names the positions the cloud asked about, the ones up to the verdict's were examined
    mismatches. What the head let through in a full-hidden round stays with the cloud."""

    def __init__(self):
        self.mismatches, self.examined = 0, 0

    def learn(self, n_draft: int, accepted: int, asked=()) -> None:
        self.examined += examined(accepted, n_draft)
        self.mismatches += max(sum(i <= accepted for i in asked), int(accepted < n_draft))

    def protocol(self, rule_protocol: str, link: Link, n_draft: int, d_hidden: int, bits: int) -> str:
        """The rule's protocol, or with `auto` the one the link model says is faster for the
        mismatches expected at this rate (prior 1 in 10)."""
        if rule_protocol != "auto":
            return rule_protocol
        rate = (self.mismatches + 1) / (self.examined + 10)
        return choose(link, n_draft, d_hidden, rate * n_draft, bits)


def choose(link: Link, n_draft: int, d_hidden: int, n_mismatch: float, bits: int) -> str:
    est = expected_seconds(link, n_draft, d_hidden, n_mismatch, bits)
    return "full" if est["full"] <= est["selective"] else "selective"
