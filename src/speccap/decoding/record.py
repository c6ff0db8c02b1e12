"""What one caption's decoding produced and cost: the record, the virtual clock that measures model
calls, and the link accounting every loop shares (blocking, pipelined, token-level, networked)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..metrics.system import ResourceMonitor
from ..models.base import AudioLM
from .cost import CostModel, Work
from .link import Link


@dataclass
class CaptionRecord:
    caption: str
    token_ids: list[int]
    method: str
    # time, seconds (virtual clock: measured compute + modelled link)
    ttft: float = 0.0
    total_time: float = 0.0
    edge_compute: float = 0.0
    cloud_compute: float = 0.0
    link_time: float = 0.0
    wall_time: float = 0.0  # real seconds the loop took here
    model_time: float = 0.0  # real seconds inside model forwards
    prompt_tokens: int = 0
    prefill_time: float = 0.0
    # speculative accounting
    rounds: int = 0
    drafted: int = 0
    transmitted: int = 0  # draft tokens sent to the cloud
    synced: int = 0  # committed tokens sent to bring the cloud's cache up to date
    accepted: int = 0
    corrected: int = 0
    bonus: int = 0
    # WISV: mismatches its head let through, and selective-hidden rounds that asked the edge for states
    tolerated: int = 0
    hidden_requests: int = 0
    position_checked: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    cloud_tokens: int = 0  # token positions the cloud ran a forward over (prompt and audio included)
    edge_fed: int = 0  # caption tokens the edge fed into its cache (its decoding forwards' tokens)
    bytes_up: int = 0
    bytes_down: int = 0
    packets: list[dict] = field(default_factory=list)
    retransmissions: int = 0
    # pipelined loop: blocks allowed in flight, edge time spent waiting for verdicts, drafted tokens
    # thrown away after a rejection (beyond the rejected block), blocks the cloud dropped as stale
    in_flight: int = 0
    wait_time: float = 0.0
    wasted: int = 0
    stale: int = 0
    resources: dict = field(default_factory=dict)
    # networked edge (speccap.serving.edge): measured round trips, HTTP bytes, the link model's
    # prediction for the same packets, and blocks committed locally because the cloud failed
    network: dict = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    def metrics(self) -> dict:
        """The per-caption metrics of the papers (TTFT, ITPS, OET, OTPS, ...) plus the accounting."""
        oet = max(self.total_time - self.ttft, 0.0)
        out = {
            "ttft": self.ttft, "itps": self.prompt_tokens / self.prefill_time if self.prefill_time else 0.0,
            "oet": oet, "otps": (self.n_tokens - 1) / oet if oet > 0 and self.n_tokens > 1 else 0.0,
            "total_time": self.total_time, "edge_compute": self.edge_compute, "cloud_compute": self.cloud_compute,
            "link_time": self.link_time, "wall_time": self.wall_time, "model_time": self.model_time,
            "tokens": self.n_tokens, "rounds": self.rounds, "escalations": self.rounds, "drafted": self.drafted,
            "transmitted": self.transmitted, "synced": self.synced, "accepted": self.accepted,
            "corrected": self.corrected, "bonus": self.bonus, "tolerated": self.tolerated,
            "hidden_requests": self.hidden_requests,
            "aal": self.accepted / self.rounds if self.rounds else 0.0,
            "rho": self.transmitted / self.drafted if self.drafted else 0.0,
            "bytes_up": self.bytes_up, "bytes_down": self.bytes_down, "retransmissions": self.retransmissions,
            "cloud_tokens": self.cloud_tokens, "edge_fed": self.edge_fed, "in_flight": self.in_flight, "wait_time": self.wait_time,
            "wasted": self.wasted, "stale": self.stale,
            "position_checked": self.position_checked, "position_accepted": self.position_accepted,
        }
        out.update(self.resources)
        out.update(self.network)
        return out


class Clock:
    """Measures model calls and keeps the virtual time. A call is charged its measured seconds, or,
    with a cost model (decoding.cost), the model's seconds for its `work`, whatever the machine's
    load. `scale` multiplies a charged call on the virtual clock (hardware emulation: 2.0 = a
    device half as fast as this machine). `model` always sums the measured seconds."""

    def __init__(self, cost: CostModel | None = None):
        self.virtual = 0.0
        self.model = 0.0
        self.cost = cost

    def measure(self, fn, *args, scale: float = 1.0, work: Work | None = None):
        """Run a model call; return (output, scaled seconds) without advancing the virtual time
        (for a call on another timeline, e.g. the cloud's in the pipelined loop)."""
        t = time.perf_counter()
        out = fn(*args)
        dt = time.perf_counter() - t
        self.model += dt
        if self.cost is not None:
            if work is None:
                raise ValueError("a clock with a cost model needs each model call's work")
            dt = self.cost.seconds(work)
        return out, dt * scale

    def run(self, fn, *args, scale: float = 1.0, work: Work | None = None):
        out, dt = self.measure(fn, *args, scale=scale, work=work)
        self.virtual += dt
        return out, dt


def finish(rec: CaptionRecord, lm: AudioLM, ids: list[int], clock: Clock, wall0: float, mon: ResourceMonitor):
    rec.token_ids = ids
    rec.caption = lm.decode(ids)
    rec.total_time = clock.virtual
    rec.model_time = clock.model
    rec.wall_time = time.perf_counter() - wall0
    rec.resources = mon.summary()
    return rec


def account(rec: CaptionRecord, link: Link, direction: str, kind: str, payload: bytes) -> float:
    """Send one packet on the link model and book its bytes; returns its seconds on the wire."""
    nbytes = len(payload)
    before = link.retransmissions
    seconds = link.send(payload, direction)
    rec.retransmissions += link.retransmissions - before
    if direction == "up":
        rec.bytes_up += nbytes
    else:
        rec.bytes_down += nbytes
    rec.packets.append({"dir": direction, "kind": kind, "bytes": nbytes, "seconds": seconds})
    return seconds


def charge(rec: CaptionRecord, clock: Clock, link: Link, direction: str, kind: str, payload: bytes,
            overlap: bool = False) -> None:
    """Account one packet on the blocking clock. `overlap`: a streamed token whose transfer hides
    behind the next token's compute; only its serialization beyond the propagation already paid is added."""
    seconds = account(rec, link, direction, kind, payload)
    charged = max(seconds - link.rtt_s / 2, 0.0) if overlap else seconds
    clock.virtual += charged
    rec.link_time += charged
    # what decoding.relink needs to put the same packets on another channel's clock
    rec.packets[-1].update(overlap=overlap, charged=charged, at=clock.virtual)
