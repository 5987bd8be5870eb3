"""A CUDA GPU seen through torch only, for hosts where CUDA works but NVML does not.

Only memory is reported (from ``torch.cuda.mem_get_info``); every other metric is ``None`` and
every knob is unsupported. torch is imported lazily: it is slow to import.
"""

from __future__ import annotations

import time

from serving.devices.base import CudaIndexDevice, DeviceSample


def torch_cuda_device_count() -> int:
    """Return ``torch.cuda.device_count()``, or 0 when torch has no usable CUDA."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class TorchCudaDevice(CudaIndexDevice):
    """GPU number ``index`` through torch (spec ``cuda:<index>``); memory only."""

    def __init__(self, index: int) -> None:
        import torch

        self._torch = torch
        self._index = index
        self._name = torch.cuda.get_device_name(index)

    def snapshot(self) -> DeviceSample:
        """Sample device memory (used = total - free, as the driver reports it)."""
        ts_s = time.time()
        free_bytes, total_bytes = self._torch.cuda.mem_get_info(self._index)
        return DeviceSample(
            ts_s=ts_s,
            device=self.spec,
            kind="cuda",
            index=self._index,
            name=self._name,
            uuid=None,
            emulated=False,
            mem_used_bytes=int(total_bytes - free_bytes),
            mem_total_bytes=int(total_bytes),
        )
