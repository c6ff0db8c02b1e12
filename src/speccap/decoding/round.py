"""One verification round, as the edge sends it and hears back, the same over every transport.

A `Round` is what goes up: the committed tokens the cloud's cache lacks (sync), the drafted block,
and what the rule reads beside the tokens (draft distributions, WISV's channel state and hidden
states), with the WISV upload protocol chosen for it; `Round.packet` gives its bytes. An `Answer`
is what comes down: the verdict, or WISV's selective protocol's question first.

`Transport.exchange` is the edge's side of a blocking round, written once: open the cloud's
session if needed, build the round, send it, answer a question for hidden states, learn the
mismatch rate, book the verdict. A transport only moves the bytes and books them on its clock:
`CloudHalf` (decoding.halves) verifies in-process on the link model; `RemoteCloud`
(serving.edge) posts the same packets to `speccap serve-cloud`, which judges them with the same
`CloudSession` code, having read the payload back with `read_payload`. The pipelined loop builds
the same `Round` with its epoch and guess (a PIPELINED header before the same payload) and verifies
it in-process with the same call; only its timing is its own: it overlaps rounds on pipes of its
own (decoding.pipelined).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np
import torch

from . import packets
from .ledger import Ledger
from .link import Link
from .qs import unpack_block
from .stats import Block
from .verify import Rule, Verdict
from .wisv.head import CSI
from .wisv.rule import csi_of
from .wisv.upload import MismatchRate


@dataclass(frozen=True)
class Round:
    """What the edge sends in one round."""

    session_id: int
    seq: int
    sync: list[int]  # committed tokens the cloud's cache does not hold yet
    prefix: list[int]  # the whole caption before the block (a cloud without a kept cache re-reads it)
    block: Block
    bits: int  # bits per token id on the wire
    protocol: str | None = None  # WISV's upload protocol for this block ("full" | "selective")
    csi: object = None  # WISV: the channel state the edge measured (decoding.wisv.head.CSI)
    # the pipelined loop's: contradicting verdicts the edge has heard of (the cloud drops a round
    # whose epoch is behind its own), and its guess at the cloud's bonus token; None: a blocking round
    epoch: int | None = None
    guess: int | None = None

    def packet(self, rule: Rule, q_dtype: str = "float16") -> bytes:
        """The round's packet: a VERIFY header with the sync and draft ids (a PIPELINED one, with the
        epoch and the guess, in the pipelined loop), then `round_payload`."""
        if self.epoch is None:
            head = packets.verify_packet(self.session_id, self.seq, self.sync, self.block.tokens, self.bits)
        else:
            head = packets.pipelined_packet(self.session_id, self.seq, self.epoch, self.sync, self.block.tokens,
                                            self.guess, self.bits)
        return head + round_payload(rule, self.session_id, self.seq, self.block, self.protocol, self.csi, q_dtype)

    def verdict_packet(self, verdict: Verdict) -> bytes:
        """The VERDICT packet answering this round."""
        return packets.verdict_packet(self.session_id, self.seq, verdict.accepted, verdict.token, self.bits)

    def hidden_packet(self, positions) -> bytes:
        return hidden_upload(self.session_id, self.seq, self.block, positions)


@dataclass
class Answer:
    """What came back for a round: the verdict and its packet, or (WISV, selective protocol) the
    draft positions whose hidden states the cloud asks for before it judges."""

    verdict: Verdict | None
    packet: bytes
    asked: list[int] = field(default_factory=list)


class Transport(ABC):
    """The blocking loop's way to the cloud for one caption (engine.blocking_loop calls `round`).
    Subclasses move the bytes: `opened` makes sure the cloud has the audio, `post` books a packet on
    this transport's clock, `verify` and `hidden` carry a round and its hidden states to the cloud."""

    q_dtype = "float16"

    def __init__(self, rule: Rule, books: Ledger):
        self.rule, self.books = rule, books
        self.cloud_holds = 0  # committed caption tokens the cloud's cache holds
        self.rate = MismatchRate()  # WISV's `auto` protocol chooses by it

    @abstractmethod
    def opened(self, link: Link, session_id: int, seq: int) -> tuple[int, int]:
        """Open the cloud's session if it has none (sending the audio features); returns the
        session id and sequence number this round goes under."""

    @abstractmethod
    def post(self, link: Link, direction: str, kind: str, packet: bytes) -> None:
        """Book one packet that crosses the link."""

    @abstractmethod
    def verify(self, rnd: Round, eos: int) -> Answer:
        """Carry the round to the cloud; its answer."""

    @abstractmethod
    def hidden(self, rnd: Round, asked: list[int], eos: int) -> Answer:
        """Carry the hidden states the cloud asked for; its verdict."""

    def observe(self, rnd: Round, verdict: Verdict) -> None:  # noqa: B027 - optional hook
        """Told every concluded round (the in-process cloud hands trace collection its view)."""

    def round(self, link: Link, session_id: int, seq: int, committed: list[int], block: Block, eos: int,
              bits: int) -> Verdict | None:
        """One blocking round; None when the cloud could not be reached (the loop keeps the block)."""
        return self.exchange(link, session_id, seq, committed, block, eos, bits)

    def exchange(self, link: Link, session_id: int, seq: int, committed: list[int], block: Block, eos: int,
                 bits: int) -> Verdict:
        """The edge's side of a round, the same for every transport."""
        rule, books = self.rule, self.books
        session_id, seq = self.opened(link, session_id, seq)
        protocol = csi = None
        if rule.needs_hidden:
            d = next((h.shape[-1] for h in block.hidden if h is not None), 0)
            protocol = self.rate.protocol(rule.protocol, link, len(block), d, bits)
            csi = csi_of(link)
        rnd = Round(session_id, seq, committed[self.cloud_holds:], committed, block, bits, protocol, csi)
        self.post(link, "up", "verify", rnd.packet(rule, self.q_dtype))
        answer = self.verify(rnd, eos)
        # (an in-process verdict names the states it read whatever the protocol; only selective asks)
        asked = answer.asked if protocol == "selective" or answer.verdict is None else []
        if asked:  # the cloud asks for the states at its mismatches
            self.post(link, "down", "mismatch", packets.mismatch_packet(session_id, seq, asked))
            self.post(link, "up", "hidden", rnd.hidden_packet(asked))
            answer = self.hidden(rnd, asked, eos)
            books.hidden_request()
        verdict = answer.verdict
        books.synced(len(rnd.sync))
        books.tolerated(verdict.tolerated)  # WISV's head, or an oracle over its allowance
        if rule.needs_hidden:
            self.rate.learn(len(block), verdict.accepted, asked)
        self.observe(rnd, verdict)
        self.post(link, "down", "verdict", answer.packet)
        self.cloud_holds = len(committed) + verdict.accepted
        return verdict


def hidden_upload(session_id: int, seq: int, block: Block, positions) -> bytes:
    """A HIDDEN packet with the edge's states at `positions` (an end-of-caption token has none)."""
    pos = [i for i in positions if block.hidden[i] is not None]
    h = torch.stack([block.hidden[i] for i in pos]).numpy() if pos else np.zeros((0, 0), np.float16)
    return packets.hidden_packet(session_id, seq, pos, h)


def round_payload(rule: Rule, session_id: int, seq: int, block: Block, protocol: str | None = None, csi=None,
                  q_dtype: str = "float16") -> bytes:
    """What rides after a round's header, the same in every loop and over every transport: the
    draft distributions the rule reads (Q-S: its lattice; speculative sampling: dense rows in
    `q_dtype`), and for WISV the channel state and, with the full protocol, every drafted token's
    hidden state (the selective protocol sends those the cloud asks for later, `hidden_upload`)."""
    out = b""
    if rule.needs_q:
        out += rule.q_payload(block.q) if rule.edge_distribution is not None else packets.q_payload(block.q, q_dtype)
    if rule.needs_hidden:
        out += packets.csi_payload(csi.uplink_mbps, csi.downlink_mbps, csi.rtt_ms, csi.per)
        if protocol == "full":
            out += hidden_upload(session_id, seq, block, range(len(block)))
    return out


class MismatchedRound(ValueError):
    """A well-formed round that does not fit the cloud: draft distributions over another
    vocabulary, hidden states of another round or of positions outside the draft."""


def read_payload(rule: Rule, tail: bytes, session_id: int, seq: int, n_draft: int, vocab: int,
                 q_dtype: str = "float16"):
    """What `round_payload` put after a VERIFY's token ids, as the rule reads it: (draft
    distributions, channel state, edge hidden states), each None where the rule takes none.
    Raises packets.PacketError for bytes that do not parse, MismatchedRound for bytes that parse
    but belong to another vocabulary or round."""
    if rule.needs_hidden:  # WISV: the channel state, then the full protocol's states (or none)
        try:
            values, rest = packets.parse_csi(tail)
            csi = CSI(*values)
        except (packets.PacketError, ValueError) as exc:
            raise packets.PacketError(f"bad channel state in a wisv VERIFY: {exc}") from None
        if not rest:
            return None, csi, None
        try:
            h_sid, h_seq, positions, states = packets.parse_hidden(rest)
        except packets.PacketError as exc:
            raise packets.PacketError(f"malformed HIDDEN packet after the channel state: {exc}") from None
        if (h_sid, h_seq) != (session_id, seq) or any(not 0 <= i < n_draft for i in positions):
            raise MismatchedRound(f"HIDDEN packet for session {h_sid} round {h_seq} positions {positions} does "
                                  f"not belong to this VERIFY (session {session_id} round {seq}, {n_draft} tokens)")
        return None, csi, states_by_position(positions, states, n_draft)
    if rule.needs_q:
        try:
            if rule.edge_distribution is not None:  # qs / sq: the sparse lattice points
                rule.level, q = unpack_block(tail, n_draft, vocab)
            else:
                q = [torch.from_numpy(r).float() for r in packets.parse_q(tail, n_draft, vocab, q_dtype)]
        except packets.PacketError as exc:
            raise MismatchedRound(f"{exc} (is the edge's vocabulary the cloud's?)") from None
        return q, None, None
    if tail:
        raise packets.PacketError(f"{len(tail)} unexpected bytes after the token ids")
    return None, None, None


def states_by_position(positions: list[int], states, n_draft: int) -> list:
    """A HIDDEN packet's states as the rule takes them: one per draft position, None where not sent."""
    hidden = [None] * n_draft
    for i, h in zip(positions, states):
        hidden[i] = torch.from_numpy(np.asarray(h, dtype=np.float32))
    return hidden
