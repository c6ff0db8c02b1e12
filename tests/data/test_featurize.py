"""featurize under stress: a killed worker stops the stage with a clear error and keeps what was
written; two stages compiling librosa's numba code at once from a cold cache do not break it. And
the log-mels a worker keeps for its jobs."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from speccap.data.featurize import KeptMels, write_npz
from speccap.data.manifest import manifest_path, read_manifest, write_jsonl

from ..conftest import run_and_kill_a_worker

_RUN = "import sys; from speccap.config import load_params; from speccap.data.featurize import featurize; " \
       "featurize(load_params(sys.argv[1]), progress=False)"


def _project(tiny_project, root: Path, copies: int, workers: int = 2) -> Path:
    """A project whose manifests list the tiny corpus's clips `copies` times under new ids."""
    params, _, _ = tiny_project
    src = [r for lang in params.data.languages
           for r in read_manifest(manifest_path(params.data.processed_dir, "train", lang))]
    recs = [dict(r, id=f"{r['id']}-{k}") for k in range(copies) for r in src]
    write_jsonl(manifest_path(root / "proc", "train", "en"), recs)
    raw = {"data": {"raw_dir": str(root / "raw"), "processed_dir": str(root / "proc"), "languages": ["en"]},
           "features": {"hop_length": 320, "workers": workers}}
    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    return root / "params.yaml"


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGKILL])  # both signals: tests/test_fanout.py
def test_a_killed_worker_stops_featurize_clearly_and_a_rerun_finishes(tiny_project, tmp_path, sig):
    pfile = _project(tiny_project, tmp_path, copies=60)
    n = 60 * 8
    feats = tmp_path / "proc" / "features"
    rc, err, after = run_and_kill_a_worker([sys.executable, "-c", _RUN, str(pfile)],
                                           lambda: feats.exists() and len(list(feats.glob("*.npz"))) >= 20, sig)
    assert rc != 0 and after < 30, (rc, after, err[-2000:])
    last = err.strip().splitlines()[-1]
    assert "WorkerDied: featurize: worker process" in last and f"killed by {signal.Signals(sig).name}" in last
    assert ("while working on clip" in last or "between two items (the last one it finished: clip" in last)
    assert "Re-run the stage to continue" in last
    kept = {p.name for p in feats.glob("*.npz")}
    assert 20 <= len(kept) < n
    # the re-run computes only what is missing and ends with every clip
    subprocess.run([sys.executable, "-c", _RUN, str(pfile)], check=True, capture_output=True)
    assert len(list(feats.glob("*.npz"))) == n
    assert json.loads((tmp_path / "proc" / "featurize_report.json").read_text())["clips"] == n


@pytest.mark.e2e
def test_two_featurize_runs_at_once_from_a_cold_numba_cache(tiny_project, tmp_path):
    cache = tmp_path / "numba"  # empty: both runs would compile librosa's gufuncs at the same moment
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    files = [_project(tiny_project, tmp_path / name, copies=4) for name in ("a", "b")]
    procs = [subprocess.Popen([sys.executable, "-c", _RUN, str(f)], env=env, stderr=subprocess.PIPE, text=True)
             for f in files]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    a, b = (sorted((f.parent / "proc" / "features").glob("*.npz")) for f in files)
    assert len(a) == len(b) == 32
    assert all(x.name == y.name and x.read_bytes() == y.read_bytes() for x, y in zip(a, b))
    # the compiled cache is ours, complete, and loads in a new process
    assert list(cache.rglob("*.nbi")) and list(cache.rglob("*.nbc"))
    check = subprocess.run([sys.executable, "-c", "import numpy as np; from speccap.data.features import prosody; "
                            "print(prosody(np.ones(16000, np.float32) * np.sin(np.arange(16000) / 9))['duration'])"],
                           env=env, capture_output=True, text=True)
    assert check.returncode == 0 and float(check.stdout) == 1.0, check.stderr


def test_kept_mels_read_each_clip_once_and_drop_the_least_recent_past_the_budget(tmp_path):
    feats = tmp_path / "features"
    feats.mkdir()
    for k in range(3):
        write_npz(feats / f"c{k}.npz", mel=np.full((4, 10), k, np.float16), prosody=np.zeros(14, np.float32))
    kept = KeptMels(tmp_path, max_bytes=2 * 4 * 10 * 4)  # room for two clips' float32 log-mels
    a = kept.get("c0")
    assert a.dtype == np.float32 and (a == 0).all() and kept.get("c0") is a
    kept.get("c1")
    kept.get("c0")  # c0 the most recent: c1 goes when c2 comes
    kept.get("c2")
    assert kept.get("c0") is a and kept.nbytes == 2 * a.nbytes
    (feats / "c1.npz").unlink()
    with pytest.raises(FileNotFoundError, match="c1.npz"):
        kept.get("c1")
