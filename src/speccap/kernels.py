"""Numerical kernels pinned, so that a stage writes the same bytes on every x86-64 machine, and
OpenBLAS's thread count on every machine (THREAD_PINS below).

Which kernel a numerical library runs is chosen per CPU unless the environment says otherwise, and
kernels sum in different orders. Measured here: OpenBLAS's SkylakeX kernel (what it picks on an
AVX-512 CPU when OPENBLAS_CORETYPE is not set) and its Haswell kernel (what some machines of this
workplace set) give different bits for np.convolve and np.dot, so the synthetic corpus (the
breathiness envelope convolves) and the log-mel (the mel filterbank is a product) differed between
two machines of one kind, and with them every model and report. torch and MKL choose likewise
(ATEN_CPU_CAPABILITY, MKL_CBWR), and so do numpy's own loops (its AVX-512 exp and log, the log-mel's,
where the CPU has them: NPY_DISABLE_CPU_FEATURES) and numba's compiled code (librosa's pitch
tracker, the prosody features: NUMBA_CPU_NAME), and oneDNN, which runs torch's convolutions (the
audio encoder's) on CPU: ONEDNN_MAX_CPU_ISA. Seen on an AVX2-only machine (AMD EPYC): the corpus
the same bytes as a dvc.lock made on an AVX-512 machine before numpy and numba were pinned, the
features not; and on an AVX-512 AMD EPYC (Zen 5), the corpus and features the same bytes as that
AVX2 machine's dvc.lock but both captioners not, until oneDNN was pinned too. The stages pin all
six to the AVX2 level (x86-64-v3), which every x86-64 machine the project runs on has: the results
then depend on the inputs, not on the CPU.

The pins take effect only when set before numpy and torch load: a stage's process imports `flows`
first, which calls `pin_kernels`. A process that loaded them already (a test importing a flow) keeps
its kernels, and so do the workers it starts.
"""

from __future__ import annotations

import os
import platform
import sys

PINS = {"OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2",
        "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR", "NUMBA_CPU_NAME": "haswell",
        "ONEDNN_MAX_CPU_ISA": "AVX2"}

# OpenBLAS splits a product among its threads, one per core unless told, and the split moves the sums'
# last bits: the log-mel's filterbank product at 1, 3, 4 or 8 threads against 2 (every clip), the
# logistic gates' fits at 1 against 2. So its thread count is pinned too, on every machine: 2, what
# the committed outputs were made with (a 2-core machine's default). Neither a machine's cores nor the
# OMP_NUM_THREADS / OPENBLAS_NUM_THREADS a cluster sets then changes a stage's bytes.
BLAS_THREADS = 2
THREAD_PINS = {"OPENBLAS_NUM_THREADS": str(BLAS_THREADS)}


def pin_kernels() -> dict[str, str]:
    """Set THREAD_PINS, and PINS on x86-64, in this process's environment (its worker processes inherit
    it), unless numpy or torch is loaded already; return what was set."""
    if "numpy" in sys.modules or "torch" in sys.modules:
        return {}
    pins = dict(THREAD_PINS)
    if platform.machine().lower() in ("x86_64", "amd64"):
        pins.update(PINS)
    os.environ.update(pins)
    return pins
