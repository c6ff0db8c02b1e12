"""Fan-out over worker processes that fails fast when a worker dies, for every stage that fans out.

`multiprocessing.Pool` replaces a dead worker and waits forever for the tasks it held (a segfault
in a worker turned `featurize` into a silent hang). Here the pool is a spawned
`ProcessPoolExecutor`, which breaks as soon as a worker dies; `WorkerPool` turns that into a
`WorkerDied` naming the stage, the worker's exit signal and the item it was working on. Each
result is handed to the caller as soon as it is done, so a stage that writes records as they come
keeps everything finished before the death, and its re-run continues from there.

Workers note the item they start in a small file of their own (a write, no lock, no pipe), so the
parent can name the item even when the worker was killed mid-write of anything else.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

# Tasks submitted ahead of the workers, per worker: enough to keep them busy, few enough that a
# death loses little queued work and memory stays flat on long item lists.
_AHEAD = 2

_W: dict[str, Any] = {}
# a worker's mark starts with this once its item is done (it then holds none until the next)
_IDLE = "\0"


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the system tells it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class WorkerDied(RuntimeError):
    """A worker process of a fan-out ended abruptly (signal, OOM kill, crash in native code)."""

    def __init__(self, stage: str, pid: int | None, exitcode: int | None, item: str | None, done: int, lost: int,
                 last: str | None = None):
        """`item`: what the worker was working on (None: nothing); `last`: the item it finished last."""
        self.stage, self.pid, self.exitcode, self.item, self.done, self.lost = stage, pid, exitcode, item, done, lost
        self.last = last
        how = describe_exit(exitcode)
        if item is not None:
            held = f" while working on {item}"
        elif last is not None:
            held = f" between two items (the last one it finished: {last})"
        else:
            held = ""
        who = f"worker process {pid}" if pid is not None else "a worker process"
        super().__init__(
            f"{stage}: {who} died ({how}){held}. {done} item(s) finished before it are kept; {lost} in flight were "
            f"not finished. Re-run the stage to continue from there; if it dies again on the same item, see the "
            f"README section 'When a stage stops'.")


def describe_exit(exitcode: int | None) -> str:
    """'killed by SIGSEGV (segmentation fault)' for -11, 'exit code 3' for 3."""
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        try:
            sig = signal.Signals(-exitcode)
            return f"killed by {sig.name} ({signal.strsignal(sig) or sig.name})"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def _from_main(fn: Callable) -> bool:
    """Whether `fn`, or a function a partial of it holds, is defined in the main module."""
    if isinstance(fn, functools.partial):
        return _from_main(fn.func) or any(callable(a) and _from_main(a) for a in fn.args)
    return getattr(fn, "__module__", "__main__") == "__main__"


# OpenBLAS's threads spin after each call before they sleep (2**28 cycles unless told). Workers side
# by side share the cores, so one worker's spinning threads took the others' time: featurize's two
# workers on two cores, each with its BLAS thread per core, were slower together than one alone. A
# worker's threads sleep at once instead (the shortest spin OpenBLAS takes); results do not change.
_WORKER_ENV = {"OPENBLAS_THREAD_TIMEOUT": "4"}


@contextlib.contextmanager
def _worker_env():
    """While a worker starts (it inherits this process's environment): _WORKER_ENV where the user set
    none of its variables, then the environment as it was."""
    added = {k: v for k, v in _WORKER_ENV.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


@contextlib.contextmanager
def _main_unnamed(unname: bool):
    """While a worker starts: a spawned process imports its parent's main module first, by name or
    path, in case the work is defined there. A stage's main module is its Prefect flow, whose imports
    (Prefect and the flows package) took each worker about 4 s of CPU and 150 MB, for nothing: the
    work is speccap's own (checked by the caller: `unname`). Unnamed, the main is not imported."""
    main = sys.modules["__main__"]
    kept = {k: main.__dict__[k] for k in ("__spec__", "__file__") if k in main.__dict__} if unname else {}
    try:
        if kept:
            main.__spec__ = None
            main.__dict__.pop("__file__", None)
        yield
    finally:
        main.__dict__.update(kept)


def _worker_init(marks: str, fn: Callable, init: Callable | None, initargs: tuple) -> None:
    _W["mark"] = Path(marks) / str(os.getpid())
    _W["fn"] = fn
    if init is not None:
        init(*initargs)


def _mark(text: str) -> None:
    """What this worker holds, replaced whole: a worker killed mid-write must not leave the parent an
    empty mark (then it could name neither the item nor the last one finished)."""
    tmp = _W["mark"].with_name(_W["mark"].name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, _W["mark"])


def _call(key: str, item):
    _mark(key)
    result = _W["fn"](item)
    _mark(_IDLE + key)  # idle again: a later death held no item
    return result


class WorkerPool:
    """Spawned worker processes running `fn` on items; `workers == 0` runs in this process.

    `initializer(*initargs)` runs once per worker before any item (load models, set threads).
    `imap_unordered` yields results as they finish and raises `WorkerDied` within moments of a
    worker's death; an exception raised by `fn` itself propagates unchanged. After a death the
    pool is closed; make a new one to go on.
    """

    def __init__(self, fn: Callable, workers: int, *, stage: str, initializer: Callable | None = None,
                 initargs: tuple = ()):
        self.fn, self.workers, self.stage = fn, workers, stage
        self.done = 0
        self.closed = False
        self._marks = None
        self._executor = None
        # every worker process seen, kept here: the executor drops a dead one from its own table as it
        # breaks, and then only the survivors it terminated itself would be left to name
        self._procs: dict = {}
        if workers <= 0:
            if initializer is not None:
                initializer(*initargs)
            return
        self._unname_main = not any(_from_main(f) for f in (fn, initializer) if f is not None)
        self._marks = tempfile.mkdtemp(prefix=f"speccap-{stage}-")
        self._executor = cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"),
                                                initializer=_worker_init,
                                                initargs=(self._marks, fn, initializer, initargs))

    def imap_unordered(self, items: Iterable, key: Callable[[Any], str] = str) -> Iterator:
        if self.closed:
            raise RuntimeError(f"{self.stage}: this worker pool is closed (after a worker died, or by close())")
        if self._executor is None:
            for item in items:
                yield self.fn(item)
                self.done += 1
            return
        todo = iter(items)
        pending: dict[cf.Future, str] = {}

        def submit_more() -> None:
            while len(pending) < self.workers * _AHEAD:
                try:
                    item = next(todo)
                except StopIteration:
                    return
                k = key(item)
                try:
                    # (a worker starts in a submit, if one is due)
                    with _main_unnamed(self._unname_main), _worker_env():
                        pending[self._executor.submit(_call, k, item)] = k
                except BrokenProcessPool:
                    raise self._died(len(pending) + 1) from None
                self._procs.update(getattr(self._executor, "_processes", None) or {})

        submit_more()
        while pending:
            finished, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for fut in finished:
                pending.pop(fut)
                try:
                    result = fut.result()
                except BrokenProcessPool:
                    raise self._died(len(pending) + 1) from None
                self.done += 1
                yield result
            submit_more()

    def _died(self, lost: int) -> WorkerDied:
        """The worker that died, its exit code and the item it had started, then the pool shut down."""
        procs = {**self._procs, **(getattr(self._executor, "_processes", None) or {})}
        for p in procs.values():
            p.join(timeout=5)  # the executor terminates the survivors; let their exit codes settle
        codes = {pid: p.exitcode for pid, p in procs.items()}
        # the executor's own thread may be reaping a worker as we look: its exit code then reads None
        # for a moment (seen: the dead worker None, the survivor blamed), so wait for it to be set
        deadline = time.monotonic() + 5
        while any(c is None for c in codes.values()) and time.monotonic() < deadline:
            time.sleep(0.02)
            codes = {pid: p.exitcode for pid, p in procs.items()}
        # the dead one is the worker that did not end by the executor's own SIGTERM to the survivors
        dead = [pid for pid, c in codes.items() if c not in (0, None, -signal.SIGTERM)] or \
               [pid for pid, c in codes.items() if c not in (0, None)]
        pid = dead[0] if dead else None
        item = last = None
        if pid is not None:
            mark = Path(self._marks) / str(pid)
            text = mark.read_text(encoding="utf-8") if mark.exists() else ""
            if text.startswith(_IDLE):
                last = text[len(_IDLE):]
            else:
                item = text or None
        err = WorkerDied(self.stage, pid, codes.get(pid), item, self.done, lost, last)
        self.close()
        return err

    def close(self) -> None:
        self.closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        if self._marks is not None:
            shutil.rmtree(self._marks, ignore_errors=True)
            self._marks = None

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def fan_out(fn: Callable, items: Iterable, workers: int, *, stage: str, key: Callable[[Any], str] = str,
            initializer: Callable | None = None, initargs: tuple = ()) -> Iterator:
    """Results of `fn` over `items` as they finish, on a one-off `WorkerPool`."""
    with WorkerPool(fn, workers, stage=stage, initializer=initializer, initargs=initargs) as pool:
        yield from pool.imap_unordered(items, key)


def _keyed(fn: Callable, item: tuple[int, Any]) -> tuple[int, Any]:
    i, arg = item
    return i, fn(arg)


class Background:
    """`fn` over `items` in `workers` processes while this one goes on with other work; `results()`
    waits for them and gives them in item order. With `workers == 0` the items run in `results()`,
    in this process. What `fn` raised is raised by `results()`, and so is `WorkerDied`; leaving
    the `with` block before then stops the workers."""

    def __init__(self, fn: Callable, items: Iterable, workers: int, *, stage: str,
                 key: Callable[[Any], str] = str):
        self.fn, self.items = fn, list(items)
        self._made: dict[int, Any] = {}
        self._error: BaseException | None = None
        self._pool = self._thread = None
        if workers > 0 and self.items:
            self._pool = WorkerPool(functools.partial(_keyed, fn), workers, stage=stage)
            self._thread = threading.Thread(target=self._drive, args=(lambda item: key(item[1]),), daemon=True)
            self._thread.start()

    def _drive(self, key: Callable) -> None:
        try:
            for i, made in self._pool.imap_unordered(enumerate(self.items), key):
                self._made[i] = made
        except Exception as exc:  # noqa: BLE001 - handed to results(): this thread has no one to tell
            self._error = exc

    def results(self) -> list:
        if self._thread is None:
            return [self.fn(item) for item in self.items]
        self._thread.join()
        if self._error is not None:
            raise self._error
        return [self._made[i] for i in range(len(self.items))]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._thread.join()

    def __enter__(self) -> "Background":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
