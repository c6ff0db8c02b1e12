"""librosa's numba functions: compiled once, by one process, into a cache this project owns.

librosa's `yin` is a numba `guvectorize(cache=True)` function. Numba writes a gufunc's two cache
files with separate replaces, so two processes compiling at once can leave a pair from different
processes, and every later process that loads the pair segfaults (numba issue 10128). By default
numba writes next to librosa's sources in site-packages, where the damage outlives the run.

So:
- `configure()` (run when `speccap` is imported, before anything imports numba) points
  `NUMBA_CACHE_DIR` at a directory of ours unless the user set one: never site-packages.
- `ensure_warm()` compiles everything `prosody` uses in a child process, under a file lock, and
  stamps the cache; a parent calls it before it starts workers, so workers only ever read a
  complete cache. A second process waits on the lock, then finds the stamp and goes on.
- Numba keeps one entry per target CPU (name and features) in a cache, so the stamp is per target:
  a cache compiled by a process on the host's CPU is not warm for a stage pinned to another
  (`speccap.kernels` pins NUMBA_CPU_NAME), whose workers would otherwise all compile at once.
- A cache that crashes the child (damaged by an older version, a kill mid-write, or another
  tool) is cleared and compiled again; the stamp lists the cache files, so a changed cache is
  checked again. The check costs one child process (~2 s warm, ~15 s cold), only when needed.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import llvmlite.binding as llvm

from .fanout import describe_exit

_STAMP = "speccap-warm.json"
_LOCK = ".speccap.lock"
# what the child runs: the same `prosody` the workers call, on the input type they pass
_WARM_CODE = ("import numpy as np; from speccap.data.features import prosody; "
              "prosody(np.random.default_rng(0).standard_normal(16000).astype(np.float32))")
# set in the compiling child, whose own `prosody` call must not wait for the lock its parent holds
_CHILD_ENV = "SPECCAP_NUMBA_WARMING"
_warm_dirs: set[tuple[str, str]] = set()


class NumbaCacheError(RuntimeError):
    """The numba cache could not be compiled even from empty."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "speccap" / "numba"


def configure() -> Path:
    """Set NUMBA_CACHE_DIR (unless set) to our own cache; returns the directory in force."""
    if "NUMBA_CACHE_DIR" not in os.environ:
        os.environ["NUMBA_CACHE_DIR"] = str(default_cache_dir())
        if "numba" in sys.modules:  # numba read its settings already: make it read them again
            from numba.core import config
            config.reload_config()
    return Path(os.environ["NUMBA_CACHE_DIR"])


def target() -> str:
    """The target numba compiles for in this process, as its cache keys entries: the CPU name and
    features from NUMBA_CPU_NAME / NUMBA_CPU_FEATURES where set, else the host's."""
    name = os.environ.get("NUMBA_CPU_NAME") or llvm.get_host_cpu_name()
    features = os.environ.get("NUMBA_CPU_FEATURES") or llvm.get_host_cpu_features().flatten()
    return f"{name} {features}"


def _stamped(stamp: Path) -> dict[str, list]:
    """{target: the cache's listing when it was last found warm for that target}."""
    try:
        stamped = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return {}
    return stamped if isinstance(stamped, dict) else {}


def _listing(cache: Path) -> list[list]:
    return sorted([str(p.relative_to(cache)), p.stat().st_size, p.stat().st_mtime_ns]
                  for p in cache.rglob("*") if p.is_file() and p.name not in (_STAMP, _LOCK))


def _compile_in_child(cache: Path, code: str) -> tuple[int, str]:
    """(return code, last lines of its stderr) of a child that loads or compiles the cache."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), **{_CHILD_ENV: "1"})
    run = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return run.returncode, "\n".join(run.stderr.decode(errors="replace").strip().splitlines()[-5:])


def _clear(cache: Path) -> None:
    for p in cache.iterdir():
        if p.name == _LOCK:
            continue
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def ensure_warm(code: str = _WARM_CODE, log=None) -> Path:
    """Make sure the cache holds a complete compilation that a process can load; returns its path."""
    cache = configure()
    here = target()
    if (str(cache), here) in _warm_dirs or os.environ.get(_CHILD_ENV):
        return cache
    cache.mkdir(parents=True, exist_ok=True)
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    with open(cache / _LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one compiler at a time, across processes
        stamp = cache / _STAMP
        stamped = _stamped(stamp)
        if stamped.get(here) != _listing(cache):
            rc, _ = _compile_in_child(cache, code)
            if rc != 0:
                say(f"numba cache {cache}: a process loading it failed ({describe_exit(rc)}); "
                    "clearing it and compiling again")
                _clear(cache)
                stamped = {}
                rc, err = _compile_in_child(cache, code)
                if rc != 0:
                    raise NumbaCacheError(f"numba cache {cache}: compiling librosa's functions from an empty cache "
                                          f"failed ({describe_exit(rc)}):\n{err}")
            # other targets' entries stay: if this compile added files, their listing no longer matches
            # and their next process checks the cache again (one child, no compile)
            stamp.write_text(json.dumps(stamped | {here: _listing(cache)}))
    _warm_dirs.add((str(cache), here))
    return cache
