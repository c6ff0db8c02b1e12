import os

import numpy as np
import pytest
import soundfile as sf

from speccap.data.features import log_mel

from .models.conftest import tiny_lm

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@pytest.fixture
def tone():
    """A voiced-like test signal: harmonic tone at f0 with a syllable-rate envelope."""
    def make(f0=200.0, seconds=1.0, sr=16000, amp=0.5):
        t = np.arange(int(seconds * sr)) / sr
        x = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 6))
        env = 0.6 + 0.4 * np.sin(2 * np.pi * 4 * t) ** 2
        return (amp * x * env / np.max(np.abs(x))).astype(np.float32)
    return make


@pytest.fixture(scope="module")
def pair():
    """Two different random models of the real Qwen2.5-Omni class sharing a tokenizer: as edge and
    cloud they disagree often (the decoding, gating and relink tests)."""
    return tiny_lm("qwen2_5_omni", seed=1), tiny_lm("qwen2_5_omni", seed=2)


@pytest.fixture(scope="module")
def audio():
    """A 2 s modulated tone and its log-mel at hop 320."""
    t = np.arange(16000 * 2) / 16000
    wave = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    return wave, log_mel(wave, hop_length=320)


@pytest.fixture
def write_audio(tmp_path):
    def write(name, samples, sr=16000, subtype="PCM_16"):
        path = tmp_path / name
        sf.write(str(path), samples, sr, subtype=subtype)
        return path
    return write


TINY_SIZE = {"text_hidden": 32, "text_layers": 1, "text_heads": 2, "text_kv_heads": 1, "text_ffn": 64, "audio_d": 32,
             "audio_layers": 1, "audio_heads": 2, "audio_ffn": 64}
TINY_STEPS = {"max_steps": 6, "batch_size": 4, "eval_every": 3, "warmup_steps": 2, "threads": 1}


@pytest.fixture(scope="session")
def tiny_project(tmp_path_factory):
    """The pipeline's first stages for real at a tiny size: corpus, features, two trained captioners
    (edge: Qwen2.5-Omni class, cloud: Qwen3-Omni-MoE class). Returns (params, train report, params.yaml)."""
    import yaml

    from speccap.config import params_from_dict
    from speccap.data.featurize import featurize
    from speccap.data.prepare import prepare
    from speccap.models.captioners import train_captioners
    from speccap.pipeline.trace_refs import build_trace_refs
    root = tmp_path_factory.mktemp("project")
    raw = {"data": {"raw_dir": str(root / "raw"), "processed_dir": str(root / "proc"),
                    "synthetic": {"train_per_language": 4, "val_per_language": 2, "test_per_language": 3, "workers": 1}},
           "features": {"hop_length": 320, "workers": 1},
           "models": {"dir": str(root / "models"), "tokenizer_vocab": 200, "max_new_tokens": 8,
                      "edge": {"size": TINY_SIZE, "train": TINY_STEPS},
                      "cloud": {"family": "qwen3_omni_moe", "size": TINY_SIZE | {"text_hidden": 48}, "train": TINY_STEPS}},
           "sweep": {"block_lens": [2, 0], "gates": {"margin": [0.5]}, "workers": 0, "runs_dir": str(root / "runs")},
           "decode": {"threshold": 3.0, "block_len": 2},
           "tracking": {"uri": f"sqlite:///{root / 'mlflow.db'}", "experiment": "test"}}
    params = params_from_dict(raw)
    prepare(params, progress=False)
    featurize(params, progress=False)
    report = train_captioners(params, progress=False)
    build_trace_refs(params, None)  # human references: no cloud captions to make
    params_file = root / "params.yaml"
    params_file.write_text(yaml.safe_dump(raw))
    return params, report, params_file


def run_and_kill_a_worker(cmd: list[str], ready, sig: int, env=None, timeout: float = 240.0):
    """Run `cmd`, wait until `ready()` (some work finished), send `sig` to one of its spawned worker
    processes, and wait for it to end. Returns (returncode, stderr, seconds from the kill to the end)."""
    import signal as _signal  # noqa: F401 - callers pass signal.SIG*
    import subprocess
    import time

    import psutil
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    t0 = time.monotonic()
    victim = None
    while victim is None:
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"{cmd} ended (rc {proc.returncode}) before a worker could be killed:\n{err[-3000:]}")
        if time.monotonic() - t0 > timeout:
            proc.kill()
            raise AssertionError(f"{cmd}: no worker finished work within {timeout} s")
        if ready():
            workers = [c for c in psutil.Process(proc.pid).children()
                       if "spawn_main" in " ".join(c.cmdline())]
            victim = workers[0] if workers else None
        time.sleep(0.05)
    victim.send_signal(sig)
    killed = time.monotonic()
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"{cmd} still running 60 s after one of its workers was killed: a hang") from None
    return proc.returncode, err, time.monotonic() - killed
