"""The pipelined speculative loop: the edge drafts ahead while escalated blocks are verified.

The blocking loop (engine.speculative) stops for a round trip plus the cloud's forward at every
escalation. Here the edge sends the block and goes on drafting, assuming the block will be accepted
whole and that the cloud's free bonus token will be the edge's own next token (the "guess", sent
with the block so that the cloud can tell). At most `in_flight` escalated blocks are outstanding.
When a verdict contradicts the assumption (a rejection, or a bonus other than the guess), the edge
crops its cache to that point, throws away everything drafted after it, and resumes from the
cloud's token.

Staying consistent without a round trip: every packet carries the edge's epoch, the number of
contradicting verdicts it has received. The cloud counts the contradicting verdicts it has issued;
a block whose epoch is behind was drafted on top of a rejected token, and the cloud drops it
unverified (it never verifies tokens that depend on a rejected one). Blocks of a caption are handled
in order, so the two counts agree.

Time on the virtual clock: the edge's timeline advances by its measured compute; the uplink and
the downlink are FIFO pipes (serialization occupies a pipe, propagation does not); the cloud
verifies one block at a time. The edge sees a verdict from its arrival time on (it checks between
drafted tokens) and waits when it needs one: at the in-flight limit or at the end. With
`draft_ahead: adaptive` (the default) it also waits when a verdict is due so soon that drafting a
token first is not worth it: when the expected time to the oldest verdict (send time + the mean
verdict latency seen so far - now) is below (1 - hold rate) x the mean time of a drafted token,
the token it would draft is more likely wasted than the wait is long. That rule uses only what a
real edge knows (its own timings); on a link much faster than drafting it turns the loop back into
the blocking one, on a slow link it drafts ahead. `always` never waits early. With a cost model
each forward's charge is known before it runs, so the tokens up to the first check that could act
are drafted as one run (`_run_length`), booked as drafting them one by one books them.

A token gate (`gate.level == "token"`) ends the block at the token it flags: with `verify: alone`
the unflagged tokens are committed as drafted and the flagged one goes up alone, with `pending` all
of them; the edge then drafts on past it. Here a flagged token is fed at once (the edge needs it to
draft on), where the blocking loop leaves it unfed until its verdict.

For greedy rules the captions equal those of the blocking loop: block boundaries, gate inputs and
length-policy states are the same (the policy advances on the assumption and is restored from a
snapshot when a verdict contradicts it); only the timing changes.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..metrics.system import ResourceMonitor
from ..models.base import AudioLM
from . import packets
from .cost import Work
from .halves import CloudHalf, EdgeHalf, SpecSettings, last_token
from .ledger import CaptionRecord, Ledger
from .link import Link
from .policies import LengthPolicy
from .round import Round
from .stats import Block, ClipAudio
from .verify import Verdict


@dataclass
class _Pending:
    """An escalated block the edge has not heard back about."""

    seq: int
    block: Block
    guess: int | None
    policy: LengthPolicy  # the policy before this block's assumed outcome was applied
    verdict: Verdict | None  # None: the cloud dropped it as stale
    arrival: float  # virtual time the verdict reaches the edge
    holds: bool  # the verdict agrees with what the edge assumed
    sent: float  # virtual time the edge sent it


class _Pipe:
    """One direction of the link as a FIFO: serialization occupies it, propagation does not."""

    def __init__(self, rtt_s: float):
        self.free = 0.0
        self.propagation = rtt_s / 2

    def send(self, t: float, seconds: float) -> float:
        start = max(t, self.free)
        self.free = start + max(seconds - self.propagation, 0.0)
        return start + seconds


class _Loop:
    def __init__(self, edge: AudioLM, cloud: AudioLM, features: np.ndarray, language: str, s: SpecSettings,
                 link: Link, session_id: int):
        self.s, self.link, self.session_id = s, link, session_id
        self.features, self.language = features, language
        self.audio = ClipAudio(features)
        self.books = Ledger("pipelined", s.cost, in_flight=s.in_flight)
        self.rec = self.books.rec  # read (accept rate, drafting times); written through `books` only
        self.eos = edge.eos_token_id
        self.bits = packets.id_bits(min(edge.vocab_size, cloud.vocab_size))
        self.policy = s.policy
        self.ed = EdgeHalf(edge, features, language, s, self.books)
        self.cl = CloudHalf(cloud, features, language, s, self.books)
        self.up, self.down = _Pipe(link.rtt_s), _Pipe(link.rtt_s)
        self.cloud_free = 0.0
        self.features_sent = False
        self.seq_all: list[int] = []  # the caption as the edge has it (final + assumed), no EOS
        self.ended = False  # seq_all ends the caption (an EOS was drafted or guessed)
        self.cloud_holds = 0  # tokens of seq_all in the cloud's cache, if every block in flight holds
        self.inflight: deque[_Pending] = deque()
        self.epoch = 0  # contradicting verdicts the edge has received
        self.cloud_epoch = 0  # contradicting verdicts the cloud has issued
        self.seq = 0
        self.block: Block | None = None  # the block being drafted
        self.budget = 0
        # what the edge has seen, for the adaptive draft-ahead rule (priors: one RTT, even odds)
        self.latency = [link.rtt_s, 1]  # sum and count of verdict latencies
        self.holds = [1, 2]  # verdicts that held (+1) and verdicts (+2)
        self.token_time = [0.0, 0]  # sum and count of drafted-token compute
        self.unfed: int | None = None  # the last guess, not yet run through the edge
        self.flagged = False

    # ---- the edge's main loop ----
    def run(self) -> list[int]:
        s, eos = self.s, self.eos
        while True:
            self._receive()
            if self.block is None:
                if self.ended or len(self.seq_all) >= s.max_new_tokens:
                    if not self.inflight:
                        return self.seq_all
                    self._wait()
                    continue
                remaining = s.max_new_tokens - len(self.seq_all)
                # a token gate drafts until it flags a token (the block ends there) or the caption ends
                self.budget = remaining if s.gate.level == "token" else min(self.policy.next_length(), remaining)
                rate = self.rec.accepted / self.rec.transmitted if self.rec.transmitted else None
                self.block = Block(start=len(self.seq_all), accept_rate=rate, audio=self.audio, language=self.language)
                self.flagged = False  # token gates: the block's last token was flagged
            block = self.block
            if len(block) < self.budget and not (block.tokens and block.tokens[-1] == eos):
                if self._not_worth_drafting(self.books.now, self.token_time):
                    self._wait()
                    continue
                n = self._run_length(block)
                if n > 1:
                    self._draft_run(block, n)
                    continue
                before = self.rec.edge_compute
                if self.unfed is not None:  # the guess goes into the cache only when drafting needs it
                    self.ed.feed(self.unfed)
                    self.unfed = None
                self.ed.draft(block, s.rule.needs_q)
                self.token_time[0] += self.rec.edge_compute - before
                self.token_time[1] += 1
                if s.gate.level == "token" and s.gate.flag(block):
                    self.budget, self.flagged = len(block), True  # the block ends at the flagged token
                continue
            self.books.drafted(len(block))
            if s.gate.level == "token":
                if self.flagged and s.gate.verify == "alone" and len(block) > 1:
                    # as in the blocking loop: the unflagged tokens are kept as drafted, the flagged one goes up
                    self._append(block.tokens[:-1])
                    block = self.block = last_token(block)
                escalate = self.flagged
            else:
                escalate = s.gate.escalate(block)
            if not escalate:
                self._keep_local(block)
                continue
            while len(self.inflight) >= s.in_flight and self.block is block:
                self._wait()  # at the limit: the oldest verdict first (it may void this block)
            if self.block is block:
                self._escalate(block)

    def _not_worth_drafting(self, now: float, token_time: list) -> bool:
        """The adaptive draft-ahead rule at virtual time `now`, drafted tokens having taken
        `token_time` (sum, count)."""
        if not self.inflight or self.s.draft_ahead == "always" or not token_time[1]:
            return False
        due = self.inflight[0].sent + self.latency[0] / self.latency[1] - now
        miss = 1 - self.holds[0] / self.holds[1]
        return due < miss * token_time[0] / token_time[1]

    def _run_length(self, block: Block) -> int:
        """How many tokens the edge can draft now without a check between them mattering: before
        the next would, token by token, find a verdict arrived or the draft-ahead rule saying wait.
        Known ahead only where each forward's charge is (a cost model), a block gate decides after
        the block, and the edge drafts as a run (EdgeHalf.runs); otherwise 1. Each forward is
        charged and summed here as the clock and the record will sum it, so the count is the one
        drafting token by token reaches."""
        s = self.s
        if s.cost is None or s.gate.level == "token" or self.unfed is not None or not self.ed.runs(s.rule.needs_q):
            return 1
        now, spent, token_time = self.books.now, self.rec.edge_compute, list(self.token_time)
        length, n = self.ed.sess.length, 0
        while n < self.budget - len(block):
            dt = s.cost.seconds(Work("edge", 1, length + n)) * s.edge_time_scale
            now += dt
            token_time[0] += (spent + dt) - spent
            token_time[1] += 1
            spent += dt
            n += 1
            if (self.inflight and self.inflight[0].arrival <= now) or self._not_worth_drafting(now, token_time):
                break
        return max(n, 1)

    def _draft_run(self, block: Block, n: int) -> None:
        """Draft up to `n` tokens into `block` as one run (fewer where the caption ends), each
        token's time booked as drafting it alone books it."""
        marks: list[float] = []  # the edge's compute before each forward is booked
        drafted = len(block)
        self.ed.draft_block(block, len(block) + n, self.s.rule.needs_q,
                            before=lambda run, j: marks.append(self.rec.edge_compute))
        marks.append(self.rec.edge_compute)
        for j in range(len(block) - drafted):  # an end token is drafted unfed: no forward, no time
            self.token_time[0] += marks[j + 1] - marks[j] if j + 1 < len(marks) else 0.0
            self.token_time[1] += 1

    def _receive(self) -> None:
        while self.inflight and self.inflight[0].arrival <= self.books.now:
            self._settle(self.inflight.popleft())

    def _wait(self) -> None:
        p = self.inflight.popleft()
        self.books.wait_until(p.arrival)
        self._settle(p)

    def _append(self, tokens: list[int]) -> None:
        for t in tokens:
            if t == self.eos:
                self.ended = True
                return
            self.seq_all.append(t)

    def _keep_local(self, block: Block) -> None:
        self._append(block.tokens)
        self.policy.update(len(block), len(block), escalated=False, corrected=False)
        if not self.inflight:
            self.books.first_token()  # final at once: nothing it depends on is in flight
        self.block = None

    # ---- sending a block; the cloud's side runs here too, in order ----
    def _escalate(self, block: Block) -> None:
        s, books = self.s, self.books
        self.seq += 1
        sync = self.seq_all[self.cloud_holds:block.start]
        end_len = block.start + sum(t != self.eos for t in block.tokens)
        ends = bool(block.tokens) and block.tokens[-1] == self.eos
        guess = self.ed.pick() if not ends and end_len < s.max_new_tokens else None
        t = books.now
        if not self.features_sent:
            seconds = books.account(self.link, "up", "features", self.cl.features_packet(self.session_id))
            self.up.send(t, seconds)  # the verify packet queues behind it
            self.features_sent = True
        rnd = Round(self.session_id, self.seq, sync, self.seq_all[:block.start], block, self.bits,
                    epoch=self.epoch, guess=guess)
        arrived = self.up.send(t, books.account(self.link, "up", "verify", rnd.packet(s.rule)))
        books.synced(len(sync))
        verdict, holds, arrival = None, True, math.inf
        if self.epoch == self.cloud_epoch:
            verdict, dt = self.cl.check(rnd, self.eos)
            self.cloud_free = max(arrived, self.cloud_free) + dt
            arrival = self.down.send(self.cloud_free,
                                     books.account(self.link, "down", "verdict", rnd.verdict_packet(verdict)))
            holds = verdict.accepted == len(block) and (guess is None or verdict.token == guess)
            self.cloud_epoch += not holds
        # verified, or dropped unverified: drafted on top of a rejected block
        books.escalated(len(block), verified=verdict is not None)
        self.inflight.append(_Pending(self.seq, block, guess, copy.deepcopy(self.policy), verdict, arrival, holds,
                                      sent=books.now))
        # go on as if it holds
        self.policy.update(len(block), len(block), escalated=True, corrected=False)
        self._append(block.tokens)
        self.cloud_holds = len(self.seq_all)
        if guess is not None:
            self._append([guess])
            if not self.ended and len(self.seq_all) < s.max_new_tokens:
                self.unfed = guess
        self.block = None

    # ---- a verdict reaches the edge ----
    def _settle(self, p: _Pending) -> None:
        v = p.verdict
        self.books.first_token(at=p.arrival)
        self.books.verdict(v, len(p.block))
        self.latency[0] += p.arrival - p.sent
        self.latency[1] += 1
        self.holds[0] += p.holds
        self.holds[1] += 1
        if p.holds:
            return
        # contradicted: keep the accepted prefix, take the cloud's token, drop everything after
        accepted = p.block.tokens[: v.accepted]
        drafted_after = (len(self.seq_all) + int(self.ended) + (len(self.block) if self.block else 0)
                         - (self.unfed is not None))
        self.books.wasted(drafted_after - (p.block.start + len(p.block)))
        self.unfed = None
        del self.seq_all[p.block.start:]
        self.ended = False
        self._append(accepted)
        self.ed.truncate(len(self.seq_all))
        self.cloud_holds = len(self.seq_all)
        if v.token is not None and not self.ended:
            self._append([v.token])
            if not self.ended and len(self.seq_all) < self.s.max_new_tokens:
                self.ed.feed(v.token)
        self.policy = p.policy
        self.policy.update(len(p.block), v.accepted, escalated=True, corrected=v.corrected)
        self.epoch += 1
        self.inflight.clear()  # stale: the cloud drops them
        self.block = None


def pipelined(edge: AudioLM, cloud: AudioLM, features: np.ndarray, language: str, settings: SpecSettings,
              link: Link, session_id: int = 1, keep_sessions: bool = False) -> CaptionRecord:
    """Gated speculative decoding with up to `settings.in_flight` blocks in flight (>= 1)."""
    if settings.in_flight < 1:
        raise ValueError(f"the pipelined loop needs in_flight >= 1, got {settings.in_flight}")
    if settings.rule.needs_hidden:
        raise ValueError(f"rule {settings.rule.name!r} runs in the blocking loop only (decode.in_flight 0): its "
                         "selective upload protocol waits for the cloud's mismatch positions")
    with ResourceMonitor() as mon:
        loop = _Loop(edge, cloud, features, language, settings, link, session_id)
        ids = loop.run()
    loop.books.overlapped_link_time()
    return loop.books.finish(edge, ids[: settings.max_new_tokens], mon,
                             (loop.ed.sess, loop.cl.sess) if keep_sessions else None)
