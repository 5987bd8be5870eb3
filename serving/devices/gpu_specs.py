"""Reference figures of the GPUs the emulator models (``emulated:<gpu>``).

The datasheet columns are the table in DESIGN.md ("GPU model for emulation"); the clock table mirrors
what NVML reports (``nvmlDeviceGetSupportedGraphicsClocks``: 15 MHz steps from the minimum to the
maximum SM clock; the H200 read 345..1980 MHz on 2026-11-30). Memory totals are what NVML reports
as ``memory.total`` on the real boards (``nvidia-smi --query-gpu=memory.total``, MiB), not the
marketing capacity: H100 SXM5 80GB 81,559 MiB and A100-SXM4-80GB 81,920 MiB (as those boards report
them in published nvidia-smi output); H200 141GB 143,771 MiB (this project's H200, 2026-11-30).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from serving.devices.errors import DeviceValueError

MIB = 2**20


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU model: peak rates, power range, clocks, memory, and a first-order thermal model."""

    key: str  # the <gpu> of emulated:<gpu>
    name: str  # as NVML names the real part
    bf16_tflops: float  # dense BF16 tensor peak at the maximum SM clock
    hbm_tb_s: float  # peak HBM bandwidth
    tdp_w: float  # default (and maximum) power limit
    min_power_limit_w: float
    idle_w: float
    max_sm_clock_mhz: int
    min_sm_clock_mhz: int
    mem_clock_mhz: int
    memory_bytes: int
    clock_step_mhz: int = 15
    ambient_c: float = 32.0  # inlet/idle-floor temperature of the thermal model
    thermal_c_per_w: float = 0.035  # steady-state rise per watt (H200: 79 W -> 35 C, 670 W -> 56 C)
    thermal_tau_s: float = 5.0  # the H200 readings settled within a few seconds of a load change

    @property
    def peak_flops(self) -> float:
        """Dense BF16 FLOP/s at the maximum SM clock."""
        return self.bf16_tflops * 1e12

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.hbm_tb_s * 1e12

    def supported_sm_clocks_mhz(self) -> tuple[int, ...]:
        """The settable SM clocks, ascending: the maximum, then down in ``clock_step_mhz`` steps."""
        return _clock_table(self.min_sm_clock_mhz, self.max_sm_clock_mhz, self.clock_step_mhz)


@functools.lru_cache(maxsize=16)
def _clock_table(low: int, high: int, step: int) -> tuple[int, ...]:
    clocks = list(range(high, low - 1, -step))
    if clocks[-1] != low:
        clocks.append(low)
    return tuple(sorted(clocks))


GPU_SPECS: dict[str, GpuSpec] = {
    "h100-sxm": GpuSpec(
        key="h100-sxm",
        name="NVIDIA H100 80GB HBM3",
        bf16_tflops=989.0,
        hbm_tb_s=3.35,
        tdp_w=700.0,
        min_power_limit_w=200.0,
        idle_w=72.0,
        max_sm_clock_mhz=1980,
        min_sm_clock_mhz=345,
        mem_clock_mhz=2619,
        memory_bytes=81_559 * MIB,  # NVML memory.total of an H100 SXM5 80GB
    ),
    "h200": GpuSpec(
        key="h200",
        name="NVIDIA H200",
        bf16_tflops=989.0,
        hbm_tb_s=4.8,
        tdp_w=700.0,
        min_power_limit_w=200.0,
        idle_w=75.0,
        max_sm_clock_mhz=1980,
        min_sm_clock_mhz=345,
        mem_clock_mhz=3201,
        memory_bytes=143_771 * MIB,  # NVML memory.total measured on this project's H200
    ),
    "a100-sxm-80gb": GpuSpec(
        key="a100-sxm-80gb",
        name="NVIDIA A100-SXM4-80GB",
        bf16_tflops=312.0,
        hbm_tb_s=2.04,
        tdp_w=400.0,
        min_power_limit_w=100.0,
        idle_w=60.0,
        max_sm_clock_mhz=1410,
        min_sm_clock_mhz=210,
        mem_clock_mhz=1593,
        memory_bytes=81_920 * MIB,  # NVML memory.total of an A100-SXM4-80GB
        thermal_c_per_w=0.07,
    ),
}


def gpu_spec(gpu: str | GpuSpec) -> GpuSpec:
    """Return the spec of ``gpu`` (a key such as ``"h100-sxm"``, or a spec passed through)."""
    if isinstance(gpu, GpuSpec):
        return gpu
    try:
        return GPU_SPECS[gpu]
    except KeyError:
        raise DeviceValueError(f"unknown emulated GPU {gpu!r}; allowed: {', '.join(GPU_SPECS)}") from None
