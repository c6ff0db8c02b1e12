"""librosa's numba cache: ours (never site-packages), compiled once under a lock, and a damaged
one is found and rebuilt instead of breaking every later process."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from speccap import numba_cache

_PROSODY = ("import numpy as np; from speccap.data.features import prosody; "
            "print(prosody((0.3 * np.sin(np.arange(24000) * 0.09)).astype(np.float32))['f0_mean'])")


def _run(code: str, cache: Path, **extra) -> subprocess.CompletedProcess:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), **extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    """A cache compiled from empty by `ensure_warm` (in its own process, as a stage would)."""
    cache = tmp_path_factory.mktemp("numba") / "cache"
    r = _run("from speccap.numba_cache import ensure_warm; ensure_warm()", cache)
    assert r.returncode == 0, r.stderr
    return cache


@pytest.mark.e2e
def test_the_cache_is_ours_and_never_site_packages(compiled):
    assert list(compiled.rglob("*.nbi")) and (compiled / numba_cache.target() / "speccap-warm.json").exists()
    import librosa
    site = Path(librosa.__file__).parent
    assert not list(site.rglob("*.nbi")) and not list(site.rglob("*.nbc"))
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "SPECCAP_NUMBA_ROOT")}
    out = subprocess.run([sys.executable, "-c", "import speccap, os; print(os.environ['NUMBA_CACHE_DIR'])"],
                         env=env | {"XDG_CACHE_HOME": "/somewhere"}, capture_output=True, text=True)
    assert out.stdout.strip() == f"/somewhere/speccap/numba/{numba_cache.target()}"


@pytest.mark.e2e
def test_a_stamped_cache_is_not_compiled_again(compiled, tmp_path):
    cache = tmp_path / "c"
    shutil.copytree(compiled, cache, copy_function=shutil.copy2)  # same sizes and times: the stamp holds
    # in that process, a compile would fail: ensure_warm must trust the stamp and not run one
    code = ("import speccap.numba_cache as m; m._compile_in_child = lambda *a: (_ for _ in ()).throw("
            "AssertionError('compiled again')); m.ensure_warm(); " + _PROSODY.replace("import numpy", "\nimport numpy"))
    r = _run(code, cache)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout) > 60


@pytest.mark.e2e
def test_a_stage_pinned_to_another_cpu_compiles_its_own_cache_before_any_worker_runs(compiled, tmp_path):
    cache = tmp_path / "c"
    shutil.copytree(compiled, cache, copy_function=shutil.copy2)  # warm for this host's CPU
    host = numba_cache._listing(cache / numba_cache.target())
    other = "skylake" if numba_cache.target().startswith("haswell-") else "haswell"
    pinned = {"NUMBA_CPU_NAME": other}  # as a stage pins it (speccap.kernels)
    code = "from speccap.numba_cache import ensure_warm; print(ensure_warm())"
    r = _run(code, cache, **pinned)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    own = Path(r.stdout.strip())
    # a directory of its own, compiled there, the host's left as it was (loading the host's entries
    # pinned to another CPU could crash; sharing a stamp would leave the workers to compile)
    assert own.parent == cache and own.name.startswith(f"{other}-") and list(own.rglob("*.nbc"))
    assert numba_cache._listing(cache / numba_cache.target()) == host
    # a worker (which does not take the lock) only reads: it adds no file another could race on
    warmed = numba_cache._listing(own)
    r = _run(_PROSODY, cache, SPECCAP_NUMBA_WARMING="1", **pinned)
    assert r.returncode == 0, r.stderr
    assert numba_cache._listing(own) == warmed


def test_a_stage_process_pinned_after_import_moves_to_its_targets_cache(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "SPECCAP_NUMBA_ROOT")}
    # as a stage's process: speccap imported (its cache configured for the host), then the kernels pinned,
    # then ensure_warm's configure before librosa loads; the workers it starts inherit the directory
    code = ("import os, subprocess, sys; import speccap; from speccap.kernels import pin_kernels; "
            "from speccap.numba_cache import configure; pin_kernels(); print(configure()); sys.stdout.flush(); "
            "subprocess.run([sys.executable, '-c', 'import speccap, os; print(os.environ[\"NUMBA_CACHE_DIR\"])'])")
    out = subprocess.run([sys.executable, "-c", code], env=env | {"NUMBA_CACHE_DIR": str(tmp_path)},
                         capture_output=True, text=True, timeout=60)
    parent, child = out.stdout.split()
    # the pinned target's own directory under the user's root, not nested in the worker
    assert Path(parent).parent == tmp_path and Path(parent).name.startswith("haswell-") and child == parent, out


@pytest.mark.e2e
def test_a_truncated_cache_is_detected_cleared_and_rebuilt(compiled, tmp_path):
    cache = tmp_path / "c"
    shutil.copytree(compiled, cache)
    files = list(cache.rglob("*.nbc"))
    for f in files:  # as a process killed mid-write leaves them
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    broken = _run(_PROSODY, cache, SPECCAP_NUMBA_WARMING="1")  # without the guard: every process fails
    assert broken.returncode != 0 and "pickle data was truncated" in broken.stderr
    r = _run(_PROSODY, cache)  # with it (prosody calls ensure_warm first)
    assert r.returncode == 0, r.stderr
    assert "a process loading it failed (exit code 1); clearing it and compiling again" in r.stderr
    assert float(r.stdout) > 60
    assert _run(_PROSODY, cache).stderr == ""  # rebuilt and stamped: the next process just runs


def test_a_cache_that_crashes_its_loader_with_a_signal_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SPECCAP_NUMBA_ROOT", raising=False)
    cache = tmp_path / numba_cache.target()  # where ensure_warm compiles, under the root it is given
    cache.mkdir()
    (cache / "poison").write_text("")
    # a stand-in loader that segfaults while the poisoned file is there, as a bad gufunc pair does
    code = ("import os, signal, sys; "
            "os.kill(os.getpid(), signal.SIGSEGV) if os.path.exists(os.path.join(os.environ['NUMBA_CACHE_DIR'], "
            "'poison')) else None; open(os.path.join(os.environ['NUMBA_CACHE_DIR'], 'x.nbi'), 'w').write('ok')")
    said = []
    monkeypatch.setattr(numba_cache, "_warm_dirs", set())
    assert numba_cache.ensure_warm(code, log=said.append) == cache
    assert len(said) == 1 and "killed by SIGSEGV" in said[0] and "clearing it and compiling again" in said[0]
    assert not (cache / "poison").exists() and (cache / "x.nbi").read_text() == "ok"


def test_a_cache_that_cannot_be_built_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.delenv("SPECCAP_NUMBA_ROOT", raising=False)
    monkeypatch.setattr(numba_cache, "_warm_dirs", set())
    with pytest.raises(numba_cache.NumbaCacheError, match=r"(?s)compiling librosa's functions from an empty cache "
                                                            r"failed \(exit code 1\):\n.*ZeroDivisionError"):
        numba_cache.ensure_warm("1 / 0", log=lambda m: None)
