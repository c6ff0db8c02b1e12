"""NVML as the GPU metrics read it, for one device that cannot exist here (no GPU on these machines)."""

from __future__ import annotations

from types import SimpleNamespace

from speccap.metrics import system


class Device:
    """NVML's calls for one device: utilisation `busy_util` while `busy` is set (else 0), memory used
    rising by 1 GB per reading; `fail` makes a reading raise, as a driver can."""

    def __init__(self, busy: float = 90.0):
        self.busy_util, self.busy, self.fail, self.used = busy, False, False, 0

    def installed(self, monkeypatch) -> "Device":
        """This device as the one NVML sees, in this process, until the test ends."""
        monkeypatch.setattr(system, "_NVML", self)
        monkeypatch.setattr(system, "_SAMPLER", None)
        return self

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("device", index)

    def nvmlDeviceGetUtilizationRates(self, handle):
        if self.fail:
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return SimpleNamespace(gpu=self.busy_util if self.busy else 0.0)

    def nvmlDeviceGetMemoryInfo(self, handle):
        self.used += 10**9
        return SimpleNamespace(used=self.used)
