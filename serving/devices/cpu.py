"""The host CPU as a device: runs the real model math; only host memory is reported.

Host CPU load is not GPU utilization, so every GPU metric stays ``None``; the CPU has no
power reading or knobs here.
"""

from __future__ import annotations

import functools
import platform
import time
from pathlib import Path

import psutil

from serving.devices.base import Device, DeviceKind, DeviceSample


@functools.cache
def cpu_model_name() -> str:
    """Return the host CPU model name (from /proc/cpuinfo on Linux), or a generic fallback."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


class CpuDevice(Device):
    """The host CPU (spec ``"cpu"``)."""

    @property
    def spec(self) -> str:
        return "cpu"

    @property
    def kind(self) -> DeviceKind:
        return "cpu"

    @property
    def torch_device(self) -> str:
        return "cpu"

    def snapshot(self) -> DeviceSample:
        """Sample host memory; GPU-only metrics stay ``None``."""
        ts_s = time.time()
        mem = psutil.virtual_memory()
        return DeviceSample(
            ts_s=ts_s,
            device=self.spec,
            kind=self.kind,
            index=None,
            name=cpu_model_name(),
            uuid=None,
            emulated=False,
            mem_used_bytes=int(mem.total - mem.available),
            mem_total_bytes=int(mem.total),
        )
