"""The two halves of a speculative caption that every loop composes: the edge's (draft, feed,
catch up after a verdict) and the in-process cloud's (one verification round on the link model),
with the settings they share and the packets they send. The blocking, token-level and pipelined
loops (engine, pipelined) and the networked edge (serving.edge) are built from these."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from ..models.base import AudioLM, Run, summary_token
from ..models.generate import draw_from, pick
from . import packets
from .cloud import CloudSession
from .cost import Work
from .gates import Gate
from .ledger import Ledger
from .link import Link
from .policies import LengthPolicy
from .round import Answer, Round, Transport
from .stats import Block, SampledRow, TokenStats, greedy_summary, sampled_rows, sampled_summary, token_stats
from .verify import Rule


@dataclass(frozen=True)
class SpecSettings:
    gate: Gate
    rule: Rule
    policy: LengthPolicy
    temperature: float = 0.0
    max_new_tokens: int = 128
    seed: int = 0
    # False: re-encode audio and prefix at every escalation, as the published implementation
    # does (kept as the baseline the persistent cache is measured against)
    cloud_cache: bool = True
    # blocks in flight: 0 = the blocking loop (the edge waits for every verdict); N >= 1 = the
    # pipelined loop (the edge drafts ahead while up to N escalated blocks are being verified)
    in_flight: int = 0
    # pipelined: "adaptive" waits for a verdict due sooner than a drafted token is likely to be
    # useful; "always" drafts ahead whenever the in-flight limit allows
    draft_ahead: str = "adaptive"
    # hardware emulation on the virtual clock: charged compute times these factors
    edge_time_scale: float = 1.0
    cloud_time_scale: float = 1.0
    # the clock's charge for a model call: None = its measured seconds; a decoding.cost.CostModel =
    # that model's seconds for the call, the same on any load
    cost: object = None
    # blocking loop: called after each verification with (block, the cloud's rows for it, the
    # verdict, the committed tokens before the block, the cloud's hidden states of the draft or
    # None); trace collection reads the cloud's view here
    observer: object = None
    # both sides keep each draft token's last-layer hidden state (WISV traces); a rule that needs
    # them (WISV) turns this on by itself
    trace_hidden: bool = False


class EdgeHalf:
    """The edge's half: its session and the drafting of one token at a time.

    A gate that reads hidden states (`gate.needs_hidden`) reads the edge's last-layer state BEFORE
    each drafted token: the state whose next-token distribution drafted it, which the edge already
    has (block.context). So a token gate decides before the token is fed back, and with `defers` the
    flagged token waits unfed for its verdict: a token the cloud replaces never costs the edge a
    forward, and the token it commits goes into the cache with the next one (`align`). The state
    AFTER each token (block.hidden: what WISV uploads and its traces keep) needs every token fed at
    once, so those rules and traces do not defer."""

    def __init__(self, lm: AudioLM, features, language: str, s: SpecSettings, books: Ledger):
        self.lm, self.s, self.books = lm, s, books
        self.rng = np.random.default_rng(s.seed + 1_000_003) if s.temperature > 0 else None
        self.keep_hidden = s.trace_hidden or s.rule.needs_hidden  # block.hidden: the state after each token
        self.keep_context = s.gate.needs_hidden  # block.context: the state before each token
        # greedy drafting reads the statistics of the greedy token after each extension: asked of the
        # extension itself (a batching executor computes them for all its drafting loops at once)
        self.entropy_temperature = s.gate.entropy_temperature  # a tuned entropy gate's
        # a sampling edge reads the law it draws from (a Q-S edge its lattice point too) and the
        # statistics that do not depend on the token drawn, asked of the extension the same way
        greedy = s.temperature <= 0 and s.rule.edge_distribution is None
        self.greedy_summary = greedy_summary(self.entropy_temperature) if greedy else None
        start = partial(lm.start, hidden=self.keep_context, summarize=self.summarize())
        self.sess = books.prefill("edge", start, features, language, scale=s.edge_time_scale,
                                  work=Work("edge", features.shape[-1], prefill=True))
        self.logits = self.sess.prefill_logits  # next-token logits after what the cache holds
        self.summary: TokenStats | SampledRow | None = self.sess.prefill_summary  # `summarize` of `self.logits`
        self.cached = 0  # caption tokens in the edge's KV cache
        self.state = self.sess.prefill_hidden  # the state after what the cache holds (with keep_context)
        self.defers = s.gate.level == "token" and not self.keep_hidden

    def pick(self) -> int:
        return pick(self.logits, self.s.temperature, self.rng)

    def feed(self, tok: int, hidden: bool = False) -> torch.Tensor | None:
        """Append a token to the cache; with `hidden`, return its last-layer hidden state."""
        return self._extend([tok], hidden)

    def summarize(self):
        """What the edge asks an extension to summarize of its last logits: the greedy token's
        statistics, or a sampling edge's rows at the rule's current lattice (Q-S: an adaptive policy
        moves the level between blocks)."""
        if self.s.temperature <= 0:
            return self.greedy_summary
        lattice = self.s.rule.lattice() if self.s.rule.edge_distribution is not None else None
        return sampled_summary(self.s.temperature, self.entropy_temperature, lattice)

    def _extend(self, ids: list[int], hidden: bool = False) -> torch.Tensor | None:
        out = self.books.forward("edge", self.sess.extend, ids, hidden or self.keep_context, self.summarize(),
                                 scale=self.s.edge_time_scale, work=Work("edge", len(ids), self.sess.length))
        self.logits, self.summary = out.logits[-1], out.summary
        self.cached += len(ids)
        if self.keep_context:
            self.state = out.hidden[-1]
        return out.hidden[-1] if hidden else None

    def draft(self, block: Block, needs_q: bool, feed: bool = True) -> int:
        """Draft one token into `block`; fed back to the cache unless it ends the caption, or unless
        `feed` is False (the caller feeds it with `feed_drafted`, or leaves it to `align`)."""
        rule = self.s.rule
        summarize = self.summarize()
        known = None if summarize is None else self.summary or summarize(self.logits[None])[0]
        if rule.edge_distribution is not None:  # Q-S / S-Q: drawn from the lattice point, which travels
            lattice = rule.lattice()
            if not isinstance(known, SampledRow) or known.lattice != lattice:  # (the level moved since)
                known = sampled_rows(self.logits[None], self.s.temperature, self.entropy_temperature, lattice)[0]
        if isinstance(known, SampledRow):  # drawn as `pick` draws
            tok = self._draw(known)
            stats, q = self._sampled(known, tok, needs_q)
        elif known is not None and not needs_q:  # (the prefill's logits are not summarized: done here)
            stats = known
            tok, q = stats.token, None
        else:
            tok = self.pick()
            stats, q = token_stats(self.logits, tok, self.s.temperature, self.entropy_temperature)
            q = q.float().cpu()  # what would travel; the rule sees the same values
        self._drafted(block, stats, q if needs_q else None)
        if feed:
            self.feed_drafted(block)
        return tok

    def _draw(self, row: SampledRow) -> int:
        return draw_from(row.cdf, self.rng)

    def _sampled(self, row: SampledRow, tok: int, needs_q: bool) -> tuple[TokenStats, torch.Tensor | None]:
        """The statistics of `tok` drawn from `row`, and the q that travels with it (Q-S / S-Q:
        the row's lattice point)."""
        if self.s.rule.edge_distribution is not None:
            return row.stats(tok)[0], self.s.rule.take(row.counts)
        stats, p = row.stats(tok)
        return stats, p.float() if needs_q else None  # (a SampledRow's law is on the CPU already)

    def _drafted(self, block: Block, stats: TokenStats, q: torch.Tensor | None) -> None:
        """`stats.token` drafted into `block` with its statistics, `q` when it travels, and (with
        keep_context) the state it was drafted from."""
        block.tokens.append(stats.token)
        block.stats.append(stats)
        if q is not None:
            block.q.append(q)
        if self.keep_context:  # float16 values, as the traces keep them (on the CPU, as they travel)
            block.context.append(self.state.half().float().cpu())

    def runs(self, needs_q: bool) -> bool:
        """Whether `draft_block` drafts as one run: the edge knows each next token from the summary
        of the forward before it (a greedy draft's statistics when no q travels, a sampling draft's
        row)."""
        return self.summarize() is not None and not (self.greedy_summary is not None and needs_q)

    def draft_block(self, block: Block, budget: int, needs_q: bool,
                    before: Callable[[Run, int], None] | None = None) -> None:
        """Draft into `block` until it holds `budget` tokens or ends the caption, every token fed
        back as `draft` feeds it. Where the edge `runs`, it drafts the first token and asks its
        session for the rest as one run (`Session.extend_run`: a batching executor continues it at
        each step without coming back here), `before(run, j)` called before its forward j is booked
        (Ledger.forward_run); otherwise token by token."""
        eos = self.lm.eos_token_id
        summarize = self.summarize()
        greedy = self.greedy_summary is not None
        if not self.runs(needs_q):
            while len(block) < budget and self.draft(block, needs_q) != eos:
                pass
            return
        if len(block) >= budget:
            return
        tok = self.draft(block, needs_q, feed=False)
        if tok == eos:
            if self.keep_hidden:
                block.hidden.append(None)
            return
        run = self.books.forward_run("edge", self.sess, [tok], summarize, budget - len(block) + 1, eos,
                                     self.keep_hidden or self.keep_context, scale=self.s.edge_time_scale,
                                     before=before, choose=summary_token if greedy else self._draw)
        self.logits, self.summary = run.logits, run.summaries[-1]
        self.cached += run.forwards
        for j, row in enumerate(run.summaries):  # forward j fed the block's last token; `row` drafts the next
            if self.keep_hidden:  # as it travels: float16, on the CPU
                block.hidden.append(run.hidden[j].half().float().cpu())
            if self.keep_context:
                self.state = run.hidden[j]
            if len(block) == budget:  # the run's last summary: the next block's first token
                break
            tok = run.tokens[j]
            stats, q = (row, None) if greedy else self._sampled(row, tok, needs_q)
            self._drafted(block, stats, q)
            if tok == eos:  # drafted, never fed
                if self.keep_hidden:
                    block.hidden.append(None)
                break

    def feed_drafted(self, block: Block) -> None:
        """Feed the block's last drafted token back to the cache (an end token is never fed)."""
        tok = block.tokens[-1]
        h = self.feed(tok, self.keep_hidden) if tok != self.lm.eos_token_id else None
        if self.keep_hidden:  # as it travels: float16, on the CPU
            block.hidden.append(None if h is None else h.half().float().cpu())

    def align(self, committed: list[int], then: list[int] = ()) -> None:
        """After a verdict: make the cache hold `committed` followed by `then` (the cloud's token).
        Drafted tokens past `committed` are rolled back; committed tokens not yet fed (a deferred
        flagged token the cloud accepted) go in with `then`, in one forward."""
        if self.cached > len(committed):
            self.truncate(len(committed))
        rest = list(committed[self.cached:]) + list(then)
        if rest:
            self._extend(rest)

    def truncate(self, length: int) -> None:
        """Crop the cache to the first `length` caption tokens (after a rejection)."""
        self.sess.rollback(self.cached - length)
        self.cached = length
        self.state = None  # no longer the last state; the next feed brings the current one


class CloudHalf(Transport):
    """The cloud's half in-process, as a transport: a `CloudSession` on this caption's books, its
    packets on the link model. With `cloud_cache` its KV cache persists across rounds; without,
    audio and prefix are re-encoded."""

    def __init__(self, lm: AudioLM, features, language: str, s: SpecSettings, books: Ledger):
        super().__init__(s.rule, books)
        self.s, self.language = s, language
        self.features = books.sent(lm.uplink, features)  # what the edge sends for the clip's log-mel `features`
        self.wire_dtype = lm.uplink.wire_dtype  # how: float16, or a quantised uplink's codes
        self.session = CloudSession(lm, self.features, language, s.rule, s.seed, s.cloud_cache)
        self.session.keep_hidden |= s.trace_hidden
        self._verdict = None  # the round's verdict, reached in `verify` (WISV's question included)

    @property
    def sess(self):
        return self.session.sess

    @property
    def rows(self):
        return self.session.rows

    def check(self, rnd: Round, eos: int):
        """The round `rnd` on the session, off the clock; returns the verdict and the (scaled)
        compute seconds (the blocking loop waits for them, the pipelined one overlaps them)."""
        block = rnd.block
        verdict, spent, positions = self.session.verify(
            rnd.sync, rnd.prefix, block.tokens, block.q, eos,
            measure=lambda fn, *a, work: self.books.measure(fn, *a, scale=self.s.cloud_time_scale, work=work),
            edge_hidden=block.hidden, csi=rnd.csi)
        self.books.cloud_verified(spent, positions)
        return verdict, spent

    # ---- the transport: the blocking loop's rounds on the link model and the virtual clock ----
    def opened(self, link: Link, session_id: int, seq: int) -> tuple[int, int]:
        if self.sess is None:
            self.post(link, "up", "features", self.features_packet(session_id))
        return session_id, seq

    def features_packet(self, session_id: int) -> bytes:
        """The FEATURES packet that opens the cloud's session: what the edge sends of the clip."""
        return packets.features_packet(session_id, self.features, self.language, self.wire_dtype)

    def post(self, link: Link, direction: str, kind: str, packet: bytes) -> None:
        self.books.send(link, direction, kind, packet)

    def verify(self, rnd: Round, eos: int) -> Answer:
        # the whole round at once: a WISV verdict names the positions it needed (the selective
        # protocol's question), and `hidden` then hands that verdict back
        self._verdict, dt = self.check(rnd, eos)
        self.books.elapse(dt)
        return self._answer(rnd, self._verdict.asked)

    def hidden(self, rnd: Round, asked: list[int], eos: int) -> Answer:
        return self._answer(rnd)

    def _answer(self, rnd: Round, asked=()) -> Answer:
        v = self._verdict
        return Answer(v, rnd.verdict_packet(v), list(asked))

    def observe(self, rnd: Round, verdict) -> None:
        if self.s.observer is not None:
            self.s.observer(rnd.block, self.rows, verdict, rnd.prefix, self.session.hidden)


def last_token(block: Block) -> Block:
    """The block's last token as a block of its own (token level, `verify = "alone"`)."""
    n = len(block) - 1
    return Block(start=block.start + n, tokens=block.tokens[n:], stats=block.stats[n:], q=block.q[n:],
                 hidden=block.hidden[n:], context=block.context[n:], accept_rate=block.accept_rate, audio=block.audio,
                 language=block.language)
