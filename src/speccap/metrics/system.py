"""System metrics of a block of work (a caption, a batch, a stage): CPU %, RAM GB, and where NVML
sees a GPU its utilisation and memory sampled through the block.

GPU utilisation is a rate the driver averages over its own short window, so two readings at a
block's ends say little about the block between them. One thread per process therefore reads NVML
(and torch's allocated bytes, where CUDA is initialised) every `SAMPLE_INTERVAL_S` while any block
is open, and each open block keeps its own running mean and peaks: blocks may nest and overlap (the
batching executor's captions share every step, so each caption's figure is that of the batches it
ran in). NVML is optional: without a GPU (or without the driver) `nvmlInit()` fails, no thread
starts, and the GPU fields are absent from the record, never an error.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import psutil
import torch

SAMPLE_INTERVAL_S = 0.05
# what a block reports of the GPU, where there is one
GPU_FIELDS = ("gpu_percent", "gpu_percent_max", "gpu_memory_gb", "gpu_allocated_gb")
_NVML = None  # None: not tried; False: unavailable; else the pynvml module


def _nvml():
    global _NVML
    if _NVML is None:
        try:
            import pynvml
            pynvml.nvmlInit()
            _NVML = pynvml if pynvml.nvmlDeviceGetCount() > 0 else False
        except Exception:  # noqa: BLE001 - no library, no driver, no device: all mean "no GPU metrics"
            _NVML = False
    return _NVML or None


@dataclass
class GpuWindow:
    """The samples of one open block: their mean utilisation and the peaks of memory."""
    util_sum: float = 0.0
    util_max: float = 0.0
    samples: int = 0
    peak_used: int = 0
    peak_allocated: int | None = None

    def add(self, util: float, used: int, allocated: int | None) -> None:
        self.util_sum += util
        self.util_max = max(self.util_max, util)
        self.samples += 1
        self.peak_used = max(self.peak_used, used)
        if allocated is not None:
            self.peak_allocated = max(self.peak_allocated or 0, allocated)

    def summary(self) -> dict:
        if not self.samples:
            return {}
        out = {"gpu_percent": self.util_sum / self.samples, "gpu_percent_max": self.util_max,
               "gpu_memory_gb": self.peak_used / 1e9}
        if self.peak_allocated is not None:  # this process's tensors, as the framework counts them
            out["gpu_allocated_gb"] = self.peak_allocated / 1e9
        return out


class GpuSampler:
    """Reads one device every `interval_s` while a window is open, into every open window."""

    def __init__(self, nvml, index: int, interval_s: float = SAMPLE_INTERVAL_S):
        self.nvml, self.interval_s = nvml, interval_s
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self._lock = threading.Lock()
        self._open: dict[int, GpuWindow] = {}
        self._thread: threading.Thread | None = None

    def _read(self) -> tuple[float, int, int | None] | None:
        try:
            util = self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu
            used = self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used
        except Exception:  # noqa: BLE001 - a reading the driver refuses is a gap, not an error
            return None
        allocated = torch.cuda.memory_allocated() if torch.cuda.is_initialized() else None
        return float(util), int(used), allocated

    def _sample(self, only: GpuWindow | None = None) -> None:
        reading = self._read()
        if reading is None:
            return
        with self._lock:
            for w in ([only] if only is not None else list(self._open.values())):
                w.add(*reading)

    def _run(self) -> None:
        while True:
            time.sleep(self.interval_s)
            with self._lock:
                if not self._open:
                    self._thread = None
                    return
            self._sample()

    def open(self) -> GpuWindow:
        w = GpuWindow()
        self._sample(only=w)  # a reading at the start: a block shorter than the interval still has one
        with self._lock:
            self._open[id(w)] = w
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
                self._thread.start()
        return w

    def close(self, w: GpuWindow) -> dict:
        with self._lock:
            self._open.pop(id(w), None)
        self._sample(only=w)  # and one at the end
        return w.summary()


_SAMPLER: GpuSampler | None = None


def gpu_sampler() -> GpuSampler | None:
    """This process's sampler of the GPU it uses ($SPECCAP_GPU_INDEX, default 0); None without one."""
    global _SAMPLER
    nv = _nvml()
    if nv is None:
        return None
    if _SAMPLER is None:
        try:
            _SAMPLER = GpuSampler(nv, int(os.environ.get("SPECCAP_GPU_INDEX", "0")))
        except Exception:  # noqa: BLE001 - a device NVML counts but will not open: no GPU metrics
            return None
    return _SAMPLER


_PROCESS: dict[int, psutil.Process] = {}


def this_process() -> psutil.Process:
    """This process's psutil handle, made once per process (making one reads /proc: a caption's
    monitor opens and closes once per caption)."""
    pid = os.getpid()
    if pid not in _PROCESS:  # a forked child gets a handle of its own
        _PROCESS.clear()
        _PROCESS[pid] = psutil.Process(pid)
    return _PROCESS[pid]


def _cpu_seconds() -> float:
    """User and system CPU seconds of this process, every thread (a system call, no /proc read)."""
    t = os.times()
    return t.user + t.system


class ResourceMonitor:
    """CPU % of this process over the block (all cores: 200 % = two busy cores), peak RSS, and the GPU's
    mean utilisation and peak memory sampled through the block where there is one."""

    def __enter__(self):
        self.proc = this_process()
        self.t0 = time.perf_counter()
        self.cpu0 = _cpu_seconds()
        self.sampler = gpu_sampler()
        self.gpu = self.sampler.open() if self.sampler else None
        return self

    def __exit__(self, *exc):
        dt = max(time.perf_counter() - self.t0, 1e-9)
        busy = _cpu_seconds() - self.cpu0
        self._summary = {"cpu_percent": 100.0 * busy / dt, "ram_gb": self.proc.memory_info().rss / 1e9}
        if self.gpu is not None:
            self._summary.update(self.sampler.close(self.gpu))
        return False

    def summary(self) -> dict:
        return dict(getattr(self, "_summary", {}))

    def gpu_summary(self) -> dict:
        """The GPU fields alone: the device's, whichever process used it (a stage's, over its workers)."""
        return {k: v for k, v in self.summary().items() if k in GPU_FIELDS}
