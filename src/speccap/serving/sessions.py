"""The verifier server's open sessions: who owns each, what it may send next, when it expires.

No HTTP here: the server (server.py) maps `ServingError.status` to a response. Every check that
keeps one client from hurting another lives here, so it is tested without a socket.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field

from ..decoding.cloud import CloudSession


class ServingError(Exception):
    """A refused request: `status` is the HTTP status the server answers with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Limits:
    """What one request and one client may use. Defaults suit the embedded models on one machine."""

    max_payload_bytes: int = 4 << 20  # an OPEN with 30 s of float32 128-mel features is ~1.5 MB
    max_block: int = 32  # draft tokens in one VERIFY
    max_sync: int = 512  # committed tokens brought up to date in one VERIFY
    max_sessions_per_client: int = 64
    max_sessions: int = 1024  # all clients together
    idle_seconds: float = 120.0  # a session unused this long is closed and its KV cache freed

    def __post_init__(self):
        for name in ("max_payload_bytes", "max_block", "max_sync", "max_sessions_per_client", "max_sessions"):
            if getattr(self, name) < 1:
                raise ValueError(f"serving limit {name} must be >= 1, got {getattr(self, name)}")
        if self.idle_seconds <= 0:
            raise ValueError(f"serving limit idle_seconds must be > 0, got {self.idle_seconds}")


@dataclass
class Session:
    id: int
    owner: str
    cloud: CloudSession
    opened: float
    last_used: float
    q_dtype: str = "float16"  # how the draft distributions travel (spec_sampling)
    last_seq: int = 0  # the last VERIFY seq answered; the next must be last_seq + 1
    rounds: int = 0
    verified_tokens: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    # WISV's selective protocol: a round waiting for the edge's hidden states at `asked`
    # (seq, draft, csi, asked); the next request must be that HIDDEN packet
    pending: tuple | None = None


class SessionStore:
    """Thread-safe map of session id -> Session. Ids are random 31-bit numbers, so a client cannot
    guess another's; a session of another client reads as unknown (404), never as forbidden."""

    def __init__(self, limits: Limits, clock=time.monotonic):
        self.limits = limits
        self.clock = clock
        self._sessions: dict[int, Session] = {}
        self._lock = threading.Lock()
        self.expired_total = 0
        self.opened_total = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def count(self, owner: str) -> int:
        with self._lock:
            return sum(s.owner == owner for s in self._sessions.values())

    def open(self, owner: str, cloud: CloudSession) -> Session:
        self.expire()
        now = self.clock()
        with self._lock:
            mine = sum(s.owner == owner for s in self._sessions.values())
            if mine >= self.limits.max_sessions_per_client:
                raise ServingError(429, f"client {owner!r} already holds {mine} open sessions "
                                        f"(limit {self.limits.max_sessions_per_client}); close some first")
            if len(self._sessions) >= self.limits.max_sessions:
                raise ServingError(503, f"the server holds {len(self._sessions)} sessions (limit "
                                        f"{self.limits.max_sessions}); try again later")
            sid = secrets.randbelow(2**31 - 1) + 1
            while sid in self._sessions:
                sid = secrets.randbelow(2**31 - 1) + 1
            session = Session(sid, owner, cloud, now, now)
            self._sessions[sid] = session
            self.opened_total += 1
            return session

    def get(self, owner: str, sid: int) -> Session:
        with self._lock:
            session = self._sessions.get(sid)
            if session is None or session.owner != owner:
                raise ServingError(404, f"no open session {sid} (never opened, closed, or expired after "
                                        f"{self.limits.idle_seconds:g} s idle)")
            session.last_used = self.clock()
            return session

    def close(self, owner: str, sid: int) -> None:
        session = self.get(owner, sid)
        with self._lock:
            self._sessions.pop(session.id, None)

    def drop(self, sid: int) -> None:
        """Forget a session whatever its owner (after a failure left its cache in doubt)."""
        with self._lock:
            self._sessions.pop(sid, None)

    def expire(self) -> list[int]:
        """Close sessions idle longer than the limit (a busy one is never expired mid-request)."""
        cutoff = self.clock() - self.limits.idle_seconds
        with self._lock:
            old = [sid for sid, s in self._sessions.items() if s.last_used < cutoff and not s.lock.locked()]
            for sid in old:
                del self._sessions[sid]
            self.expired_total += len(old)
        return old

    def check_verify(self, session: Session, packet_session: int, seq: int, n_sync: int, n_draft: int) -> None:
        """Order and size of one VERIFY before the model sees it."""
        if packet_session != session.id:
            raise ServingError(400, f"packet names session {packet_session}, the request session {session.id}")
        if seq <= session.last_seq:
            raise ServingError(409, f"replayed packet: seq {seq} of session {session.id} was already verified "
                                    f"(next is {session.last_seq + 1})")
        if seq != session.last_seq + 1:
            raise ServingError(409, f"out-of-order packet: session {session.id} expects seq {session.last_seq + 1}, "
                                    f"got {seq}")
        if n_draft < 1:
            raise ServingError(422, "a VERIFY needs at least one draft token")
        if n_draft > self.limits.max_block:
            raise ServingError(422, f"block of {n_draft} draft tokens is longer than the limit "
                                    f"{self.limits.max_block}")
        if n_sync > self.limits.max_sync:
            raise ServingError(422, f"{n_sync} sync tokens exceed the limit {self.limits.max_sync}")
