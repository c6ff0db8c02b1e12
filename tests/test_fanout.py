"""The shared fan-out: a worker that dies is an error within seconds, naming the stage, the signal
and the item, and every result finished before it has been handed over."""

import os
import signal
import time

import pytest

from speccap.fanout import Background, WorkerDied, WorkerPool, describe_exit, fan_out

_STATE = {}


def _init(offset):
    _STATE["offset"] = offset


def _work(x):
    """Item 13 ends its worker the way the test asks; the others take a moment each."""
    how, i = x
    time.sleep(0.02)
    if i == 13:
        if how == "raise":
            raise ValueError("item 13 is bad")
        os.kill(os.getpid(), getattr(signal, how))
    return i + _STATE.get("offset", 0)


@pytest.mark.parametrize("how,name", [("SIGKILL", "SIGKILL"), ("SIGSEGV", "SIGSEGV")])
def test_a_dying_worker_is_a_clear_error_within_seconds(how, name):
    got = []
    t0 = time.monotonic()
    with pytest.raises(WorkerDied) as err:
        for r in fan_out(_work, [(how, i) for i in range(60)], 2, stage="demo", key=lambda x: f"item {x[1]}"):
            got.append(r)
    assert time.monotonic() - t0 < 30
    e = err.value
    assert e.stage == "demo" and e.item == "item 13" and e.exitcode == -getattr(signal, how)
    assert str(e).startswith(f"demo: worker process {e.pid} died (killed by {name}") and "while working on item 13" in str(e)
    # what finished before the death was handed over, and nothing after item 13 could have been lost silently
    assert e.done == len(got) and set(got) <= set(range(60)) - {13} and len(got) >= 5


def test_the_dead_worker_is_named_even_when_the_executor_has_already_dropped_it(monkeypatch):
    # as the executor breaks it may remove the dead worker from its own table before the pool looks:
    # then only the survivor it terminated (SIGTERM) is left there, and that one must not be blamed
    pool = WorkerPool(_work, 2, stage="demo")
    died = pool._died

    def after_the_executor_dropped_it(lost):
        procs = pool._executor._processes
        for pid in [pid for pid, p in procs.items() if p.exitcode == -signal.SIGSEGV]:
            del procs[pid]
        return died(lost)
    monkeypatch.setattr(pool, "_died", after_the_executor_dropped_it)
    with pytest.raises(WorkerDied) as err:
        list(pool.imap_unordered([("SIGSEGV", i) for i in range(40)], key=lambda x: f"item {x[1]}"))
    assert err.value.exitcode == -signal.SIGSEGV and err.value.item == "item 13"


def test_an_exception_in_the_task_propagates_unchanged():
    with pytest.raises(ValueError, match="item 13 is bad"):
        list(fan_out(_work, [("raise", i) for i in range(20)], 2, stage="demo"))


def test_initializer_and_results_in_workers_and_in_process():
    items = [("none", i) for i in range(30) if i != 13]
    for workers in (0, 2):
        out = sorted(fan_out(_work, items, workers, stage="demo", initializer=_init, initargs=(100,)))
        assert out == sorted(i + 100 for _, i in items)


def test_a_pool_is_closed_after_a_death_and_says_so():
    pool = WorkerPool(_work, 2, stage="sweep")
    with pytest.raises(WorkerDied):
        list(pool.imap_unordered([("SIGKILL", i) for i in range(20)]))
    assert pool.closed
    with pytest.raises(RuntimeError, match="sweep: this worker pool is closed"):
        list(pool.imap_unordered([("none", 1)]))


def test_describe_exit():
    assert describe_exit(-9).startswith("killed by SIGKILL")
    assert describe_exit(-11).startswith("killed by SIGSEGV")
    assert describe_exit(3) == "exit code 3" and describe_exit(None) == "exit status unknown"



def _environment(name):
    return os.environ.get(name)


def test_workers_blas_threads_sleep_at_once_and_this_process_keeps_its_environment(monkeypatch):
    monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT", raising=False)
    assert list(fan_out(_environment, ["OPENBLAS_THREAD_TIMEOUT"], 1, stage="demo")) == ["4"]
    assert "OPENBLAS_THREAD_TIMEOUT" not in os.environ
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "9")  # the user's own setting wins
    assert list(fan_out(_environment, ["OPENBLAS_THREAD_TIMEOUT"], 1, stage="demo")) == ["9"]


def _slow_square(x):
    if x == "bad":
        raise ValueError("item bad is bad")
    if x == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.05 * (5 - x))  # the first items finish last
    return x * x, os.getpid()


@pytest.mark.parametrize("workers", [0, 1])
def test_background_work_runs_while_this_process_goes_on_and_comes_back_in_order(workers):
    t0 = time.monotonic()
    with Background(_slow_square, range(5), workers, stage="demo") as bg:
        returned = time.monotonic() - t0
        made = bg.results()
    assert [m[0] for m in made] == [0, 1, 4, 9, 16]
    # in a worker, the constructor returns at once and the work is another process's
    assert ({m[1] for m in made} == {os.getpid()}) == (workers == 0)
    if workers:
        assert returned < 1.0  # the work alone takes 0.75 s after the worker starts


def test_background_work_raises_what_the_worker_raised_or_its_death():
    with Background(_slow_square, [1, "bad"], 1, stage="demo") as bg, pytest.raises(ValueError, match="item bad"):
        bg.results()
    with Background(_slow_square, [1, "die"], 1, stage="demo", key=lambda x: f"item {x}") as bg, \
            pytest.raises(WorkerDied, match="demo: worker process .* while working on item die"):
        bg.results()


_MAIN = '''
import sys
from speccap.fanout import fan_out
if __name__ != "__main__":  # imported again, as a worker's main module
    open(sys.argv[1], "a").write("imported")
def here(x):
    return -x
if __name__ == "__main__":
    print(sorted(fan_out(here if sys.argv[2] == "here" else abs, [-1, -2], 2, stage="demo")))
'''


@pytest.mark.parametrize("work", ["here", "speccap"])
def test_workers_import_the_main_module_only_when_the_work_is_defined_there(tmp_path, work):
    import subprocess
    import sys
    script, marker = tmp_path / "stage.py", tmp_path / "imported"
    script.write_text(_MAIN)
    out = subprocess.run([sys.executable, str(script), str(marker), work], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[1, 2]"
    assert marker.exists() == (work == "here")
