"""The edge over a real network: the blocking speculative loop with the cloud half behind a socket.

`caption_remote` runs `engine.blocking_loop` (the same loop as in-process) with `RemoteCloud`,
which sends the real packets to `speccap serve-cloud` and books, per caption, what it measured
(round-trip seconds, the server's compute and queue seconds, HTTP bytes) next to what the link
model predicts for the same packets. When the cloud is unreachable, slow or failing, the block is
committed as drafted (edge-only for that block) and counted in `network["fallback"]`; after
`breaker` failures in a row the rest of the caption stays on the edge, so a caption is always
produced. Only features (as the served cloud's uplink has them: its /v1/info says which) and token
ids (and q rows for spec_sampling) leave the device.
"""

from __future__ import annotations

import time

import numpy as np

from ..data.uplink import Uplink
from ..decoding import packets
from ..decoding.engine import blocking_loop
from ..decoding.halves import SpecSettings
from ..decoding.ledger import CaptionRecord, Ledger
from ..decoding.link import Link
from ..decoding.round import Answer, Round, Transport
from ..decoding.stats import Block
from ..decoding.verify import Verdict
from ..models.base import AudioLM
from .client import CloudRefused, CloudUnavailable, VerifierClient


class RemoteCloud(Transport):
    """The cloud half of `blocking_loop` over HTTP: the same rounds as in-process (`Transport`),
    their packets posted to the server. `emulate`: sleep the link model's seconds for every packet
    (client-side channel emulation on top of the real socket)."""

    def __init__(self, client: VerifierClient, features: np.ndarray, language: str, s: SpecSettings, books: Ledger,
                 features_dtype: str = "float16", q_dtype: str = "float16", emulate: bool = False, breaker: int = 2,
                 uplink: str = ""):
        super().__init__(s.rule, books)
        self.client, self.features, self.language, self.s = client, features, language, s
        self.uplink = uplink  # the learned encoder's digest the features went through ("" for a hand-made view)
        self.features_dtype, self.q_dtype, self.emulate, self.breaker = features_dtype, q_dtype, emulate, breaker
        self.sid: int | None = None
        self.seq = 0  # seq of the last VERIFY on the current session
        self.failures = 0  # in a row
        self.down = False
        self.sess = None  # no local model session (keep_sessions)

    # ---- the transport ----
    def post(self, link: Link, direction: str, kind: str, packet: bytes) -> None:
        """Book one packet on the link model (the prediction next to the measurement); with
        `emulate`, also wait that long, as if the link were that slow."""
        predicted = self.books.predicted(link, direction, kind, packet, self.emulate)
        if self.emulate:
            time.sleep(predicted)

    def opened(self, link: Link, session_id: int, seq: int) -> tuple[int, int]:
        if self.sid is None:
            rule = self.s.rule
            # WISV: the server holds the head; its tau travels in the temperature field, its rank cap in rank
            temperature = rule.tau if rule.needs_hidden else getattr(rule, "temperature", 1.0)
            packet = packets.open_packet(self.features, self.language, rule.name, getattr(rule, "r", 1),
                                         temperature, self.s.seed, self.q_dtype, self.features_dtype)
            self.post(link, "up", "features", packet)
            self.sid, ex = self.client.open(packet, self.uplink)
            self.books.exchange(ex)
            self.seq, self.cloud_holds = 0, 0
        return self.sid, self.seq + 1

    def verify(self, rnd: Round, eos: int) -> Answer:
        ex = self.client.verify(self.sid, rnd.packet(self.rule, self.q_dtype))
        self.books.exchange(ex, verify=True)
        self.seq = rnd.seq
        if self.rule.needs_hidden:
            try:
                kind, _, _ = packets.parse_header(ex.body)
            except packets.PacketError as exc:
                raise CloudUnavailable(f"unreadable answer: {exc}") from None
            if kind == packets.MISMATCH:
                try:
                    sid, seq, asked = packets.parse_mismatch(ex.body)
                except packets.PacketError as exc:
                    raise CloudUnavailable(f"unreadable MISMATCH: {exc}") from None
                if sid != self.sid or seq != self.seq or any(not 0 <= i < len(rnd.block) for i in asked):
                    raise CloudUnavailable(f"MISMATCH for session {sid} seq {seq} positions {asked} does not "
                                           f"answer session {self.sid} seq {self.seq}")
                return Answer(None, ex.body, asked)
        return self._verdict(ex.body, rnd)

    def hidden(self, rnd: Round, asked: list[int], eos: int) -> Answer:
        answer = self.client.hidden(self.sid, rnd.hidden_packet(asked))
        self.books.exchange(answer)
        return self._verdict(answer.body, rnd)

    def _verdict(self, body: bytes, rnd: Round) -> Answer:
        try:
            sid, seq, accepted, token = packets.parse_verdict(body)
        except packets.PacketError as exc:
            raise CloudUnavailable(f"unreadable verdict: {exc}") from None
        if sid != self.sid or seq != self.seq or accepted > len(rnd.block):
            raise CloudUnavailable(f"verdict for session {sid} seq {seq} ({accepted} accepted) does not answer "
                                   f"session {self.sid} seq {self.seq}")
        return Answer(Verdict(accepted, token, accepted < len(rnd.block)), body)  # the ranks stay with the cloud

    # ---- the loop's hook: a failing cloud leaves the block on the edge ----
    def round(self, link: Link, session_id: int, seq: int, committed: list[int], block: Block, eos: int,
              bits: int) -> Verdict | None:
        if self.down:
            return self._fallback("cloud marked unreachable for the rest of this caption")
        reopened = False
        while True:
            try:
                verdict = self.exchange(link, session_id, seq, committed, block, eos, bits)
                self.failures = 0
                return verdict
            except CloudRefused as exc:
                if exc.status == 401:
                    raise  # a wrong token is the user's to fix, not something to degrade around
                if exc.status == 404 and not reopened:  # expired, or the server restarted: start over once
                    self.sid, reopened = None, True
                    self.books.reopened()
                    continue
                return self._fail(str(exc))
            except CloudUnavailable as exc:
                return self._fail(str(exc))

    def _fail(self, reason: str) -> None:
        """The block stays on the edge; the session is given up (its cache may hold the block)."""
        if self.sid is not None:
            self.client.end(self.sid)
        self.sid = None
        self.failures += 1
        if self.failures >= self.breaker:
            self.down = True
        return self._fallback(reason)

    def _fallback(self, reason: str) -> None:
        self.books.fallback(reason)
        return None

    def finish(self) -> None:
        if self.sid is not None:
            self.client.end(self.sid)
            self.sid = None


def check_compatible(edge: AudioLM, info: dict) -> None:
    """The edge and the served cloud must share the tokenizer's ids; a clear error when not."""
    if info.get("wire_version") != packets.VERSION:
        raise ValueError(f"the server speaks wire format {info.get('wire_version')}, this edge {packets.VERSION}")
    if info["eos_token_id"] != edge.eos_token_id:
        raise ValueError(f"the served cloud model's end token is {info['eos_token_id']}, the edge's "
                         f"{edge.eos_token_id}: they do not share a tokenizer")
    served_uplink(edge, info)  # a learned uplink: the edge must ship the encoder the cloud was trained with


def served_uplink(edge: AudioLM, info: dict):
    """What the edge sends the served cloud (its /v1/info says what it reads; older servers: the
    log-mel): a hand-made view computed here, or the learned encoder shipped with the edge model,
    which must be the one the cloud was trained with."""
    served = info.get("uplink", {})
    if "learned" not in served:
        return Uplink(**served)
    if edge.sends.digest != served.get("digest"):
        shipped = f"encoder {edge.sends.digest}" if edge.sends.learned else "no learned encoder"
        raise ValueError(f"the served cloud reads learned uplink encoder {served.get('digest')}, this edge ships "
                         f"{shipped} (models/edge/uplink/): deploy the edge and cloud of one `train` run")
    return edge.sends


def caption_remote(edge: AudioLM, client: VerifierClient, info: dict, features: np.ndarray, language: str,
                   settings: SpecSettings, link: Link, features_dtype: str = "float16", q_dtype: str = "float16",
                   emulate: bool = False, breaker: int = 2) -> CaptionRecord:
    """One caption with the cloud behind `client` (`info`: the server's /v1/info). The blocking loop
    only: pipelined verification (in_flight > 0) is not available over the network yet."""
    if settings.in_flight:
        raise ValueError("the networked edge runs the blocking loop only: set in_flight to 0")
    bits = packets.id_bits(min(edge.vocab_size, info["vocab_size"]))
    uplink = served_uplink(edge, info)
    features_dtype = uplink.wire_dtype if uplink.bits < 16 else features_dtype  # a quantised uplink's codes
    holder: list[RemoteCloud] = []

    def make(books):
        holder.append(RemoteCloud(client, books.sent(uplink, features), language, settings, books, features_dtype,
                                  q_dtype, emulate, breaker, uplink.digest))
        return holder[0]
    try:
        return blocking_loop(edge, make, features, language, settings, link, 1, bits, method="networked",
                             networked=True)
    finally:
        if holder:
            holder[0].finish()
