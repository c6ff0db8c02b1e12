"""The verifier server's batching: model calls from concurrent requests gathered into one forward.

The server hands each request's model work to the `Gather` (`submit`): its thread runs the work in
a greenlet of its own until the work asks for a model call (a session's start, a verification's
extension), as batching.lockstep runs a caption's loop. The thread takes the first piece of work,
waits up to `window_s` for more (at most `max_batch` calls at once), and runs their calls as one
forward per model (lockstep.step_all) before resuming each with its own rows. No request holds a
thread of its own while it waits, so many waiting requests cost the server no thread switches.
A call from any other thread (`ask`) queues and waits, and meets the others the same way.
Under light load a call waits at most the window; under heavy load a forward serves many
sessions. A session has one call pending at a time (the server's per-session lock), which is what
a step needs: one request per row. A forward that fails runs again call by call (lockstep.step_all),
so one session's bad input fails that session only.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from greenlet import getcurrent, greenlet

from ..models.base import AudioLM
from .lockstep import GOES_ON, settled, step_all, stepped
from .row_pool import RowPool


class Gather:
    """Gathers model calls over `window_s` (at most `max_batch` at once) on a thread of its own."""

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
        self.hub: greenlet | None = None  # the thread's own greenlet, which steps the others
        self.thread = threading.Thread(target=self._serve, name="speccap-gather", daemon=True)
        self.thread.start()

    def wrap(self, lm: AudioLM) -> AudioLM:
        """`lm` with its sessions' calls gathered here (a model that cannot share a step, as it is)."""
        return stepped(lm, self, self.max_batch, self.pools, compact="rounding")

    def submit(self, fn: Callable, *args) -> Future:
        """Run fn(*args) on the gather's thread, its model calls gathered with the others'; its
        result (or exception) comes in the returned future."""
        done: Future = Future()
        self.queue.put((fn, args, done))
        return done

    def ask(self, ask):
        """A model call: from work run here, parks that work until the next forward; from any other
        thread, queues it and waits. Returns its result (raised here if it failed)."""
        if threading.current_thread() is self.thread:
            if getcurrent() is not self.hub:
                return self.hub.switch(ask)
            while (out := settled(ask, ask.run(ask.pool, [ask])[0])) is GOES_ON:
                pass
            return out
        done: Future = Future()
        self.queue.put((None, ask, done))
        return done.result()

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=10)

    def _serve(self) -> None:
        self.hub = getcurrent()
        pending: list[tuple[greenlet | Future, object]] = []  # (the work or the caller waiting, its call)
        stop = False
        while not stop or pending:
            if not pending and not stop:
                stop = self._take(self.queue.get(), pending)
            deadline = time.monotonic() + self.window_s
            while not stop and len(pending) < self.max_batch:
                try:  # no local keeps an item: a session it holds is freed when its request is done
                    stop = self._take(self.queue.get(timeout=max(deadline - time.monotonic(), 0.0)), pending)
                except queue.Empty:
                    break
            if pending:
                pending = self._step(pending)

    def _take(self, item, pending: list) -> bool:
        """Start a piece of work (run up to its first call) or queue a thread's call; True: stop."""
        if item is None:
            return True
        fn, arg, done = item
        if fn is None:
            pending.append((done, arg))
            return False
        work = greenlet(lambda: _settle(done, fn, arg))
        call = work.switch()
        if not work.dead:
            pending.append((work, call))
        return False

    def _step(self, pending: list) -> list:
        """One forward over the pending calls; each caller resumed with its result (a run's caller
        once the run has ended). Returns the calls pending after it (work that asked again, runs
        that go on)."""
        results = step_all([call for _, call in pending])
        self.forwards += 1
        self.calls += len(pending)
        left = []
        for (who, call), out in zip(pending, results):
            if not isinstance(out, Exception) and (out := settled(call, out)) is GOES_ON:
                left.append((who, call))  # a run goes on at the next forward, its caller not resumed
                continue
            if isinstance(who, Future):
                who.set_exception(out) if isinstance(out, Exception) else who.set_result(out)
                continue
            call = who.throw(out) if isinstance(out, Exception) else who.switch(out)
            if not who.dead:
                left.append((who, call))
        return left


def _settle(done: Future, fn: Callable, args: tuple) -> None:
    """fn(*args)'s result or exception into `done`."""
    try:
        done.set_result(fn(*args))
    except BaseException as exc:  # noqa: BLE001 - the submitter receives it, as a call in its own thread would raise
        done.set_exception(exc)
