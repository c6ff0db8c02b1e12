"""System metrics of one caption: CPU %, RAM GB, and GPU % / GPU memory GB where NVML sees a GPU.

NVML is optional: without a GPU (or without the driver) `nvmlInit()` fails, and the GPU fields
are simply absent from the record, never an error.
"""

from __future__ import annotations

import os
import time

import psutil

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


def gpu_snapshot() -> dict:
    nv = _nvml()
    if nv is None:
        return {}
    try:
        h = nv.nvmlDeviceGetHandleByIndex(int(os.environ.get("SPECCAP_GPU_INDEX", "0")))
        util = nv.nvmlDeviceGetUtilizationRates(h)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        return {"gpu_percent": float(util.gpu), "gpu_memory_gb": mem.used / 1e9}
    except Exception:  # noqa: BLE001
        return {}


class ResourceMonitor:
    """CPU % of this process over the block (all cores: 200 % = two busy cores), peak RSS."""

    def __enter__(self):
        self.proc = psutil.Process()
        self.proc.cpu_percent(None)
        self.t0 = time.perf_counter()
        self.cpu0 = self.proc.cpu_times()
        self.gpu0 = gpu_snapshot()
        return self

    def __exit__(self, *exc):
        dt = max(time.perf_counter() - self.t0, 1e-9)
        cpu1 = self.proc.cpu_times()
        busy = (cpu1.user - self.cpu0.user) + (cpu1.system - self.cpu0.system)
        self._summary = {"cpu_percent": 100.0 * busy / dt, "ram_gb": self.proc.memory_info().rss / 1e9}
        gpu = gpu_snapshot()
        if gpu:
            self._summary["gpu_percent"] = max(gpu["gpu_percent"], self.gpu0.get("gpu_percent", 0.0))
            self._summary["gpu_memory_gb"] = max(gpu["gpu_memory_gb"], self.gpu0.get("gpu_memory_gb", 0.0))
        return False

    def summary(self) -> dict:
        return dict(getattr(self, "_summary", {}))
