"""Reference figures of the GPUs the emulator models (``emulated:<gpu>``).

The datasheet columns are the table in DESIGN.md ("GPU model for emulation"); the clock table mirrors
what NVML reports (``nvmlDeviceGetSupportedGraphicsClocks``: 15 MHz steps from the minimum to the
maximum SM clock; the H200 read 345..1980 MHz on 2026-11-30). Memory totals are what NVML reports
as ``memory.total`` on the real boards (``nvidia-smi --query-gpu=memory.total``, MiB), not the
marketing capacity: H100 SXM5 80GB 81,559 MiB and A100-SXM4-80GB 81,920 MiB (as those boards report
them in published nvidia-smi output); H200 141GB 143,771 MiB (this project's H200, 2026-11-30).

Blackwell (``b200``, ``gb200``; issue 23 point 5): dense BF16/FP8 tensor peaks and HBM bandwidth from
NVIDIA's published figures (``source`` on each spec); no board was measured here, so TDP split, idle
power, clocks and memory totals are the datasheets' or assumed (``source`` says which), and every figure
the model computes on them is **unvalidated** (:func:`fidelity`). FP8 peaks (``fp8_tflops``) are the
dense (no sparsity) figures; A100 has no FP8 tensor cores (``None``).
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
    fp8_tflops: float | None = None  # dense FP8 tensor peak; None: no FP8 tensor cores
    num_sms: int = 132  # streaming multiprocessors (the SM-activity model's fill)
    source: str = ""  # where the peak figures come from
    validated: bool = True  # the GPU model was checked against measurements on this GPU

    def peak_flops_for(self, dtype: str = "bf16") -> float:
        """Dense tensor FLOP/s of ``dtype`` (``bf16`` or ``fp8``) at the maximum SM clock."""
        if dtype == "bf16":
            return self.bf16_tflops * 1e12
        if dtype == "fp8":
            if self.fp8_tflops is None:
                raise DeviceValueError(f"{self.name} has no FP8 tensor cores; allowed dtype: bf16")
            return self.fp8_tflops * 1e12
        raise DeviceValueError(f"unknown dtype {dtype!r}; allowed: bf16, fp8")

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
        fp8_tflops=1979.0,
        source="NVIDIA H100 datasheet (SXM): BF16 1,979 / FP8 3,958 TFLOPS with sparsity (dense: half), 3.35 TB/s",
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
        fp8_tflops=1979.0,
        source="NVIDIA H200 datasheet (SXM): BF16 1,979 / FP8 3,958 TFLOPS with sparsity (dense: half), 4.8 TB/s",
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
        num_sms=108,
        source="NVIDIA A100 datasheet (SXM4 80GB): BF16 312 TFLOPS dense, 2,039 GB/s; no FP8",
    ),
    # Blackwell: not validated (no measurement of a Blackwell GPU reached the model). 148 SMs.
    "b200": GpuSpec(
        key="b200",
        name="NVIDIA B200",
        bf16_tflops=2250.0,
        hbm_tb_s=8.0,
        tdp_w=1000.0,
        min_power_limit_w=200.0,  # assumed (the Hopper boards' floor)
        idle_w=140.0,  # assumed: twice a Hopper board's (two dies, 8 HBM3e stacks); not measured
        max_sm_clock_mhz=1965,  # assumed (third-party listings give 1.96-1.98 GHz boost); not NVIDIA's
        min_sm_clock_mhz=345,
        mem_clock_mhz=3996,  # assumed (not published); only reported in samples
        memory_bytes=180 * 10**9,  # HGX/DGX B200: 1,440 GB over 8 GPUs (datasheet capacity, not NVML's)
        fp8_tflops=4500.0,
        num_sms=148,
        source=(
            "NVIDIA HGX B200 / DGX B200 datasheet (1,000 W per GPU): 72 PFLOPS FP8 and 36 PFLOPS BF16 "
            "per 8 GPUs with sparsity -> 4,500 / 2,250 TFLOPS dense per GPU; 64 TB/s HBM3e per 8 GPUs"
        ),
        validated=False,
    ),
    "gb200": GpuSpec(
        key="gb200",
        name="NVIDIA GB200",
        bf16_tflops=2500.0,
        hbm_tb_s=8.0,
        tdp_w=1200.0,
        min_power_limit_w=200.0,  # assumed
        idle_w=140.0,  # assumed, as b200
        max_sm_clock_mhz=1965,  # assumed, as b200
        min_sm_clock_mhz=345,
        mem_clock_mhz=3996,  # assumed (not published); only reported in samples
        memory_bytes=186 * 10**9,  # GB200 NVL72: 13.4 TB HBM3e over 72 GPUs (datasheet capacity)
        fp8_tflops=5000.0,
        num_sms=148,
        source=(
            "NVIDIA GB200 NVL72 datasheet, per GPU (rack figures / 72): 720 PFLOPS FP8 and 360 PFLOPS "
            "BF16 with sparsity -> 5,000 / 2,500 TFLOPS dense; 576 TB/s -> 8 TB/s; the 1,200 W GPU "
            "TDP is the GB200 configuration NVIDIA's Blackwell architecture figures are quoted at"
        ),
        validated=False,
    ),
}

#: the precisions the GPU model runs: (bytes per weight, bytes per KV element); activations and
#: all-reduces stay bf16 (FP8 deployments such as vLLM's ``--quantization fp8 --kv-cache-dtype fp8``)
DTYPES: dict[str, tuple[int, int]] = {"bf16": (2, 2), "fp8": (1, 1)}
#: the precisions the model was checked against measurements with (every published row is bf16/fp16)
VALIDATED_DTYPES = frozenset({"bf16"})


def check_dtype(dtype: str) -> str:
    """``dtype`` when the model runs it; DeviceValueError naming the allowed ones otherwise."""
    if dtype not in DTYPES:
        raise DeviceValueError(f"unknown dtype {dtype!r}; allowed: {', '.join(DTYPES)}")
    return dtype


def fidelity(gpu: str | GpuSpec, dtype: str = "bf16") -> tuple[bool, str | None]:
    """Whether figures the model computes on ``gpu`` with ``dtype`` are validated, and if not, the
    note saying why ("unvalidated": a GPU or precision no measurement checked the model on)."""
    spec = gpu_spec(gpu)
    why = []
    if not spec.validated:
        why.append(f"{spec.name} (peaks from {spec.source.split(':')[0]})")
    if check_dtype(dtype) not in VALIDATED_DTYPES:
        why.append(f"{dtype} weights and KV")
    if not why:
        return True, None
    return False, "unvalidated: the GPU model was never checked against measurements on " + " with ".join(why)


def dtype_of_name(name: str | None) -> str:
    """The modeled dtype an emulated GPU's reported name carries (``"NVIDIA H200 (emulated, fp8,
    unvalidated)"`` -> ``fp8``); ``bf16`` for every other name (a measured GPU's figures are what it ran)."""
    if not name or " (" not in name:
        return "bf16"
    words = {w.strip(" )") for w in name.split(" (", 1)[1].split(",")}
    return next((d for d in DTYPES if d in words and d != "bf16"), "bf16")


def gpu_spec_for_name(name: str | None) -> GpuSpec | None:
    """The spec whose NVML name ``name`` is (a device's reported name; ``' (simulated)'`` and
    similar suffixes ignored), or None when the GPU is not one the model knows."""
    if not name:
        return None
    base = name.split(" (")[0].strip().lower()
    for spec in GPU_SPECS.values():
        if spec.name.lower() == base:
            return spec
    for spec in GPU_SPECS.values():  # e.g. "NVIDIA H200 NVL", "NVIDIA B200 SXM"
        if base.startswith(spec.name.lower() + " "):
            return spec
    return None


def gpu_spec(gpu: str | GpuSpec) -> GpuSpec:
    """Return the spec of ``gpu`` (a key such as ``"h100-sxm"``, or a spec passed through)."""
    if isinstance(gpu, GpuSpec):
        return gpu
    try:
        return GPU_SPECS[gpu]
    except KeyError:
        raise DeviceValueError(f"unknown emulated GPU {gpu!r}; allowed: {', '.join(GPU_SPECS)}") from None
