"""This host's GPUs through the Device interface (NVML, GPM on Hopper+): one snapshot per GPU per tick."""

from __future__ import annotations

import socket
from typing import Any

from collector.sources.base import TABLE_GPU_SAMPLES, Source, SourceResult, SourceUnavailable
from collector.store.columns import RepeatedColumns
from collector.store.devices import STEADY_SAMPLE_COLUMNS
from serving.devices import Device, DeviceError, nvml_available, nvml_device_count, open_device


def sample_row(device: Device, node: str, source: str) -> dict[str, Any]:
    """One consistent snapshot of `device` as a gpu_samples row."""
    return {**device.snapshot().to_dict(), "node": node, "source": source}


class LocalGpuSource(Source):
    """Samples every NVML GPU of this host (default period 100 ms).

    A GPU that is lost mid-run is sampled as `lost` (metrics NULL) and the others carry on;
    an unsupported metric is NULL, never a string.
    """

    def __init__(self, *, node: str | None = None, interval_s: float = 0.1, **kw: Any) -> None:
        super().__init__("nvml", interval_s=interval_s, **kw)
        self.node = node or socket.gethostname()
        self._devices: list[Device] | None = None
        self._repeats = RepeatedColumns(steady=STEADY_SAMPLE_COLUMNS)

    def _discover(self) -> bool:
        return nvml_available() and nvml_device_count() > 0

    def _open(self) -> list[Device]:
        if self._devices is None:
            if not self._discover():
                raise SourceUnavailable("unavailable", "NVML is not available (no NVIDIA driver or GPU)")
            self._devices = [open_device(f"cuda:{i}") for i in range(nvml_device_count())]
        return self._devices

    def _collect(self, now_s: float, result: SourceResult) -> None:
        samples = []
        for dev in self._open():
            try:
                samples.append(dev.snapshot().to_dict())
            except DeviceError as e:
                result.count("device_error", f"{dev.spec}: {e}")
        # as columns, the GPUs' identity handed on unchanged: the writer's cost per 100 ms poll is small
        result.add_samples(
            TABLE_GPU_SAMPLES, samples, {"node": self.node, "source": self.name}, self._repeats
        )

    def close(self) -> None:
        for dev in self._devices or ():
            dev.close()
        self._devices = None
