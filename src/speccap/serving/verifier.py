"""The verifier's request handling: one loaded cloud model, its sessions and its counters, and
what each endpoint does (speccap.serving.server wires them into the FastAPI app)."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import asdict

import anyio
from fastapi import Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from ..batching.gather import Gather
from ..decoding import packets
from ..decoding.cloud import CloudSession
from ..decoding.cost import timed
from ..decoding.round import MismatchedRound, read_payload, states_by_position
from ..decoding.rules import make_rule
from ..decoding.wisv.rule import WISV
from ..models.base import AudioLM
from .sessions import Limits, ServingError, SessionStore

log = logging.getLogger("speccap.serving")


def _expected_mels(lm: AudioLM) -> int | None:
    config = getattr(getattr(lm, "model", None), "config", None)
    audio = getattr(config, "audio_config", None)
    return getattr(audio, "num_mel_bins", None)


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to pass `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ServingError(400, f"bad Content-Length {declared!r}")
        if int(declared) > limit:
            raise ServingError(413, f"payload of {declared} bytes is over the limit of {limit}")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise ServingError(413, f"payload is over the limit of {limit} bytes")
    except ClientDisconnect:
        raise ServingError(400, "the client went away mid-request") from None
    return bytes(body)


class Verifier:
    """The state one server holds (the model, the bearer tokens, the sessions, a compute limiter
    and the counters) and its endpoints as methods. `compute_slots`: model calls run at once (each
    in a worker thread; 1 serializes them, which is what one CPU model wants). `batch` > 1: the
    model calls of up to `batch` concurrent requests, gathered over `batch_window_ms`, run as one
    forward (batching.gather; a model whose sessions cannot share a step runs them `batch` at a
    time). `wisv_head`: the WISV decision head sessions with the wisv rule judge with."""

    def __init__(self, lm: AudioLM, tokens: dict[str, str], limits: Limits, compute_slots: int = 1,
                 wisv_head=None, batch: int = 1, batch_window_ms: float = 2.0):
        if not tokens:
            raise ValueError("the verifier server needs at least one bearer token")
        self.gather = Gather(batch, batch_window_ms / 1000) if batch > 1 else None
        if self.gather is not None:
            lm = self.gather.wrap(lm)
        self.lm, self.tokens, self.limits, self.wisv_head = lm, tokens, limits, wisv_head
        self.store = SessionStore(limits)
        self.limiter = anyio.CapacityLimiter(compute_slots)
        self.n_mels = _expected_mels(lm)
        self.eos, self.vocab = lm.eos_token_id, lm.vocab_size
        self.stats = {"verified_rounds": 0, "verified_tokens": 0, "refused": 0, "failed": 0}
        # seconds in the model's prefills and verification forwards, when each runs alone (batched:
        # the row pools count their shared forwards)
        self.model_seconds = {"prefill": 0.0, "forward": 0.0}

    def client_of(self, request: Request) -> str:
        """The client the bearer token names; compared in constant time against every token."""
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise ServingError(401, "missing bearer token (Authorization: Bearer <token>)")
        found = None
        for token, client in self.tokens.items():
            if hmac.compare_digest(token.encode(), given.strip().encode()):
                found = client
        if found is None:
            raise ServingError(401, "wrong bearer token")
        return found

    async def in_thread(self, fn, *args):
        """fn(*args) off the event loop: on the gather's thread when batching (no thread per request
        waits there), else in a worker thread within the compute slots."""
        if self.gather is not None:
            return await asyncio.wrap_future(self.gather.submit(fn, *args))
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    async def info(self, request: Request):
        self.client_of(request)
        return {"wire_version": packets.VERSION, "model": getattr(self.lm, "name", type(self.lm).__name__),
                "vocab_size": self.vocab, "eos_token_id": self.eos, "n_mels": self.n_mels, "uplink": self.lm.uplink.to_dict(),
                "limits": asdict(self.limits)}

    async def health(self, request: Request):
        self.client_of(request)
        batching, spent = {}, self.model_seconds
        if self.gather is not None:
            batching = {"gathered_calls": self.gather.calls, "gathered_forwards": self.gather.forwards}
            spent = {"prefill": sum(p.seconds["prefill"] for p in self.gather.pools),
                     "forward": sum(p.seconds["run"] for p in self.gather.pools)}
        return {"status": "ok", "sessions": len(self.store), "opened_total": self.store.opened_total,
                "expired_total": self.store.expired_total, **self.stats, "model_seconds": spent, **batching}

    async def open_session(self, request: Request):
        client = self.client_of(request)
        body = await _read_body(request, self.limits.max_payload_bytes)
        try:
            req = packets.parse_open(body)
        except packets.PacketError as exc:
            raise ServingError(400, f"malformed OPEN packet: {exc}") from None
        if self.n_mels is not None and req.features.shape[0] != self.n_mels:
            raise ServingError(422, f"features have {req.features.shape[0]} mel bands, the model takes {self.n_mels}")
        sent_through = request.headers.get(packets.UPLINK_HEADER, "")
        if self.lm.uplink.learned and sent_through != self.lm.uplink.digest:
            raise ServingError(422, f"features sent through uplink encoder {sent_through or '(none named)'}, the model "
                                    f"reads learned uplink encoder {self.lm.uplink.digest}")
        reads = self.lm.uplink.bits
        if (reads < 16 or req.features_bits < 16) and req.features_bits != reads:
            raise ServingError(422, f"features sent at {req.features_bits} bits a value, the model reads a "
                                    f"{reads}-bit uplink (uplink.bits)")
        if req.features.shape[1] < 1:
            raise ServingError(422, "features hold no frames")
        if req.rule == "wisv":
            if self.wisv_head is None:
                raise ServingError(422, "this server holds no WISV head (start it with --wisv-head)")
            # the OPEN packet's temperature field is WISV's tau, its rank field the rank cap (1: none)
            rule = WISV(self.wisv_head, req.temperature, max_rank=req.rank if req.rank > 1 else 0)
        else:
            rule = make_rule(req.rule, req.rank, req.temperature)
        cloud = CloudSession(self.lm, req.features.astype("float32"), req.language, rule, req.seed)
        session = self.store.open(client, cloud)
        session.q_dtype = req.q_dtype
        try:
            spent, _ = await self.in_thread(cloud.prefill)
            self.model_seconds["prefill"] += spent
        except Exception as exc:  # the model refused these features: this session only
            self.store.drop(session.id)
            log.exception("prefill failed for session %d", session.id)
            raise ServingError(422, f"the model could not encode these features: {exc}") from None
        return {"session": session.id, "idle_seconds": self.limits.idle_seconds, "wire_version": packets.VERSION}

    async def verify(self, sid: int, request: Request):
        client = self.client_of(request)
        body = await _read_body(request, self.limits.max_payload_bytes)
        session = self.store.get(client, sid)
        try:
            kind, _, _ = packets.parse_header(body)
            if kind != packets.VERIFY:
                raise packets.PacketError(f"expected a VERIFY packet, got kind {kind}")
            packet_sid, seq, sync, draft = packets.parse_verify(body)
            tail = packets.verify_tail(body)
        except packets.PacketError as exc:
            raise ServingError(400, f"malformed VERIFY packet: {exc}") from None
        if not session.lock.acquire(blocking=False):
            raise ServingError(409, f"session {sid} is verifying another packet; send one block at a time")
        try:
            self.store.check_verify(session, packet_sid, seq, len(sync), len(draft))
            bad = [t for t in sync + draft if t >= self.vocab]
            if bad:
                raise ServingError(422, f"token id {bad[0]} is outside the model's vocabulary of {self.vocab}")
            if session.pending is not None:
                raise ServingError(409, f"session {sid} waits for the HIDDEN packet of round {session.pending[0]}")
            rule = session.cloud.rule
            try:
                q, csi, hidden = read_payload(rule, tail, sid, seq, len(draft), self.vocab, session.q_dtype)
            except MismatchedRound as exc:
                raise ServingError(422, str(exc)) from None
            except packets.PacketError as exc:
                raise ServingError(400, str(exc)) from None
            t0 = time.perf_counter()
            queued = {}

            def run():
                queued["s"] = time.perf_counter() - t0
                if rule.needs_hidden and hidden is None:  # selective: the forward, then ask unless nothing to ask
                    rows, spent, _ = session.cloud.forward(sync, [], draft)
                    asked = rule.questions(draft, rows, self.eos)
                    if asked:
                        session.pending = (seq, list(draft), csi, asked)
                        return None, spent, asked
                    return self._judge(session, draft, [None] * len(draft), csi), spent, None
                verdict, spent, _ = session.cloud.verify(sync, [], draft, q, self.eos, edge_hidden=hidden, csi=csi)
                return verdict, spent, None
            try:
                verdict, compute, asked = await self.in_thread(run)
            except Exception as exc:  # noqa: BLE001 - one session's failure must not take the server down
                raise self._session_failed(sid, exc) from None
            self.model_seconds["forward"] += compute
            session.last_seq = seq
            session.last_used = self.store.clock()
            if asked is not None:  # the round goes on when the states come (POST .../hidden)
                return Response(packets.mismatch_packet(sid, seq, asked), media_type="application/octet-stream",
                                headers={"X-Speccap-Compute": f"{compute:.6f}",
                                         "X-Speccap-Queue": f"{queued['s']:.6f}"})
            self._count_round(session, len(draft))
        finally:
            session.lock.release()
        out = packets.verdict_packet(sid, seq, verdict.accepted, verdict.token, packets.id_bits(self.vocab))
        return Response(out, media_type="application/octet-stream",
                        headers={"X-Speccap-Compute": f"{compute:.6f}", "X-Speccap-Queue": f"{queued['s']:.6f}"})

    async def hidden_states(self, sid: int, request: Request):
        """WISV's selective protocol, second half: the edge's states at the positions the MISMATCH
        named; the round concludes and the VERDICT comes back."""
        client = self.client_of(request)
        body = await _read_body(request, self.limits.max_payload_bytes)
        session = self.store.get(client, sid)
        try:
            packet_sid, seq, positions, states = packets.parse_hidden(body)
        except packets.PacketError as exc:
            raise ServingError(400, f"malformed HIDDEN packet: {exc}") from None
        if not session.lock.acquire(blocking=False):
            raise ServingError(409, f"session {sid} is verifying another packet; send one block at a time")
        try:
            pending = session.pending
            if pending is None or packet_sid != sid or seq != pending[0]:
                raise ServingError(409, f"session {sid} asked for no hidden states of round {seq}")
            _, draft, csi, asked = pending
            if sorted(positions) != sorted(asked):
                raise ServingError(422, f"HIDDEN packet holds positions {positions}, the cloud asked for {asked}")
            edge_hidden = states_by_position(positions, states, len(draft))
            t0 = time.perf_counter()
            try:
                verdict, dt = await self.in_thread(lambda: timed(self._judge, session, draft, edge_hidden, csi))
            except Exception as exc:  # noqa: BLE001 - as in verify
                raise self._session_failed(sid, exc) from None
            session.pending = None
            session.last_used = self.store.clock()
            self._count_round(session, len(draft))
        finally:
            session.lock.release()
        out = packets.verdict_packet(sid, seq, verdict.accepted, verdict.token, packets.id_bits(self.vocab))
        return Response(out, media_type="application/octet-stream",
                        headers={"X-Speccap-Compute": f"{dt:.6f}",
                                 "X-Speccap-Queue": f"{max(time.perf_counter() - t0 - dt, 0.0):.6f}"})

    def _session_failed(self, sid: int, exc: Exception) -> ServingError:
        """A failed model call closes its session (never the server); the client is told to reopen."""
        self.store.drop(sid)
        self.stats["failed"] += 1
        log.exception("verification failed in session %d; session closed", sid)
        return ServingError(500, f"verification failed ({type(exc).__name__}); session {sid} closed, open a new one")

    def _count_round(self, session, n_draft: int) -> None:
        session.rounds += 1
        session.verified_tokens += n_draft
        self.stats["verified_rounds"] += 1
        self.stats["verified_tokens"] += n_draft

    def _judge(self, session, draft: list[int], edge_hidden: list, csi):
        """WISV's verdict on the round's forward, the states it asked for in hand (CloudSession.judge)."""
        return session.cloud.judge(draft, None, self.eos, edge_hidden, csi)

    async def close_session(self, sid: int, request: Request):
        client = self.client_of(request)
        self.store.close(client, sid)
        return Response(status_code=204)
