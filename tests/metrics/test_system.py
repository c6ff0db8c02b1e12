"""A block's resources: CPU and RAM always; the GPU sampled through the block where NVML sees one, and
absent (no thread, no error) where it does not. No GPU exists here, so the NVML the sampler reads is a
stand-in with the library's call shapes, scripted to be busy only between a block's ends."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time

import pytest

from speccap.metrics import system
from speccap.metrics.system import GpuSampler, ResourceMonitor

from .nvml_standin import Device


def _sampling_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpu-sampler"]


def test_without_a_gpu_a_block_has_cpu_and_ram_and_no_gpu_fields():
    if system.gpu_sampler() is not None:
        pytest.skip("this machine has a GPU")
    with ResourceMonitor() as mon:
        t0 = time.process_time()
        while time.process_time() - t0 < 0.1:  # several clock ticks: the OS counts CPU time in 10 ms steps
            sum(i * i for i in range(10_000))
    s = mon.summary()
    assert set(s) == {"cpu_percent", "ram_gb"} and s["cpu_percent"] > 0 and s["ram_gb"] > 0.01
    assert mon.gpu_summary() == {} and not _sampling_threads()


def test_utilisation_between_the_ends_of_a_block_is_measured():
    dev = Device()
    sampler = GpuSampler(dev, 0, interval_s=0.005)
    w = sampler.open()  # idle at the start...
    dev.busy = True
    time.sleep(0.2)
    dev.busy = False
    s = sampler.close(w)  # ...and at the end: two snapshots at the ends would read 0 %
    assert w.samples >= 10
    assert 30 < s["gpu_percent"] < 90 and s["gpu_percent_max"] == 90.0
    assert s["gpu_memory_gb"] == pytest.approx(dev.used / 1e9)  # the peak: the last reading's
    assert "gpu_allocated_gb" not in s  # no CUDA in this process: the framework's figure is absent


def test_overlapping_blocks_each_get_the_samples_of_their_own_span_and_the_thread_stops_after():
    dev = Device()
    sampler = GpuSampler(dev, 0, interval_s=0.005)
    outer = sampler.open()
    time.sleep(0.05)
    dev.busy = True
    inner = sampler.open()  # as a caption opens inside its batch
    time.sleep(0.1)
    inner_s = sampler.close(inner)
    dev.busy = False
    time.sleep(0.05)
    outer_s = sampler.close(outer)
    assert inner_s["gpu_percent"] > 60 and outer_s["gpu_percent"] < inner_s["gpu_percent"]
    assert outer.samples > inner.samples
    for _ in range(100):
        if not _sampling_threads():
            break
        time.sleep(0.01)
    assert not _sampling_threads()


def test_a_reading_the_driver_refuses_is_a_gap_not_an_error():
    dev = Device()
    sampler = GpuSampler(dev, 0, interval_s=0.005)
    dev.fail = True
    w = sampler.open()
    time.sleep(0.03)
    assert sampler.close(w) == {}  # nothing read: no figure rather than a made-up one
    dev.fail = False
    w = sampler.open()
    assert set(sampler.close(w)) == {"gpu_percent", "gpu_percent_max", "gpu_memory_gb"}


def test_a_caption_monitor_reports_the_sampled_gpu_where_nvml_sees_one(monkeypatch):
    dev = Device(busy=50.0).installed(monkeypatch)
    dev.busy = True
    with ResourceMonitor() as mon:
        time.sleep(0.12)
    s = mon.summary()
    assert s["gpu_percent"] == 50.0 and s["gpu_memory_gb"] >= 2 and s["cpu_percent"] >= 0
    assert mon.gpu_summary() == {k: v for k, v in s.items() if k.startswith("gpu_")}


def _handle_pid(_):
    return system.this_process().pid, os.getpid()


def test_a_process_keeps_one_psutil_handle_and_a_forked_child_makes_its_own():
    assert system.this_process() is system.this_process() and system.this_process().pid == os.getpid()
    with mp.get_context("fork").Pool(1) as pool:  # the parent's handle already made, inherited
        handle, pid = pool.map(_handle_pid, [0])[0]
    assert handle == pid != os.getpid()
