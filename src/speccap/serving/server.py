"""The verifier server: the cloud model behind HTTP (FastAPI on uvicorn), one KV cache per caption.

Endpoints (all need `Authorization: Bearer <token>`; bodies are the binary packets of
speccap.decoding.packets, wire format version 1; errors are JSON `{"error": "..."}`):

  GET    /v1/info                    model, vocabulary, EOS id, wire version, limits (JSON)
  GET    /v1/health                  {"status": "ok", "sessions": n, ...}
  POST   /v1/sessions                body: OPEN packet -> 201 {"session": id, "idle_seconds": s}
  POST   /v1/sessions/{id}/verify    body: VERIFY packet (+ q rows) -> 200 VERDICT packet;
                                     headers X-Speccap-Compute / X-Speccap-Queue: seconds
  DELETE /v1/sessions/{id}           204; frees the KV cache

Status codes: 400 malformed packet, 401 no or wrong token, 404 unknown session (or another
client's), 409 replayed / out-of-order / concurrent packet, 413 payload over the limit, 422 valid
packet the server will not run (block too long, token id out of range, wrong vocabulary), 429 too
many open sessions for this client, 500 the model failed (that session is closed, the others go on),
503 the server is full.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import socket
import threading
import time
from dataclasses import asdict
from pathlib import Path

import anyio
import numpy as np
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from ..decoding import packets
from ..decoding.cloud import CloudSession, timed
from ..decoding.decision_head import CSI
from ..decoding.qs import unpack_block
from ..decoding.rules import make_rule
from ..decoding.wisv import WISV
from ..models.base import AudioLM
from .sessions import Limits, ServingError, SessionStore

log = logging.getLogger("speccap.serving")
TOKEN_ENV = "SPECCAP_TOKEN"
MIN_TOKEN_CHARS = 16


def load_tokens(token_file: str | os.PathLike | None = None, env: str = TOKEN_ENV) -> dict[str, str]:
    """token -> client name. A token file holds one token per line, or `client:token` to name
    the client (per-client session limits); `#` starts a comment. Without a file, $SPECCAP_TOKEN
    is the one token (client "default"). Never returns an empty map: a server needs a token."""
    tokens: dict[str, str] = {}
    if token_file is not None:
        path = Path(token_file)
        if not path.is_file():
            raise FileNotFoundError(f"token file {path} not found")
        for n, line in enumerate(path.read_text().splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            client, _, token = line.rpartition(":")
            _check_token(token, f"{path}:{n}")
            tokens[token] = client or f"client{len(tokens) + 1}"
        if not tokens:
            raise ValueError(f"token file {path} holds no token")
    else:
        token = os.environ.get(env, "").strip()
        if not token:
            raise ValueError(f"no bearer token: set ${env} or pass --token-file (the server refuses to run open)")
        _check_token(token, f"${env}")
        tokens[token] = "default"
    return tokens


def client_token(token_file: str | os.PathLike | None = None, env: str = TOKEN_ENV) -> str:
    """The edge's token: the first in the file, else $SPECCAP_TOKEN."""
    return next(iter(load_tokens(token_file, env)))


def _check_token(token: str, where: str) -> None:
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"{where}: a bearer token needs at least {MIN_TOKEN_CHARS} characters "
                         f"(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")


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


def create_app(lm: AudioLM, tokens: dict[str, str], limits: Limits = Limits(), compute_slots: int = 1,
               reap_every: float | None = None, wisv_head=None) -> FastAPI:
    """The verifier app around one loaded cloud model. `compute_slots`: model calls run at once
    (each in a worker thread; 1 serializes them, which is what one CPU model wants). `wisv_head`:
    the WISV decision head (gating.wisv.DecisionHead) sessions with the wisv rule judge with."""
    if not tokens:
        raise ValueError("the verifier server needs at least one bearer token")
    store = SessionStore(limits)
    limiter = anyio.CapacityLimiter(compute_slots)
    n_mels = _expected_mels(lm)
    eos = lm.eos_token_id
    vocab = lm.vocab_size
    stats = {"verified_rounds": 0, "verified_tokens": 0, "refused": 0, "failed": 0}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        async def reaper():
            while True:
                await asyncio.sleep(reap_every or max(min(limits.idle_seconds / 4, 5.0), 0.05))
                for sid in store.expire():
                    log.info("session %d expired after %.0f s idle", sid, limits.idle_seconds)
        task = asyncio.create_task(reaper())
        try:
            yield
        finally:
            task.cancel()

    app = FastAPI(title="speccap verifier", version=str(packets.VERSION), lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.state.store = store
    app.state.stats = stats

    @app.exception_handler(ServingError)
    async def refused(request: Request, exc: ServingError):
        stats["refused"] += 1
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse({"error": exc.message}, status_code=exc.status, headers=headers)

    def client_of(request: Request) -> str:
        """The client the bearer token names; compared in constant time against every token."""
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise ServingError(401, "missing bearer token (Authorization: Bearer <token>)")
        found = None
        for token, client in tokens.items():
            if hmac.compare_digest(token.encode(), given.strip().encode()):
                found = client
        if found is None:
            raise ServingError(401, "wrong bearer token")
        return found

    async def in_thread(fn, *args):
        return await anyio.to_thread.run_sync(fn, *args, limiter=limiter)

    @app.get("/v1/info")
    async def info(request: Request):
        client_of(request)
        return {"wire_version": packets.VERSION, "model": getattr(lm, "name", type(lm).__name__),
                "vocab_size": vocab, "eos_token_id": eos, "n_mels": n_mels, "limits": asdict(limits)}

    @app.get("/v1/health")
    async def health(request: Request):
        client_of(request)
        return {"status": "ok", "sessions": len(store), "opened_total": store.opened_total,
                "expired_total": store.expired_total, **stats}

    @app.post("/v1/sessions", status_code=201)
    async def open_session(request: Request):
        client = client_of(request)
        body = await _read_body(request, limits.max_payload_bytes)
        try:
            req = packets.parse_open(body)
        except packets.PacketError as exc:
            raise ServingError(400, f"malformed OPEN packet: {exc}") from None
        if n_mels is not None and req.features.shape[0] != n_mels:
            raise ServingError(422, f"features have {req.features.shape[0]} mel bands, the model takes {n_mels}")
        if req.features.shape[1] < 1:
            raise ServingError(422, "features hold no frames")
        if req.rule == "wisv":
            if wisv_head is None:
                raise ServingError(422, "this server holds no WISV head (start it with --wisv-head)")
            # the OPEN packet's temperature field is WISV's tau, its rank field the rank cap (1: none)
            rule = WISV(wisv_head, req.temperature, max_rank=req.rank if req.rank > 1 else 0)
        else:
            rule = make_rule(req.rule, req.rank, req.temperature)
        cloud = CloudSession(lm, req.features.astype("float32"), req.language, rule, req.seed)
        session = store.open(client, cloud)
        session.q_dtype = req.q_dtype
        try:
            await in_thread(cloud.prefill)
        except Exception as exc:  # the model refused these features: this session only
            store.drop(session.id)
            log.exception("prefill failed for session %d", session.id)
            raise ServingError(422, f"the model could not encode these features: {exc}") from None
        return {"session": session.id, "idle_seconds": limits.idle_seconds, "wire_version": packets.VERSION}

    @app.post("/v1/sessions/{sid}/verify")
    async def verify(sid: int, request: Request):
        client = client_of(request)
        body = await _read_body(request, limits.max_payload_bytes)
        session = store.get(client, sid)
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
            store.check_verify(session, packet_sid, seq, len(sync), len(draft))
            bad = [t for t in sync + draft if t >= vocab]
            if bad:
                raise ServingError(422, f"token id {bad[0]} is outside the model's vocabulary of {vocab}")
            if session.pending is not None:
                raise ServingError(409, f"session {sid} waits for the HIDDEN packet of round {session.pending[0]}")
            q, csi, hidden = None, None, None
            rule = session.cloud.rule
            if rule.needs_hidden:  # wisv: the channel state, then the full protocol's states (or none)
                csi, hidden = _wisv_tail(tail, sid, seq, len(draft))
            elif rule.needs_q:
                try:
                    if rule.edge_distribution is not None:  # qs / sq: the sparse lattice points
                        rule.level, q = unpack_block(tail, len(draft), vocab)
                    else:
                        q = [torch.from_numpy(r).float() for r in packets.parse_q(tail, len(draft), vocab,
                                                                                   session.q_dtype)]
                except packets.PacketError as exc:
                    raise ServingError(422, f"{exc} (is the edge's vocabulary the cloud's?)") from None
            elif tail:
                raise ServingError(400, f"{len(tail)} unexpected bytes after the token ids")
            t0 = time.perf_counter()
            queued = {}

            def run():
                queued["s"] = time.perf_counter() - t0
                if rule.needs_hidden and hidden is None:  # selective: the forward, then ask unless nothing to ask
                    rows, spent, _ = session.cloud.forward(sync, [], draft)
                    asked = rule.questions(draft, rows, eos)
                    if asked:
                        session.pending = (seq, list(draft), csi, asked)
                        return None, spent, asked
                    return _judge(session, draft, [None] * len(draft), csi), spent, None
                verdict, spent, _ = session.cloud.verify(sync, [], draft, q, eos, edge_hidden=hidden, csi=csi)
                return verdict, spent, None
            try:
                verdict, compute, asked = await in_thread(run)
            except Exception as exc:  # noqa: BLE001 - one session's failure must not take the server down
                raise _session_failed(sid, exc) from None
            session.last_seq = seq
            session.last_used = store.clock()
            if asked is not None:  # the round goes on when the states come (POST .../hidden)
                return Response(packets.mismatch_packet(sid, seq, asked), media_type="application/octet-stream",
                                headers={"X-Speccap-Compute": f"{compute:.6f}",
                                         "X-Speccap-Queue": f"{queued['s']:.6f}"})
            _count_round(session, len(draft))
        finally:
            session.lock.release()
        out = packets.verdict_packet(sid, seq, verdict.accepted, verdict.token, packets.id_bits(vocab))
        return Response(out, media_type="application/octet-stream",
                        headers={"X-Speccap-Compute": f"{compute:.6f}", "X-Speccap-Queue": f"{queued['s']:.6f}"})

    @app.post("/v1/sessions/{sid}/hidden")
    async def hidden_states(sid: int, request: Request):
        """WISV's selective protocol, second half: the edge's states at the positions the MISMATCH
        named; the round concludes and the VERDICT comes back."""
        client = client_of(request)
        body = await _read_body(request, limits.max_payload_bytes)
        session = store.get(client, sid)
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
            edge_hidden = _states(positions, states, len(draft))
            t0 = time.perf_counter()
            try:
                verdict, dt = await in_thread(lambda: timed(_judge, session, draft, edge_hidden, csi))
            except Exception as exc:  # noqa: BLE001 - as in verify
                raise _session_failed(sid, exc) from None
            session.pending = None
            session.last_used = store.clock()
            _count_round(session, len(draft))
        finally:
            session.lock.release()
        out = packets.verdict_packet(sid, seq, verdict.accepted, verdict.token, packets.id_bits(vocab))
        return Response(out, media_type="application/octet-stream",
                        headers={"X-Speccap-Compute": f"{dt:.6f}",
                                 "X-Speccap-Queue": f"{max(time.perf_counter() - t0 - dt, 0.0):.6f}"})

    def _session_failed(sid: int, exc: Exception) -> ServingError:
        """A failed model call closes its session (never the server); the client is told to reopen."""
        store.drop(sid)
        stats["failed"] += 1
        log.exception("verification failed in session %d; session closed", sid)
        return ServingError(500, f"verification failed ({type(exc).__name__}); session {sid} closed, open a new one")

    def _states(positions: list[int], states, n_draft: int) -> list:
        """A HIDDEN packet's states as the rule takes them: one per draft position, None where not sent."""
        hidden = [None] * n_draft
        for i, h in zip(positions, states):
            hidden[i] = torch.from_numpy(np.asarray(h, dtype=np.float32))
        return hidden

    def _count_round(session, n_draft: int) -> None:
        session.rounds += 1
        session.verified_tokens += n_draft
        stats["verified_rounds"] += 1
        stats["verified_tokens"] += n_draft

    def _judge(session, draft: list[int], edge_hidden: list, csi):
        """WISV's verdict on the round's forward (rows and cloud states kept by the session), then
        the cache cropped past the rejected tokens."""
        verdict = session.cloud.rule.verify_hidden(list(draft), session.cloud.rows, edge_hidden,
                                                   session.cloud.hidden, csi, eos)
        session.cloud.conclude(draft, verdict)
        return verdict

    def _wisv_tail(tail: bytes, sid: int, seq: int, n_draft: int):
        """The channel state and, with the full protocol, every draft token's hidden state."""
        try:
            values, rest = packets.parse_csi(tail)
            csi = CSI(*values)
        except (packets.PacketError, ValueError) as exc:
            raise ServingError(400, f"bad channel state in a wisv VERIFY: {exc}") from None
        if not rest:
            return csi, None
        try:
            h_sid, h_seq, positions, states = packets.parse_hidden(rest)
        except packets.PacketError as exc:
            raise ServingError(400, f"malformed HIDDEN packet after the channel state: {exc}") from None
        if (h_sid, h_seq) != (sid, seq) or any(not 0 <= i < n_draft for i in positions):
            raise ServingError(422, f"HIDDEN packet for session {h_sid} round {h_seq} positions {positions} does "
                                    f"not belong to this VERIFY (session {sid} round {seq}, {n_draft} tokens)")
        return csi, _states(positions, states, n_draft)

    @app.delete("/v1/sessions/{sid}", status_code=204)
    async def close_session(sid: int, request: Request):
        client = client_of(request)
        store.close(client, sid)
        return Response(status_code=204)

    return app


def listen_socket(host: str, port: int) -> socket.socket:
    """The server's listening socket, with TCP_NODELAY inherited by every accepted connection:
    uvicorn writes a response as headers then body, and without it the body waits for the
    client's delayed ACK (40 ms per request on Linux loopback, measured)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


class BackgroundServer:
    """A uvicorn server for `app` in a thread of this process, on a socket bound here (port 0 =
    any free port). For tests, benchmarks and notebooks; `speccap serve-cloud` runs it in front."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, certfile=None, keyfile=None):
        import uvicorn
        self.sock = listen_socket(host, port)
        self.host, self.port = host, self.sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", ssl_certfile=certfile, ssl_keyfile=keyfile,
                                timeout_keep_alive=30)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.scheme = "https" if certfile else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"verifier server on {self.url} did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


def serve(lm: AudioLM, tokens: dict[str, str], limits: Limits, host: str = "127.0.0.1", port: int = 8765,
          certfile: str | None = None, keyfile: str | None = None, compute_slots: int = 1, wisv_head=None) -> None:
    """Run the verifier in the foreground until interrupted (`speccap serve-cloud`)."""
    import uvicorn
    if bool(certfile) != bool(keyfile):
        raise ValueError("TLS needs both --certfile and --keyfile")
    for f in (certfile, keyfile):
        if f and not Path(f).is_file():
            raise FileNotFoundError(f"TLS file {f} not found")
    if not certfile and host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s without TLS: the bearer token and features cross the network in clear", host)
    app = create_app(lm, tokens, limits, compute_slots, wisv_head=wisv_head)
    sock = listen_socket(host, port)
    log.info("verifier for %s on %s://%s:%d", getattr(lm, "name", "cloud"), "https" if certfile else "http", host,
             sock.getsockname()[1])
    config = uvicorn.Config(app, ssl_certfile=certfile, ssl_keyfile=keyfile, log_level="info", timeout_keep_alive=30)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
