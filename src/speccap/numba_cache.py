"""librosa's numba functions: compiled once, by one process, into a cache this project owns.

librosa's `yin` is a numba `guvectorize(cache=True)` function. Numba writes a gufunc's two cache
files with separate replaces, so two processes compiling at once can leave a pair from different
processes, and every later process that loads the pair segfaults (numba issue 10128). By default
numba writes next to librosa's sources in site-packages, where the damage outlives the run.

So:
- `configure()` (run when `speccap` is imported, before anything imports numba, and again by
  `ensure_warm`, after a stage's `speccap.kernels` has pinned numba's target CPU) points `NUMBA_CACHE_DIR` at a directory of ours (under
  the user's `NUMBA_CACHE_DIR` where one is set): never site-packages, and one directory per target
  CPU. Numba keys its entries by target, but a process pinned to one target that loads a cache
  written for another can segfault (seen: host-compiled entries, a stage pinned to haswell), and a
  cache stamped warm for one target is cold for the other, whose workers would then all compile.
- `ensure_warm()` compiles everything `prosody` uses in a child process, under a file lock, and
  stamps the cache; a parent calls it before it starts workers, so workers only ever read a
  complete cache. A second process waits on the lock, then finds the stamp and goes on.
- A cache that crashes the child (damaged by an older version, a kill mid-write, or another
  tool) is cleared and compiled again; the stamp lists the cache files, so a changed cache is
  checked again. The check costs one child process (~2 s warm, ~15 s cold), only when needed.
"""

from __future__ import annotations

import fcntl
import hashlib
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
# the cache root every process of a run shares, whatever its target (children inherit it)
_ROOT_ENV = "SPECCAP_NUMBA_ROOT"
# set in the compiling child, whose own `prosody` call must not wait for the lock its parent holds
_CHILD_ENV = "SPECCAP_NUMBA_WARMING"
_warm_dirs: set[str] = set()


class NumbaCacheError(RuntimeError):
    """The numba cache could not be compiled even from empty."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "speccap" / "numba"


def target() -> str:
    """The target numba compiles for in this process (as its cache keys entries), as a directory name:
    the CPU name from NUMBA_CPU_NAME or the host's, and a digest of the features, likewise."""
    name = os.environ.get("NUMBA_CPU_NAME") or llvm.get_host_cpu_name()
    features = os.environ.get("NUMBA_CPU_FEATURES") or llvm.get_host_cpu_features().flatten()
    return f"{name}-{hashlib.sha1(features.encode()).hexdigest()[:10]}"


def configure() -> Path:
    """Set NUMBA_CACHE_DIR to this target's directory under our cache root (the user's NUMBA_CACHE_DIR
    where set, else `default_cache_dir()`); returns the directory in force. Idempotent: a process whose
    NUMBA_CACHE_DIR is a target directory of ours (inherited from its parent) keeps the parent's root."""
    given, ours = os.environ.get("NUMBA_CACHE_DIR"), os.environ.get(_ROOT_ENV)
    if given and not (ours and Path(given).parent == Path(ours)):
        root = given
    else:
        root = ours or str(default_cache_dir())
    os.environ[_ROOT_ENV] = root
    cache = str(Path(root) / target())
    if os.environ.get("NUMBA_CACHE_DIR") != cache:
        os.environ["NUMBA_CACHE_DIR"] = cache
        if "numba" in sys.modules:  # numba read its settings already: make it read them again
            from numba.core import config
            config.reload_config()
    return Path(cache)


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
    if str(cache) in _warm_dirs or os.environ.get(_CHILD_ENV):
        return cache
    cache.mkdir(parents=True, exist_ok=True)
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    with open(cache / _LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one compiler at a time, across processes
        stamp = cache / _STAMP
        try:
            fresh = json.loads(stamp.read_text()) == _listing(cache)
        except (OSError, ValueError):
            fresh = False
        if not fresh:
            rc, _ = _compile_in_child(cache, code)
            if rc != 0:
                say(f"numba cache {cache}: a process loading it failed ({describe_exit(rc)}); "
                    "clearing it and compiling again")
                _clear(cache)
                rc, err = _compile_in_child(cache, code)
                if rc != 0:
                    raise NumbaCacheError(f"numba cache {cache}: compiling librosa's functions from an empty cache "
                                          f"failed ({describe_exit(rc)}):\n{err}")
            stamp.write_text(json.dumps(_listing(cache)))
    _warm_dirs.add(str(cache))
    return cache
