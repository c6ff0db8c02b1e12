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
import logging
import socket
import threading
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ..decoding import packets
from ..models.base import AudioLM
from .sessions import Limits, ServingError
from .verifier import Verifier

log = logging.getLogger("speccap.serving")
def create_app(lm: AudioLM, tokens: dict[str, str], limits: Limits = Limits(), compute_slots: int = 1,
               reap_every: float | None = None, wisv_head=None, batch: int = 1,
               batch_window_ms: float = 2.0) -> FastAPI:
    """The verifier app around one loaded cloud model (speccap.serving.verifier.Verifier holds it and
    answers each endpoint); a background task expires idle sessions every `reap_every` seconds.
    `batch` / `batch_window_ms`: verify concurrent sessions' requests in one forward (Verifier)."""
    v = Verifier(lm, tokens, limits, compute_slots, wisv_head, batch, batch_window_ms)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        async def reaper():
            while True:
                await asyncio.sleep(reap_every or max(min(limits.idle_seconds / 4, 5.0), 0.05))
                for sid in v.store.expire():
                    log.info("session %d expired after %.0f s idle", sid, limits.idle_seconds)
        task = asyncio.create_task(reaper())
        try:
            yield
        finally:
            task.cancel()
            if v.gather is not None:
                v.gather.close()

    app = FastAPI(title="speccap verifier", version=str(packets.VERSION), lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.state.store = v.store
    app.state.stats = v.stats
    app.state.gather = v.gather

    @app.exception_handler(ServingError)
    async def refused(request: Request, exc: ServingError):
        v.stats["refused"] += 1
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse({"error": exc.message}, status_code=exc.status, headers=headers)

    app.add_api_route("/v1/info", v.info, methods=["GET"])
    app.add_api_route("/v1/health", v.health, methods=["GET"])
    app.add_api_route("/v1/sessions", v.open_session, methods=["POST"], status_code=201)
    app.add_api_route("/v1/sessions/{sid}/verify", v.verify, methods=["POST"])
    app.add_api_route("/v1/sessions/{sid}/hidden", v.hidden_states, methods=["POST"])
    app.add_api_route("/v1/sessions/{sid}", v.close_session, methods=["DELETE"], status_code=204)
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
          certfile: str | None = None, keyfile: str | None = None, compute_slots: int = 1, wisv_head=None,
          batch: int = 1, batch_window_ms: float = 2.0, access_log: bool = True) -> None:
    """Run the verifier in the foreground until interrupted (`speccap serve-cloud`); `access_log`: a
    log line per request."""
    import uvicorn
    if bool(certfile) != bool(keyfile):
        raise ValueError("TLS needs both --certfile and --keyfile")
    for f in (certfile, keyfile):
        if f and not Path(f).is_file():
            raise FileNotFoundError(f"TLS file {f} not found")
    if not certfile and host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s without TLS: the bearer token and features cross the network in clear", host)
    app = create_app(lm, tokens, limits, compute_slots, wisv_head=wisv_head, batch=batch,
                     batch_window_ms=batch_window_ms)
    sock = listen_socket(host, port)
    log.info("verifier for %s on %s://%s:%d", getattr(lm, "name", "cloud"), "https" if certfile else "http", host,
             sock.getsockname()[1])
    config = uvicorn.Config(app, ssl_certfile=certfile, ssl_keyfile=keyfile, log_level="info", timeout_keep_alive=30,
                            access_log=access_log)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
