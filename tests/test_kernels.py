"""The stages' numerical kernels are pinned: what a stage computes does not depend on the kernel the
machine would pick (OpenBLAS's SkylakeX on an AVX-512 CPU, Haswell where the environment says so),
nor on how many threads OpenBLAS would run."""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from speccap.kernels import PINS, THREAD_PINS

ROOT = Path(__file__).resolve().parents[1]
X86 = platform.machine().lower() in ("x86_64", "amd64")
CPUINFO = Path("/proc/cpuinfo")
AVX512 = X86 and CPUINFO.exists() and "avx512f" in CPUINFO.read_text()

# a stage's first steps: the breathiness envelope (np.convolve) and the log-mel (the filterbank product)
PROBE = """
import hashlib, json, sys
if sys.argv[1] == "stage":
    import flows  # what every stage's process imports first
elif sys.argv[1] == "pinned":  # what flows does, without its imports
    from speccap.kernels import pin_kernels
    pin_kernels()
import numpy as np, threadpoolctl, torch
from speccap.data.effects import envelope
from speccap.data.features import log_mel
x = (0.1 * np.random.default_rng(0).standard_normal(16000 * 2)).astype(np.float32)
blas = [i.get("architecture") for i in threadpoolctl.threadpool_info() if i["internal_api"] == "openblas"]
print(json.dumps({"blas": blas, "torch": torch.backends.cpu.get_cpu_capability(),
                  "bytes": hashlib.sha256(envelope(x, 16000).tobytes() + log_mel(x).tobytes()).hexdigest()}))
"""


def _probe(how: str, coretype: str, blas_threads: int | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in PINS and k not in THREAD_PINS} | {
        "OPENBLAS_CORETYPE": coretype, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    if blas_threads is not None:
        env["OPENBLAS_NUM_THREADS"] = str(blas_threads)
    out = subprocess.run([sys.executable, "-c", PROBE, how], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not AVX512, reason="needs an x86-64 CPU with AVX-512 (OpenBLAS's SkylakeX kernel)")
def test_a_stage_computes_the_same_bytes_whichever_kernel_the_machine_would_pick():
    skylake, haswell = _probe("stage", "SkylakeX"), _probe("stage", "Haswell")
    assert skylake == haswell and set(skylake["blas"]) == {"Haswell"} and skylake["torch"] == "AVX2", (skylake, haswell)
    # the pin is what makes them equal: unpinned, the two kernels give different bits
    assert _probe("plain", "SkylakeX")["bytes"] != _probe("plain", "Haswell")["bytes"]


@pytest.mark.skipif(not X86, reason="needs an x86-64 CPU (OpenBLAS's Haswell kernel, where the split shows)")
def test_a_stage_computes_the_same_bytes_whatever_blas_threads_the_machine_would_run():
    # a machine's default is a thread per core; a cluster may set OPENBLAS_NUM_THREADS=1
    assert _probe("pinned", "Haswell", 1)["bytes"] == _probe("pinned", "Haswell", 3)["bytes"]
    # the pin is what makes them equal: unpinned, OpenBLAS's split among its threads moves the log-mel's bits
    assert _probe("plain", "Haswell", 1)["bytes"] != _probe("plain", "Haswell", 2)["bytes"]


# a training step's arithmetic through oneDNN: the audio encoder's convolution, forward and backward
CONV_PROBE = """
import hashlib, sys
if sys.argv[1] == "stage":
    import flows
import torch
torch.manual_seed(0)
x = torch.randn(2, 128, 3000, requires_grad=True)
conv = torch.nn.Conv1d(128, 64, 3, padding=1)
conv(x).square().mean().backward()
print(hashlib.sha256(x.grad.numpy().tobytes() + conv.weight.grad.numpy().tobytes()).hexdigest())
"""


def _conv(how: str, **env_extra) -> str:
    env = {k: v for k, v in os.environ.items() if k not in PINS} | env_extra | {
        "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    out = subprocess.run([sys.executable, "-c", CONV_PROBE, how], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(not AVX512, reason="needs an x86-64 CPU with AVX-512 (oneDNN's AVX-512 convolutions)")
def test_a_stage_convolves_as_an_avx2_machine_does():
    stage = _conv("stage")
    assert stage == _conv("plain", ONEDNN_MAX_CPU_ISA="AVX2")  # the bytes an AVX2-only machine computes
    assert stage != _conv("plain")  # unpinned, oneDNN's AVX-512 kernels sum in another order


def test_pinning_after_numpy_loaded_changes_nothing(monkeypatch):
    from speccap.kernels import pin_kernels
    for k in {**PINS, **THREAD_PINS}:
        monkeypatch.delenv(k, raising=False)
    assert "numpy" in sys.modules and pin_kernels() == {}
    assert not any(k in os.environ for k in {**PINS, **THREAD_PINS})
