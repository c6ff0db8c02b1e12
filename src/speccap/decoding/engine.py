"""The decoding loops: edge-only, cloud-only, and gated speculative decoding (UGSD).

Compute is measured (wall time of each model call); communication is modelled by a `Link`;
a virtual clock adds the two, so a sweep is fast and repeatable. The speculative loop:

1. the edge drafts a block of L tokens (L from the length policy), keeping per-token stats;
2. the gate looks at the block; a block it keeps local is committed as drafted;
3. an escalated block goes up with only what the cloud has not seen: the tokens committed
   since the last sync and the draft (the audio features once, with the first escalation);
4. the cloud runs ONE forward over them on its persistent KV cache and the rule returns
   (accepted prefix, one cloud token): both sides roll back past the rejected tokens and the
   cloud token is committed (a correction, or a free bonus when the whole block passed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..metrics.system import ResourceMonitor
from ..models.base import AudioLM
from ..models.generate import pick
from . import packets
from .cloud import CloudSession
from .gates import Gate
from .link import Link
from .policies import LengthPolicy
from .stats import Block, audio_summary, token_stats
from .verify import Rule
from .wisv import csi_of
from .wisv_upload import choose


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
            "cloud_tokens": self.cloud_tokens, "in_flight": self.in_flight, "wait_time": self.wait_time,
            "wasted": self.wasted, "stale": self.stale,
            "position_checked": self.position_checked, "position_accepted": self.position_accepted,
        }
        out.update(self.resources)
        out.update(self.network)
        return out


class _Clock:
    """Measures model calls and keeps the virtual time. `scale` multiplies a measured call on the
    virtual clock (hardware emulation: 2.0 = a device half as fast as this machine)."""

    def __init__(self):
        self.virtual = 0.0
        self.model = 0.0

    def measure(self, fn, *args, scale: float = 1.0):
        """Run a model call; return (output, scaled seconds) without advancing the virtual time
        (for a call on another timeline, e.g. the cloud's in the pipelined loop)."""
        t = time.perf_counter()
        out = fn(*args)
        dt = time.perf_counter() - t
        self.model += dt
        return out, dt * scale

    def run(self, fn, *args, scale: float = 1.0):
        out, dt = self.measure(fn, *args, scale=scale)
        self.virtual += dt
        return out, dt


def _finish(rec: CaptionRecord, lm: AudioLM, ids: list[int], clock: _Clock, wall0: float, mon: ResourceMonitor):
    rec.token_ids = ids
    rec.caption = lm.decode(ids)
    rec.total_time = clock.virtual
    rec.model_time = clock.model
    rec.wall_time = time.perf_counter() - wall0
    rec.resources = mon.summary()
    return rec


def edge_only(edge: AudioLM, features: np.ndarray, language: str, max_new_tokens: int = 128,
              temperature: float = 0.0, seed: int = 0, time_scale: float = 1.0) -> CaptionRecord:
    """The device alone: nothing crosses the link."""
    return _local(edge, features, language, max_new_tokens, temperature, seed, "edge", None, time_scale)


def cloud_only(cloud: AudioLM, features: np.ndarray, language: str, link: Link, max_new_tokens: int = 128,
               temperature: float = 0.0, seed: int = 0, time_scale: float = 1.0) -> CaptionRecord:
    """The features go up once, the cloud generates, tokens come down as they are made."""
    return _local(cloud, features, language, max_new_tokens, temperature, seed, "cloud", link, time_scale)


def _local(lm, features, language, max_new_tokens, temperature, seed, method, link: Link | None,
           time_scale: float = 1.0) -> CaptionRecord:
    rng = np.random.default_rng(seed) if temperature > 0 else None
    rec = CaptionRecord("", [], method)
    clock = _Clock()
    wall0 = time.perf_counter()
    bits = packets.id_bits(lm.vocab_size)
    with ResourceMonitor() as mon:
        if link is not None:
            up = packets.features_packet(1, features, language)
            _charge(rec, clock, link, "up", "features", up)
        session, dt = clock.run(lm.start, features, language, scale=time_scale)
        rec.prefill_time = dt
        rec.edge_compute, rec.cloud_compute = (dt, 0.0) if link is None else (0.0, dt)
        rec.prompt_tokens = session.prompt_len
        if link is not None:
            rec.cloud_tokens = session.prompt_len
        ids: list[int] = []
        logits = session.prefill_logits
        while len(ids) < max_new_tokens:
            tok = pick(logits, temperature, rng)
            if link is not None:  # each token streams down as it is made
                _charge(rec, clock, link, "down", "token", packets.verdict_packet(1, len(ids), 0, tok, bits),
                        overlap=len(ids) > 0)
            if not ids:
                rec.ttft = clock.virtual
            if tok == lm.eos_token_id:
                break
            ids.append(tok)
            if len(ids) == max_new_tokens:
                break
            out, dt = clock.run(session.extend, [tok], scale=time_scale)
            logits = out.logits[-1]
            if link is None:
                rec.edge_compute += dt
            else:
                rec.cloud_compute += dt
                rec.cloud_tokens += 1
    return _finish(rec, lm, ids, clock, wall0, mon)


def _account(rec: CaptionRecord, link: Link, direction: str, kind: str, payload: bytes) -> float:
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


def _charge(rec: CaptionRecord, clock: _Clock, link: Link, direction: str, kind: str, payload: bytes,
            overlap: bool = False) -> None:
    """Account one packet on the blocking clock. `overlap`: a streamed token whose transfer hides
    behind the next token's compute; only its serialization beyond the propagation already paid is added."""
    seconds = _account(rec, link, direction, kind, payload)
    charged = max(seconds - link.rtt_s / 2, 0.0) if overlap else seconds
    clock.virtual += charged
    rec.link_time += charged


@dataclass
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
    # hardware emulation on the virtual clock: measured compute times these factors
    edge_time_scale: float = 1.0
    cloud_time_scale: float = 1.0
    # blocking loop: called after each verification with (block, the cloud's rows for it, the
    # verdict, the committed tokens before the block, the cloud's hidden states of the draft or
    # None); trace collection reads the cloud's view here
    observer: object = None
    # both sides keep each draft token's last-layer hidden state (WISV traces); a rule that needs
    # them (WISV) turns this on by itself
    trace_hidden: bool = False


class _Edge:
    """The edge's half: its session and the drafting of one token at a time."""

    def __init__(self, lm: AudioLM, features, language: str, s: SpecSettings, clock: _Clock, rec: CaptionRecord):
        self.lm, self.s, self.clock, self.rec = lm, s, clock, rec
        self.rng = np.random.default_rng(s.seed + 1_000_003) if s.temperature > 0 else None
        self.sess, dt = clock.run(lm.start, features, language, scale=s.edge_time_scale)
        rec.prefill_time = rec.edge_compute = dt
        rec.prompt_tokens = self.sess.prompt_len
        self.logits = self.sess.prefill_logits  # next-token logits after what the cache holds
        self.cached = 0  # caption tokens in the edge's KV cache
        self.keep_hidden = s.trace_hidden or s.rule.needs_hidden or s.gate.needs_hidden

    def pick(self) -> int:
        return pick(self.logits, self.s.temperature, self.rng)

    def feed(self, tok: int, hidden: bool = False) -> torch.Tensor | None:
        """Append a token to the cache; with `hidden`, return its last-layer hidden state."""
        out, dt = self.clock.run(self.sess.extend, [tok], hidden, scale=self.s.edge_time_scale)
        self.rec.edge_compute += dt
        self.logits = out.logits[-1]
        self.cached += 1
        return out.hidden[-1] if hidden else None

    def draft(self, block: Block, needs_q: bool) -> int:
        """Draft one token into `block` (fed back to the cache unless it ends the caption)."""
        rule = self.s.rule
        if rule.edge_distribution is not None:  # Q-S / S-Q: the quantized distribution travels
            p = torch.softmax(self.logits.double() / self.s.temperature, dim=-1)
            q = rule.edge_distribution(p)
            law = (q if rule.sample_quantized else p).numpy()
            tok = int(self.rng.choice(len(law), p=law / law.sum()))
            stats, _ = token_stats(self.logits, tok, self.s.temperature)
        else:
            tok = self.pick()
            stats, q = token_stats(self.logits, tok, self.s.temperature)
            q = q.float()  # what would travel; the rule sees the same values
        block.tokens.append(tok)
        block.stats.append(stats)
        if needs_q:
            block.q.append(q)
        h = self.feed(tok, self.keep_hidden) if tok != self.lm.eos_token_id else None
        if self.keep_hidden:  # as it travels: float16
            block.hidden.append(None if h is None else h.half().float())
        return tok

    def truncate(self, length: int) -> None:
        """Crop the cache to the first `length` caption tokens (after a rejection)."""
        self.sess.rollback(self.cached - length)
        self.cached = length


class _Cloud:
    """The cloud's half in-process: a `CloudSession` on this caption's clock and record. With
    `cloud_cache` its KV cache persists across rounds; without, audio and prefix are re-encoded."""

    def __init__(self, lm: AudioLM, features, language: str, s: SpecSettings, clock: _Clock, rec: CaptionRecord):
        self.s, self.clock, self.rec, self.features, self.language = s, clock, rec, features, language
        self.session = CloudSession(lm, features, language, s.rule, s.seed, s.cloud_cache)
        self.session.keep_hidden |= s.trace_hidden
        self.synced = 0  # committed caption tokens the cloud's cache holds
        # WISV: the caption's mismatches / examined tokens so far (the `auto` protocol's estimate)
        self.mismatches, self.examined = 0, 0

    @property
    def sess(self):
        return self.session.sess

    @property
    def rows(self):
        return self.session.rows

    def verify(self, sync: list[int], prefix: list[int], block: Block, eos: int, csi=None):
        """One round on the session; returns the verdict and the (scaled) compute seconds."""
        verdict, spent, positions = self.session.verify(
            sync, prefix, block.tokens, block.q, eos,
            measure=lambda fn, *a: self.clock.measure(fn, *a, scale=self.s.cloud_time_scale),
            edge_hidden=block.hidden, csi=csi)
        self.rec.cloud_tokens += positions
        self.rec.cloud_compute += spent
        return verdict, spent

    def round(self, link: Link, session_id: int, seq: int, committed: list[int], block: Block, eos: int,
              bits: int):
        """The blocking loop's escalation: the packets up on the link model, one verification, the
        verdict down, all on the virtual clock. Returns the verdict (never None: this cloud cannot fail)."""
        rec, clock, rule = self.rec, self.clock, self.s.rule
        sync = committed[self.synced:]
        if self.sess is None:
            _charge(rec, clock, link, "up", "features", packets.features_packet(session_id, self.features,
                                                                                self.language))
        protocol = self._protocol(link, block, bits) if rule.needs_hidden else None
        up = _verify_upload(rule, session_id, seq, sync, block, bits)
        if protocol == "full":  # every drafted token's hidden state rides with the ids
            up += hidden_upload(session_id, seq, block, range(len(block)))
        _charge(rec, clock, link, "up", "verify", up)
        rec.synced += len(sync)
        verdict, dt = self.verify(sync, committed, block, eos, csi_of(link) if rule.needs_hidden else None)
        clock.virtual += dt
        if protocol == "selective" and verdict.asked:  # the cloud asks for the states at its mismatches
            _charge(rec, clock, link, "down", "mismatch", packets.mismatch_packet(session_id, seq, verdict.asked))
            _charge(rec, clock, link, "up", "hidden", hidden_upload(session_id, seq, block, verdict.asked))
            rec.hidden_requests += 1
        if rule.needs_hidden:
            rec.tolerated += verdict.tolerated
            self.mismatches += sum(r > 1 for r in verdict.ranks)
            self.examined += len(verdict.ranks)
        if self.s.observer is not None:
            self.s.observer(block, self.rows, verdict, committed, self.session.hidden)
        _charge(rec, clock, link, "down", "verdict", packets.verdict_packet(session_id, seq, verdict.accepted,
                                                                              verdict.token, bits))
        self.synced = len(committed) + verdict.accepted
        return verdict


    def _protocol(self, link: Link, block: Block, bits: int) -> str:
        return wisv_protocol(self.s.rule, link, block, bits, self.mismatches, self.examined)


def wisv_protocol(rule, link: Link, block: Block, bits: int, mismatches: int, examined: int) -> str:
    """WISV's upload protocol for a round: the rule's, or with `auto` the one the link model says is
    faster for the mismatches expected (the caption's running rate so far, prior 1 in 10)."""
    if rule.protocol != "auto":
        return rule.protocol
    rate = (mismatches + 1) / (examined + 10)
    d = next((h.shape[-1] for h in block.hidden if h is not None), 0)
    return choose(link, len(block), d, rate * len(block), bits)


def hidden_upload(session_id: int, seq: int, block: Block, positions) -> bytes:
    """A HIDDEN packet with the edge's states at `positions` (an end-of-caption token has none)."""
    pos = [i for i in positions if block.hidden[i] is not None]
    h = torch.stack([block.hidden[i] for i in pos]).numpy() if pos else np.zeros((0, 0), np.float16)
    return packets.hidden_packet(session_id, seq, pos, h)


def _verify_upload(rule: Rule, session_id: int, seq: int, sync: list[int], block: Block, bits: int) -> bytes:
    up = packets.verify_packet(session_id, seq, sync, block.tokens, bits)
    return up + rule.q_payload(block.q) if rule.needs_q else up


def _book_verdict(rec: CaptionRecord, verdict) -> None:
    rec.accepted += verdict.accepted
    _positions(rec, verdict.accepted, len(verdict.ranks))
    if verdict.token is not None:
        if verdict.corrected:
            rec.corrected += 1
        else:
            rec.bonus += 1


def speculative(edge: AudioLM, cloud: AudioLM, features: np.ndarray, language: str, settings: SpecSettings,
                link: Link, session_id: int = 1, keep_sessions: bool = False) -> CaptionRecord:
    """Gated edge-cloud speculative decoding of one caption: the blocking loop, or the pipelined
    one when `settings.in_flight` > 0. `keep_sessions` leaves both model sessions on the record
    (`.sessions`) for inspection."""
    if settings.in_flight > 0:
        if settings.gate.level == "token":
            raise ValueError("token-level gates run in the blocking loop only (in_flight 0); the pipelined "
                             "loop verifies whole blocks")
        from .pipelined import pipelined
        return pipelined(edge, cloud, features, language, settings, link, session_id, keep_sessions)
    bits = packets.id_bits(min(edge.vocab_size, cloud.vocab_size))
    rec = blocking_loop(edge, lambda clock, rec: _Cloud(cloud, features, language, settings, clock, rec),
                        features, language, settings, link, session_id, bits, keep_sessions)
    return rec


def blocking_loop(edge: AudioLM, make_cloud, features: np.ndarray, language: str, settings: SpecSettings,
                  link: Link, session_id: int, bits: int, keep_sessions: bool = False) -> CaptionRecord:
    """The blocking speculative loop around any cloud half: `make_cloud(clock, record)` returns an
    object whose `round(link, session_id, seq, committed, block, eos, bits)` verifies one block and
    returns the verdict, or None when the cloud could not be reached (the block is then committed
    as drafted: edge-only for that block). In-process: `_Cloud`; over a socket: serving.edge."""
    rec = CaptionRecord("", [], "speculative")
    clock = _Clock()
    wall0 = time.perf_counter()
    eos = edge.eos_token_id
    policy, gate, rule = settings.policy, settings.gate, settings.rule
    audio = audio_summary(features)
    with ResourceMonitor() as mon:
        ed = _Edge(edge, features, language, settings, clock, rec)
        cl = make_cloud(clock, rec)
        committed: list[int] = []
        seq = 0
        done = False
        while not done and len(committed) < settings.max_new_tokens:
            # 1. draft (a token gate stops at the first token it flags)
            block = Block(start=len(committed), accept_rate=rec.accepted / rec.transmitted if rec.transmitted else None,
                          audio=audio, language=language)
            if gate.level == "token":
                escalate = _draft_until_flagged(ed, block, gate, rule.needs_q, settings.max_new_tokens - len(committed),
                                                eos)
                rec.drafted += len(block)
                if escalate and gate.verify == "alone" and len(block) > 1:
                    # the unflagged tokens are committed as drafted; they reach the cloud as context
                    committed.extend(block.tokens[:-1])
                    block = _last_token(block)
            else:
                budget = min(policy.next_length(), settings.max_new_tokens - len(committed))
                while len(block) < budget and ed.draft(block, rule.needs_q) != eos:
                    pass
                rec.drafted += len(block)
                escalate = gate.escalate(block)
            # 2. gate; 3. escalate (only what the cloud has not seen) with 4. one cloud forward
            verdict = None
            if escalate:
                seq += 1
                verdict = cl.round(link, session_id, seq, committed, block, eos, bits)
            if verdict is None:  # kept local (or the cloud was unreachable): committed as drafted
                committed.extend(t for t in block.tokens if t != eos)
                done = bool(block.tokens) and block.tokens[-1] == eos
                policy.update(len(block), len(block), escalated=False, corrected=False)
                if not rec.ttft:
                    rec.ttft = clock.virtual  # the first committed token (or the end) is known now
                continue
            rec.rounds += 1
            rec.transmitted += len(block)
            # roll back the edge past the rejected tokens, commit the cloud's token
            accepted = block.tokens[: verdict.accepted]
            committed.extend(t for t in accepted if t != eos)
            ed.truncate(len(committed))
            _book_verdict(rec, verdict)
            if verdict.token is None or verdict.token == eos or (accepted and accepted[-1] == eos):
                done = True
            else:
                committed.append(verdict.token)
                if len(committed) < settings.max_new_tokens:
                    ed.feed(verdict.token)
            if not rec.ttft:
                rec.ttft = clock.virtual
            policy.update(len(block), verdict.accepted, escalated=True, corrected=verdict.corrected)
            policy.observe(rec)
    if keep_sessions:
        rec.sessions = (ed.sess, cl.sess)
    return _finish(rec, edge, committed[: settings.max_new_tokens], clock, wall0, mon)


def _draft_until_flagged(ed: _Edge, block: Block, gate: Gate, needs_q: bool, budget: int, eos: int) -> bool:
    """Token level: draft into `block` until the gate flags a token (True), the caption ends or the
    budget is spent (False)."""
    while len(block) < budget:
        tok = ed.draft(block, needs_q)
        if gate.flag(block):
            return True
        if tok == eos:
            break
    return False


def _last_token(block: Block) -> Block:
    """The block's last token as a block of its own (token level, `verify = "alone"`)."""
    n = len(block) - 1
    return Block(start=block.start + n, tokens=block.tokens[n:], stats=block.stats[n:], q=block.q[n:],
                 hidden=block.hidden[n:], accept_rate=block.accept_rate, audio=block.audio, language=block.language)


def _positions(rec: CaptionRecord, accepted: int, checked: int) -> None:
    while len(rec.position_checked) < checked:
        rec.position_checked.append(0)
        rec.position_accepted.append(0)
    for i in range(checked):
        rec.position_checked[i] += 1
        rec.position_accepted[i] += int(i < accepted)


def settings_from_params(decode, max_new_tokens: int, seed: int = 0, qs_level: int = 16) -> SpecSettings:
    """SpecSettings from the `decode:` section of params (a config.DecodeParams); `qs_level`: the
    lattice level of the qs / sq rules (params qs.level)."""
    from .gates import make_gate
    from .policies import Fixed, UGSDAdaptive
    from .verify import make_rule
    a = decode.adaptive
    policy = UGSDAdaptive(a.l_min, a.l_base, a.l_max) if decode.block_len == 0 else Fixed(decode.block_len)
    gate = make_gate(decode.gate, None if decode.gate in ("never", "always") else decode.threshold)
    return SpecSettings(gate=gate, rule=make_rule(decode.rule, decode.rank, decode.temperature or 1.0, qs_level),
                        policy=policy, temperature=decode.temperature, max_new_tokens=max_new_tokens, seed=seed,
                        in_flight=decode.in_flight, draft_ahead=decode.draft_ahead, edge_time_scale=decode.edge_time_scale,
                        cloud_time_scale=decode.cloud_time_scale)
