"""Latency on the papers' hardware (edge 2.10 and cloud 24.16 tokens/s, seed 000 Table 2: a 3B edge
on 2 CPU cores, a 7B cloud on a GPU; the link of params.link): counted in model steps, not scaled
from this machine's measured compute. The blocking loop's time is its edge forwards (the tokens
it fed: drafts and the cloud tokens; a token gate's flagged draft that the cloud replaced is never
fed, decoding.halves) / 2.10 + its cloud forwards (one per verification: a few tokens in one
forward cost a GPU about one decoding step) / 24.16 + the link model's time; edge-only and
cloud-only are their tokens at their rates (+ the link for cloud-only). Prefill is left out.
Scaling the measured compute instead would multiply this machine's timing noise by ~300 for the
edge: configurations that differ in measured compute only by what ran beside them would differ by seconds.
"""

from __future__ import annotations

PAPER_EDGE_OTPS, PAPER_CLOUD_OTPS = 2.10, 24.16  # seed 000, Table 2: Edge (3B), Cloud (7B)


def papers_seconds(m: dict, method: str) -> float:
    """Mean seconds per caption on the papers' hardware, counted in model steps (this module's docstring)."""
    return sum(papers_parts(m, method).values())


def papers_parts(m: dict, method: str) -> dict[str, float]:
    """papers_seconds split into the edge's forwards, the cloud's and the link's time, so a time
    ratio can say where it comes from (a longer caption costs edge steps, a round cloud and link)."""
    if method == "edge":
        return {"edge": (m["tokens"] + 1) / PAPER_EDGE_OTPS, "cloud": 0.0, "link": 0.0}  # + 1: the end token's step
    if method == "cloud":
        return {"edge": 0.0, "cloud": (m["tokens"] + 1) / PAPER_CLOUD_OTPS, "link": m.get("link_time", 0.0)}
    if "edge_fed" in m:  # the tokens the edge really fed (a deferred token the cloud replaced is not)
        edge_steps = m["edge_fed"] + 1
    else:  # records from before the count: every draft fed, and every cloud token after it
        edge_steps = m.get("drafted", 0.0) + m.get("corrected", 0.0) + m.get("bonus", 0.0)
    return {"edge": edge_steps / PAPER_EDGE_OTPS, "cloud": m.get("rounds", 0.0) / PAPER_CLOUD_OTPS,
            "link": m.get("link_time", 0.0)}
