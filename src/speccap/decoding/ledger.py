"""What one caption's decoding produced and cost, and the one place that writes it.

`CaptionRecord` is the result; `Clock` measures model calls and keeps the virtual time; `Ledger`
is the only writer of both. Every loop (edge-only, cloud-only, blocking, pipelined, token-level)
and every transport (in-process, networked) tells the ledger what happened (a prefill, a forward,
a packet, a verdict, the first token) and the ledger books it, so a new counter is a field here
and a call where the event happens, and the books of in-process and networked decoding cannot
drift apart. (tests/decoding/test_ledger.py holds that no other module assigns a record field or
moves the clock.)"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..metrics.system import ResourceMonitor
from ..models.base import AudioLM, Run, Session, summary_token
from .cost import CostModel, Work
from .link import Link
from .verify import examined


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
        oet, otps = output_timing(self.total_time, self.ttft, self.n_tokens)
        out = {
            "ttft": self.ttft, "itps": self.prompt_tokens / self.prefill_time if self.prefill_time else 0.0,
            "oet": oet, "otps": otps,
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


def output_timing(total_time: float, ttft: float, n_tokens: int) -> tuple[float, float]:
    """(OET, OTPS): the seconds from the first token to the last, and the tokens a second after the
    first (decoding.relink recomputes them for a caption put on another channel)."""
    oet = max(total_time - ttft, 0.0)
    return oet, (n_tokens - 1) / oet if oet > 0 and n_tokens > 1 else 0.0


def new_network_stats() -> dict:
    """The networked edge's measurements (serving.edge), next to the link model's prediction."""
    return {"requests": 0, "net_rtt": 0.0, "net_time": 0.0, "server_compute": 0.0, "server_queue": 0.0,
            "http_bytes_up": 0, "http_bytes_down": 0, "link_model_time": 0.0, "fallback": 0, "reopened": 0,
            "fallback_reasons": [], "verify_rtts": []}


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

    def measure_each(self, fn, *args, scale: float = 1.0, works: Callable[[object], list[Work]]):
        """`measure` for a call of several model forwards (`works(output)`: each one's work): (output,
        [(scaled seconds, work)] for each forward), not yet on the virtual time. Without a cost model
        the forwards share the measured seconds."""
        t = time.perf_counter()
        out = fn(*args)
        dt = time.perf_counter() - t
        self.model += dt
        each = works(out)
        if self.cost is None:
            return out, [(dt / len(each) * scale, w) for w in each]
        return out, [(self.cost.seconds(w) * scale, w) for w in each]


class Ledger:
    """The books of one caption: its record and its clock, written only here. Loops and transports
    call one method per event; the method says what the event costs and counts.

    Float sums are added in the order the events happen, so a loop that reports the same events
    in the same order gets the same record to the last bit, whichever loop or transport it is."""

    def __init__(self, method: str, cost: CostModel | None = None, in_flight: int = 0, networked: bool = False):
        self.rec = CaptionRecord("", [], method, in_flight=in_flight)
        if networked:
            self.rec.network = new_network_stats()
        self.clock = Clock(cost)
        self.wall0 = time.perf_counter()

    @property
    def now(self) -> float:
        """The virtual time."""
        return self.clock.virtual

    # ---- model calls ----
    def prefill(self, role: str, fn, *args, scale: float = 1.0, work: Work | None = None):
        """A model's prefill of the audio and prompt, on the clock; returns its session. The cloud's
        prompt positions count as cloud work (cloud-only: the cloud runs the whole caption)."""
        session, dt = self.clock.run(fn, *args, scale=scale, work=work)
        rec = self.rec
        rec.prefill_time = dt
        if role == "edge":
            rec.edge_compute += dt  # after a learned uplink's encoder (`sent`), if it ran first
        else:
            rec.cloud_compute += dt
            rec.cloud_tokens = session.prompt_len
        rec.prompt_tokens = session.prompt_len
        return session

    def forward(self, role: str, fn, *args, scale: float = 1.0, work: Work):
        """A model forward over `work.new` caption tokens, on the clock; returns its output."""
        out, dt = self.clock.run(fn, *args, scale=scale, work=work)
        self._computed(role, dt, work)
        return out

    def forward_run(self, role: str, session: Session, ids: list[int], summarize, steps: int, stop: int,
                    hidden: bool = False, scale: float = 1.0, before: Callable[[Run, int], None] | None = None,
                    choose: Callable[[object], int] = summary_token) -> Run:
        """A greedy run (`session.extend_run`) on the clock: each of its forwards booked as `forward`
        books one, in turn, after `before(run, j)` has booked what came before forward j (the same
        events in the same order, so the same sums to the bit, as forwards called one by one)."""
        length = session.length

        def works(run: Run) -> list[Work]:  # the first forward reads `ids`, each later one a token
            return [Work(role, len(ids), length)] + [Work(role, 1, length + len(ids) + j) for j in range(run.forwards - 1)]
        run, charged = self.clock.measure_each(session.extend_run, ids, summarize, steps, stop, hidden, choose,
                                               scale=scale, works=works)
        for j, (dt, work) in enumerate(charged):
            if before is not None:
                before(run, j)
            self.clock.virtual += dt
            self._computed(role, dt, work)
        return run

    def _computed(self, role: str, seconds: float, work: Work) -> None:
        if role == "edge":
            self.rec.edge_compute += seconds
            self.rec.edge_fed += work.new
        else:
            self.rec.cloud_compute += seconds
            self.rec.cloud_tokens += work.new

    def sent(self, uplink, features):
        """What the edge sends the cloud for the clip's log-mel `features` through `uplink`. A learned
        encoder (speccap.models.learned_uplink) is a network on the edge: its measured seconds are the
        edge's compute, on the clock, with a cost model too (the model fits the captioners' calls, not
        the encoder's). A hand-made view pools what the edge already has: not charged."""
        if not uplink.learned:
            return uplink.encode(features)
        t = time.perf_counter()
        out = uplink.encode(features)
        dt = time.perf_counter() - t
        self.clock.virtual += dt
        self.rec.edge_compute += dt
        return out

    def measure(self, fn, *args, scale: float = 1.0, work: Work | None = None):
        """A model call off this caption's timeline (the cloud's, booked by `cloud_verified`):
        (output, scaled seconds)."""
        return self.clock.measure(fn, *args, scale=scale, work=work)

    def cloud_verified(self, seconds: float, positions: int) -> None:
        """The cloud's verification forwards of one round: `positions` run in `seconds` (not yet on
        the clock: the blocking loop waits for them with `elapse`, the pipelined one overlaps them)."""
        self.rec.cloud_tokens += positions
        self.rec.cloud_compute += seconds

    def elapse(self, seconds: float) -> None:
        """The edge waits `seconds` for something not booked otherwise (the in-process cloud's forward)."""
        self.clock.virtual += seconds

    def wait_until(self, t: float) -> None:
        """The pipelined edge idles until a verdict arrives at virtual time `t`."""
        if t > self.clock.virtual:
            self.rec.wait_time += t - self.clock.virtual
            self.clock.virtual = t

    # ---- packets on the link model ----
    def account(self, link: Link, direction: str, kind: str, payload: bytes) -> float:
        """Send one packet on the link model and book its bytes; returns its seconds on the wire
        (the caller puts them on its own timeline: the pipelined loop's pipes)."""
        rec = self.rec
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

    def send(self, link: Link, direction: str, kind: str, payload: bytes, overlap: bool = False) -> None:
        """One packet on the blocking clock. `overlap`: a streamed token whose transfer hides behind
        the next token's compute; only its serialization beyond the propagation already paid is added."""
        seconds = self.account(link, direction, kind, payload)
        charged = max(seconds - link.rtt_s / 2, 0.0) if overlap else seconds
        self.clock.virtual += charged
        self.rec.link_time += charged
        # what decoding.relink needs to put the same packets on another channel's clock
        self.rec.packets[-1].update(overlap=overlap, charged=charged, at=self.clock.virtual)

    def overlapped_link_time(self) -> None:
        """The pipelined loop: the link time is every packet's seconds on the wire, mostly hidden
        behind drafting (none of it was put on the clock packet by packet)."""
        self.rec.link_time = sum(p["seconds"] for p in self.rec.packets)

    # ---- the speculative round ----
    def drafted(self, n: int) -> None:
        self.rec.drafted += n

    def synced(self, n: int) -> None:
        """Committed tokens sent to bring the cloud's cache up to date."""
        self.rec.synced += n

    def escalated(self, n_draft: int, verified: bool = True) -> None:
        """A block went up for verification; `verified` False: the cloud dropped it as stale."""
        self.rec.transmitted += n_draft
        if verified:
            self.rec.rounds += 1
        else:
            self.rec.stale += 1

    def verdict(self, verdict, n_draft: int) -> None:
        """What a verdict on a block of `n_draft` tokens accepted, checked and added."""
        rec = self.rec
        rec.accepted += verdict.accepted
        checked = examined(verdict.accepted, n_draft)
        while len(rec.position_checked) < checked:
            rec.position_checked.append(0)
            rec.position_accepted.append(0)
        for i in range(checked):
            rec.position_checked[i] += 1
            rec.position_accepted[i] += int(i < verdict.accepted)
        if verdict.token is not None:
            if verdict.corrected:
                rec.corrected += 1
            else:
                rec.bonus += 1

    def tolerated(self, n: int) -> None:
        """Mismatches WISV's head (or an oracle within its allowance) let through."""
        self.rec.tolerated += n

    def hidden_request(self) -> None:
        """WISV's selective protocol: the cloud asked the edge for states at its mismatches."""
        self.rec.hidden_requests += 1

    def wasted(self, n: int) -> None:
        """The pipelined edge threw away `n` tokens drafted past a contradicted block."""
        self.rec.wasted += n

    def first_token(self, at: float | None = None) -> None:
        """The first committed token (or the end) is known at `at` (default: now); later calls keep the first."""
        if not self.rec.ttft:
            self.rec.ttft = self.clock.virtual if at is None else at

    # ---- the networked edge's measurements (serving.edge) ----
    def predicted(self, link: Link, direction: str, kind: str, payload: bytes, emulate: bool) -> float:
        """A packet the networked edge sent for real, booked on the link model as its prediction
        (returned); with `emulate` the edge also waits that long (client-side channel emulation)."""
        predicted = self.account(link, direction, kind, payload)
        self.rec.network["link_model_time"] += predicted
        if emulate:
            self.clock.virtual += predicted
            self.rec.link_time += predicted
        return predicted

    def exchange(self, ex, verify: bool = False) -> None:
        """What one request/response measured (serving.client.Exchange); `verify`: a VERIFY's."""
        rec, net = self.rec, self.rec.network
        net["requests"] += 1
        net["net_rtt"] += ex.seconds
        net["net_time"] += max(ex.seconds - ex.compute - ex.queue, 0.0)
        net["server_compute"] += ex.compute
        net["server_queue"] += ex.queue
        net["http_bytes_up"] += ex.bytes_up
        net["http_bytes_down"] += ex.bytes_down
        rec.cloud_compute += ex.compute
        rec.link_time += max(ex.seconds - ex.compute, 0.0)
        self.clock.virtual += ex.seconds
        if verify:
            net["verify_rtts"].append(ex.seconds)

    def reopened(self) -> None:
        self.rec.network["reopened"] += 1

    def fallback(self, reason: str) -> None:
        """A block committed as drafted because the cloud failed (the first five reasons kept)."""
        net = self.rec.network
        net["fallback"] += 1
        if len(net["fallback_reasons"]) < 5:
            net["fallback_reasons"].append(reason)

    # ---- the end ----
    def finish(self, lm: AudioLM, ids: list[int], mon: ResourceMonitor, sessions=None) -> CaptionRecord:
        """The caption `ids` decoded; `sessions`: (edge, cloud) model sessions left on the record."""
        rec = self.rec
        rec.token_ids = ids
        rec.caption = lm.decode(ids)
        rec.total_time = self.clock.virtual
        rec.model_time = self.clock.model
        rec.wall_time = time.perf_counter() - self.wall0
        rec.resources = mon.summary()
        if sessions is not None:
            rec.sessions = sessions
        return rec
