"""The edge's HTTP client for the verifier server: timeouts, bounded retries, measured bytes.

A request is retried only when the server surely did not act on it (the connection was refused
or never opened, or the server answered 503 "full"): a VERIFY that timed out may have been run,
and running it twice would be refused as a replay, so that surfaces as `CloudUnavailable` and the
edge falls back for the block (engine: the cloud half returns None) and opens a fresh session later.
"""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import dataclass

import httpx

from ..decoding.packets import UPLINK_HEADER


class CloudUnavailable(ConnectionError):
    """The verifier could not be reached or failed (timeout, refused connection, 5xx)."""


class CloudRefused(ConnectionError):
    """The verifier refused the request (4xx): `status` and the server's message."""

    def __init__(self, status: int, message: str):
        super().__init__(f"verifier refused the request ({status}): {message}")
        self.status = status
        self.message = message


@dataclass
class Exchange:
    """One request/response: its body, wall seconds, HTTP bytes each way (request/status line,
    headers and body, before TLS), and the server's compute and queue seconds when it says them."""

    body: bytes
    seconds: float
    bytes_up: int
    bytes_down: int
    compute: float = 0.0
    queue: float = 0.0


def _http_bytes(response: httpx.Response) -> tuple[int, int]:
    req = response.request
    up = (len(req.method) + len(req.url.raw_path) + 12 + sum(len(k) + len(v) + 4 for k, v in req.headers.raw) + 2
          + len(req.content))
    down = (17 + len(response.reason_phrase or "") + sum(len(k) + len(v) + 4 for k, v in response.headers.raw) + 2
            + len(response.content))
    return up, down


class VerifierClient:
    """Talks to one `speccap serve-cloud`. `cafile`: a CA bundle or self-signed certificate to trust
    for https:// URLs. The token goes only into the Authorization header (never into errors or logs)."""

    def __init__(self, url: str, token: str, timeout: float = 10.0, retries: int = 2, backoff: float = 0.2,
                 cafile: str | None = None):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"verifier URL must start with http:// or https://, got {url!r}")
        if retries < 0 or timeout <= 0:
            raise ValueError("retries must be >= 0 and timeout > 0")
        self.url, self.retries, self.backoff = url.rstrip("/"), retries, backoff
        # TCP_NODELAY: a request goes out as headers then body; with Nagle's algorithm the body waits
        # for the server's delayed ACK (40 ms per request on Linux loopback)
        transport = httpx.HTTPTransport(verify=ssl.create_default_context(cafile=cafile) if cafile else True,
                                        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"},
                                 timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)), transport=transport)

    def close(self) -> None:
        self.http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def request(self, method: str, path: str, content: bytes | None = None, headers: dict | None = None) -> Exchange:
        last = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            t = time.perf_counter()
            try:
                r = self.http.request(method, path, content=content,
                                      headers=({"Content-Type": "application/octet-stream"} if content else {})
                                      | (headers or {}))
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                last = f"cannot connect to {self.url}: {type(exc).__name__} {exc}".strip()
                continue  # never reached the server: safe to send again
            except httpx.TimeoutException as exc:
                raise CloudUnavailable(f"{method} {path}: no answer from {self.url} in time ({type(exc).__name__})") \
                    from None
            except httpx.TransportError as exc:
                raise CloudUnavailable(f"{method} {path}: connection to {self.url} broke ({type(exc).__name__})") \
                    from None
            seconds = time.perf_counter() - t
            if r.status_code == 503:
                last = f"server full: {_message(r)}"
                continue
            if r.status_code >= 500:
                raise CloudUnavailable(f"{method} {path}: server error {r.status_code}: {_message(r)}")
            if r.status_code >= 400:
                raise CloudRefused(r.status_code, _message(r))
            up, down = _http_bytes(r)
            return Exchange(r.content, seconds, up, down, float(r.headers.get("x-speccap-compute", 0.0)),
                            float(r.headers.get("x-speccap-queue", 0.0)))
        raise CloudUnavailable(f"{method} {path}: gave up after {self.retries + 1} attempts ({last})")

    def info(self) -> dict:
        return _json(self.request("GET", "/v1/info"))

    def health(self) -> dict:
        return _json(self.request("GET", "/v1/health"))

    def open(self, packet: bytes, uplink: str = "") -> tuple[int, Exchange]:
        """`uplink`: the learned encoder the features were sent through (its digest), for the server to check."""
        ex = self.request("POST", "/v1/sessions", packet, {UPLINK_HEADER: uplink} if uplink else None)
        return int(_json(ex)["session"]), ex

    def verify(self, session: int, packet: bytes) -> Exchange:
        return self.request("POST", f"/v1/sessions/{session}/verify", packet)

    def hidden(self, session: int, packet: bytes) -> Exchange:
        """WISV's selective protocol: the edge's states at the positions a MISMATCH answer named."""
        return self.request("POST", f"/v1/sessions/{session}/hidden", packet)

    def end(self, session: int) -> bool:
        """Close a session; False when the server is gone or the session already was (harmless)."""
        try:
            self.request("DELETE", f"/v1/sessions/{session}")
            return True
        except (CloudUnavailable, CloudRefused):
            return False


def wait_until_up(url: str, token: str, seconds: float = 90.0, alive=lambda: True, cafile: str | None = None) -> None:
    """Poll the server's health until it answers; RuntimeError when `alive()` turns False (the
    server process died) or `seconds` pass. For scripts and tests that start a server themselves."""
    with VerifierClient(url, token, timeout=2, retries=0, cafile=cafile) as probe:
        deadline = time.monotonic() + seconds
        while True:
            try:
                probe.health()
                return
            except CloudUnavailable:
                if not alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"verifier at {url} did not come up") from None
                time.sleep(0.2)


def _json(ex: Exchange) -> dict:
    import json
    return json.loads(ex.body)


def _message(r: httpx.Response) -> str:
    try:
        return str(r.json().get("error", r.text))
    except ValueError:
        return r.text[:200]
