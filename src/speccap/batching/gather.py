"""The verifier server's batching: model calls from concurrent requests gathered into one forward.

The server verifies each request in a worker thread of its own. With a `Gather`, such a thread's
model call (a session's start, a verification's extension) goes on a queue and waits; one thread
of the executor's takes the first call, waits up to `window_s` for more (at most `max_batch`), and
runs them as one forward per model (lockstep.step_all) before handing each caller its own rows.
Under light load a call waits at most the window; under heavy load a forward serves many
sessions. A session has one call pending at a time (the server's per-session lock), which is what
a step needs: one request per row. A forward that fails runs again call by call (lockstep.step_all),
so one session's bad input fails that session only.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

from ..models.base import AudioLM
from .lockstep import step_all, stepped
from .row_pool import RowPool


class Gather:
    """Gathers model calls from any thread over `window_s` (at most `max_batch` at once)."""

    def __init__(self, max_batch: int, window_s: float = 0.002):
        if max_batch < 1:
            raise ValueError(f"a batch must hold at least 1 call, got {max_batch}")
        if window_s < 0:
            raise ValueError(f"the batching window must be >= 0 seconds, got {window_s}")
        self.max_batch, self.window_s = max_batch, window_s
        self.pools: list[RowPool] = []
        self.queue: queue.Queue = queue.Queue()
        self.forwards = 0  # groups run (each one forward per model and kind of call)
        self.calls = 0  # calls they served
        self.thread = threading.Thread(target=self._serve, name="speccap-gather", daemon=True)
        self.thread.start()

    def wrap(self, lm: AudioLM) -> AudioLM:
        """`lm` with its sessions' calls gathered here (a model that cannot share a step, as it is)."""
        return stepped(lm, self, self.max_batch, self.pools)

    def ask(self, ask):
        """Queue a call and wait for its result (raised here if it failed)."""
        done: Future = Future()
        self.queue.put((ask, done))
        return done.result()

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=10)

    def _serve(self) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            items = [first]
            deadline = time.monotonic() + self.window_s
            while len(items) < self.max_batch:
                try:
                    item = self.queue.get(timeout=max(deadline - time.monotonic(), 0.0))
                except queue.Empty:
                    break
                if item is None:
                    self.queue.put(None)  # stop after this group
                    break
                items.append(item)
            self._run(items)

    def _run(self, items: list) -> None:
        results = step_all([a for a, _ in items])  # a failed call's exception, for its caller alone
        self.forwards += 1
        self.calls += len(items)
        for (_, done), out in zip(items, results):
            if isinstance(out, Exception):
                done.set_exception(out)
            else:
                done.set_result(out)
