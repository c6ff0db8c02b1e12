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

from functools import partial

import numpy as np
import torch

from ..metrics.system import ResourceMonitor
from ..models.base import AudioLM
from ..models.generate import autoregress, greedy_run, greedy_tokens, pick
from . import packets
from .cost import CostModel, Work
from .gates import Gate
from .halves import CloudHalf, EdgeHalf, SpecSettings, last_token
from .ledger import CaptionRecord, Ledger
from .link import Link
from .stats import Block, ClipAudio

# the loops, and the record and settings callers build them with (both live in ledger / halves)
__all__ = ["CaptionRecord", "SpecSettings", "edge_only", "cloud_only", "speculative", "blocking_loop"]


def edge_only(edge: AudioLM, features: np.ndarray, language: str, max_new_tokens: int = 128,
              temperature: float = 0.0, seed: int = 0, time_scale: float = 1.0, cost: CostModel | None = None
              ) -> CaptionRecord:
    """The device alone: nothing crosses the link. `cost`: charge model calls by it (decoding.cost)."""
    return _local(edge, features, language, max_new_tokens, temperature, seed, "edge", None, time_scale, cost)


def cloud_only(cloud: AudioLM, features: np.ndarray, language: str, link: Link, max_new_tokens: int = 128,
               temperature: float = 0.0, seed: int = 0, time_scale: float = 1.0, cost: CostModel | None = None
               ) -> CaptionRecord:
    """The features go up once, the cloud generates, tokens come down as they are made."""
    return _local(cloud, features, language, max_new_tokens, temperature, seed, "cloud", link, time_scale, cost)


def _local(lm, features, language, max_new_tokens, temperature, seed, method, link: Link | None,
           time_scale: float = 1.0, cost: CostModel | None = None) -> CaptionRecord:
    rng = np.random.default_rng(seed) if temperature > 0 else None
    books = Ledger(method, cost)
    bits = packets.id_bits(lm.vocab_size)
    features = books.sent(lm.uplink, features)  # what the model reads: for a cloud, what the edge sends it
    role = "edge" if link is None else "cloud"
    with ResourceMonitor() as mon:
        if link is not None:
            books.send(link, "up", "features", packets.features_packet(1, features, language, lm.uplink.wire_dtype))
        # greedy: each token is asked of the extension before it (one argmax per step for a batch
        # of loops), the caption of the session as one run
        summarize = greedy_tokens if temperature <= 0 else None
        session = books.prefill(role, partial(lm.start, summarize=summarize), features, language, scale=time_scale,
                                work=Work(method, features.shape[-1], prefill=True))

        def seen(i, tok):
            if link is not None:  # each token streams down as it is made
                books.send(link, "down", "token", packets.verdict_packet(1, i, 0, tok, bits), overlap=i > 0)
            if i == 0:
                books.first_token()

        if summarize is not None:
            def run(ids, steps, stop, before):
                return books.forward_run(role, session, ids, summarize, steps, stop, scale=time_scale, before=before)
            ids = greedy_run(session.prefill_summary, run, lm.eos_token_id, max_new_tokens, seen)
        else:
            def feed(tok) -> torch.Tensor:
                return books.forward(role, session.extend, [tok], scale=time_scale,
                                     work=Work(method, 1, session.length)).logits[-1]
            ids = autoregress(session.prefill_logits, feed, lm.eos_token_id, max_new_tokens,
                              lambda logits: pick(logits, temperature, rng), lambda i, tok, _: seen(i, tok))
    return books.finish(lm, ids, mon)


def speculative(edge: AudioLM, cloud: AudioLM, features: np.ndarray, language: str, settings: SpecSettings,
                link: Link, session_id: int = 1, keep_sessions: bool = False) -> CaptionRecord:
    """Gated edge-cloud speculative decoding of one caption: the blocking loop, or the pipelined
    one when `settings.in_flight` > 0. `keep_sessions` leaves both model sessions on the record
    (`.sessions`) for inspection."""
    if settings.in_flight > 0:
        from .pipelined import pipelined
        return pipelined(edge, cloud, features, language, settings, link, session_id, keep_sessions)
    bits = packets.id_bits(min(edge.vocab_size, cloud.vocab_size))
    return blocking_loop(edge, lambda books: CloudHalf(cloud, features, language, settings, books),
                         features, language, settings, link, session_id, bits, keep_sessions)


def blocking_loop(edge: AudioLM, make_cloud, features: np.ndarray, language: str, settings: SpecSettings,
                  link: Link, session_id: int, bits: int, keep_sessions: bool = False,
                  method: str = "speculative", networked: bool = False) -> CaptionRecord:
    """The blocking speculative loop around any cloud half: `make_cloud(ledger)` returns an
    object whose `round(link, session_id, seq, committed, block, eos, bits)` verifies one block and
    returns the verdict, or None when the cloud could not be reached (the block is then committed
    as drafted: edge-only for that block). In-process: `CloudHalf`; over a socket: serving.edge."""
    books = Ledger(method, settings.cost, networked=networked)
    rec = books.rec  # read (accept rate so far, the policy's view); written through `books` only
    eos = edge.eos_token_id
    policy, gate, rule = settings.policy, settings.gate, settings.rule
    audio = ClipAudio(features)
    with ResourceMonitor() as mon:
        ed = EdgeHalf(edge, features, language, settings, books)
        cl = make_cloud(books)
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
                books.drafted(len(block))
                if escalate and gate.verify == "alone" and len(block) > 1:
                    # the unflagged tokens are committed as drafted; they reach the cloud as context
                    committed.extend(block.tokens[:-1])
                    block = last_token(block)
            else:
                ed.draft_block(block, min(policy.next_length(), settings.max_new_tokens - len(committed)), rule.needs_q)
                books.drafted(len(block))
                escalate = gate.escalate(block)
            # 2. gate; 3. escalate (only what the cloud has not seen) with 4. one cloud forward
            verdict = None
            if escalate:
                seq += 1
                verdict = cl.round(link, session_id, seq, committed, block, eos, bits)
            if verdict is None:  # kept local (or the cloud was unreachable): committed as drafted
                committed.extend(t for t in block.tokens if t != eos)
                ed.align(committed)  # a flagged token still unfed goes in now
                done = bool(block.tokens) and block.tokens[-1] == eos
                policy.update(len(block), len(block), escalated=False, corrected=False)
                books.first_token()  # the first committed token (or the end) is known now
                continue
            books.escalated(len(block))
            # roll back the edge past the rejected tokens, commit the cloud's token
            accepted = block.tokens[: verdict.accepted]
            committed.extend(t for t in accepted if t != eos)
            books.verdict(verdict, len(block))
            if verdict.token is None and accepted and accepted[-1] != eos:  # no bonus (an oracle at a budget)
                ed.align(committed)
            elif verdict.token is None or verdict.token == eos or (accepted and accepted[-1] == eos):
                done = True
                ed.truncate(min(ed.cached, len(committed)))  # nothing more to feed: the caption is done
            else:
                ed.align(committed, [verdict.token] if len(committed) + 1 < settings.max_new_tokens else [])
                committed.append(verdict.token)
            books.first_token()
            policy.update(len(block), verdict.accepted, escalated=True, corrected=verdict.corrected)
            policy.observe(rec)
    return books.finish(edge, committed[: settings.max_new_tokens], mon, (ed.sess, cl.sess) if keep_sessions else None)


def _draft_until_flagged(ed: EdgeHalf, block: Block, gate: Gate, needs_q: bool, budget: int, eos: int) -> bool:
    """Token level: draft into `block` until the gate flags a token (True), the caption ends or the
    budget is spent (False)."""
    while len(block) < budget:
        tok = ed.draft(block, needs_q, feed=not ed.defers)
        if gate.flag(block):
            return True  # deferred: the token goes into the edge's cache with its verdict (EdgeHalf.align)
        if ed.defers:
            ed.feed_drafted(block)
        if tok == eos:
            break
    return False
