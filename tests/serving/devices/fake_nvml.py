"""A scripted stand-in for ``pynvml``: the functions and constants serving.devices.nvml uses.

Each :class:`FakeGpu` holds what the "hardware" reports and how it misbehaves (unsupported
functions, errors by function name, falling off the bus after N calls). Every call on a GPU is
recorded in ``FakeGpu.calls`` so tests can assert what was (not) called.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

# Same values as pynvml.
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}

SM_UTIL, SM_OCCUPANCY, ANY_TENSOR_UTIL, DRAM_BW_UTIL = 2, 3, 5, 10


class NVMLError(Exception):
    """Like ``pynvml.NVMLError``: the NVML return code is in ``.value``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML error {self.value}")


@dataclass
class FakeGpu:
    """One scripted GPU. Units as NVML reports them (mW, mJ, MHz, bytes)."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-11111111-2222-3333-4444-555555555555"
    util_gpu_pct: int = 87
    util_mem_pct: int = 41
    power_mw: int = 412_345
    energy_mj: int = 9_000_000
    limit_mw: int = 700_000
    min_limit_mw: int = 200_000
    max_limit_mw: int = 700_000
    default_limit_mw: int = 700_000
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    temperature_c: int = 54
    mem_total_bytes: int = 80 * 2**30
    mem_used_bytes: int = 61 * 2**30
    clock_event_reasons: int = 0x4  # SW power cap
    supported_mem_clocks_mhz: list[int] = field(default_factory=lambda: [2619, 1593])
    supported_sm_clocks_mhz: list[int] = field(default_factory=lambda: list(range(1980, 344, -15)))
    gpm_supported: bool = True
    gpm_pct: dict[int, float] = field(
        default_factory=lambda: {SM_UTIL: 23.5, SM_OCCUPANCY: 11.25, ANY_TENSOR_UTIL: 7.0, DRAM_BW_UTIL: 64.0}
    )
    unsupported: set[str] = field(default_factory=set)  # function names -> NOT_SUPPORTED
    errors: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code
    lost_after_calls: int | None = None  # every call after this many raises GPU_IS_LOST
    locked_clocks_mhz: tuple[int, int] | None = None
    calls: list[str] = field(default_factory=list)

    def called(self, fn_name: str) -> int:
        """How many times ``fn_name`` was called on this GPU."""
        return self.calls.count(fn_name)


class FakeGpmMetricsGet:
    """Stand-in for ``pynvml.c_nvmlGpmMetricsGet_t``."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=-1, value=0.0) for _ in range(16)]


class FakeNvml:
    """A ``pynvml``-like module over a list of :class:`FakeGpu`."""

    NVMLError = NVMLError
    c_nvmlGpmMetricsGet_t = FakeGpmMetricsGet
    NVML_SUCCESS = NVML_SUCCESS
    NVML_ERROR_INVALID_ARGUMENT = NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = SM_UTIL
    NVML_GPM_METRIC_SM_OCCUPANCY = SM_OCCUPANCY
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = ANY_TENSOR_UTIL
    NVML_GPM_METRIC_DRAM_BW_UTIL = DRAM_BW_UTIL

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.init_refs = 0
        self.inits = 0
        self.live_gpm_samples = 0
        self._ticks = itertools.count(1)

    # --- plumbing ------------------------------------------------------------------------------

    def _use(self, gpu: FakeGpu, fn_name: str) -> FakeGpu:
        if self.init_refs <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        gpu.calls.append(fn_name)
        if gpu.lost_after_calls is not None and len(gpu.calls) > gpu.lost_after_calls:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if fn_name in gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if fn_name in gpu.errors:
            raise NVMLError(gpu.errors[fn_name])
        return gpu

    # --- library -------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.init_refs += 1
        self.inits += 1

    def nvmlShutdown(self) -> None:
        if self.init_refs <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self.init_refs -= 1

    def nvmlDeviceGetCount(self) -> int:
        if self.init_refs <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._use(self.gpus[index], "nvmlDeviceGetHandleByIndex")

    # --- identity and telemetry ----------------------------------------------------------------

    def nvmlSystemGetDriverVersion(self) -> str:
        if self.init_refs <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return "570.133.20"

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return self._use(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> bytes:
        return self._use(h, "nvmlDeviceGetUUID").uuid.encode()  # old bindings return bytes

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> SimpleNamespace:
        g = self._use(h, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=g.util_gpu_pct, memory=g.util_mem_pct)

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> SimpleNamespace:
        g = self._use(h, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(
            total=g.mem_total_bytes, used=g.mem_used_bytes, free=g.mem_total_bytes - g.mem_used_bytes
        )

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return self._use(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        return self._use(h, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        return self._use(h, "nvmlDeviceGetEnforcedPowerLimit").limit_mw

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, clock_type: int) -> int:
        g = self._use(h, "nvmlDeviceGetClockInfo")
        return {self.NVML_CLOCK_SM: g.sm_clock_mhz, self.NVML_CLOCK_MEM: g.mem_clock_mhz}[clock_type]

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._use(h, "nvmlDeviceGetTemperature").temperature_c

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        return self._use(h, "nvmlDeviceGetCurrentClocksEventReasons").clock_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeGpu) -> int:
        return self._use(h, "nvmlDeviceGetCurrentClocksThrottleReasons").clock_event_reasons

    # --- GPM -------------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, h: FakeGpu) -> SimpleNamespace:
        g = self._use(h, "nvmlGpmQueryDeviceSupport")
        return SimpleNamespace(version=1, isSupportedDevice=int(g.gpm_supported))

    def nvmlGpmSampleAlloc(self) -> SimpleNamespace:
        self.live_gpm_samples += 1
        return SimpleNamespace(gpu=None, tick=None)

    def nvmlGpmSampleFree(self, sample: SimpleNamespace) -> None:
        self.live_gpm_samples -= 1

    def nvmlGpmSampleGet(self, h: FakeGpu, sample: SimpleNamespace) -> SimpleNamespace:
        g = self._use(h, "nvmlGpmSampleGet")
        if not g.gpm_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        sample.gpu, sample.tick = g, next(self._ticks)
        return sample

    def nvmlGpmMetricsGet(self, request: FakeGpmMetricsGet) -> FakeGpmMetricsGet:
        s1, s2 = request.sample1, request.sample2
        if request.version != 1 or s1.tick is None or s2.tick is None or s1.gpu is not s2.gpu:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if s1.tick >= s2.tick:  # sample1 must be the older one
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        g = self._use(s2.gpu, "nvmlGpmMetricsGet")
        for metric in request.metrics[: request.numMetrics]:
            value = g.gpm_pct.get(metric.metricId)
            metric.nvmlReturn = NVML_SUCCESS if value is not None else NVML_ERROR_NOT_SUPPORTED
            metric.value = value if value is not None else 0.0
        return request

    # --- knobs -----------------------------------------------------------------------------------

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: FakeGpu) -> list[int]:
        g = self._use(h, "nvmlDeviceGetPowerManagementLimitConstraints")
        return [g.min_limit_mw, g.max_limit_mw]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: FakeGpu) -> int:
        return self._use(h, "nvmlDeviceGetPowerManagementDefaultLimit").default_limit_mw

    def nvmlDeviceGetPowerManagementLimit(self, h: FakeGpu) -> int:
        return self._use(h, "nvmlDeviceGetPowerManagementLimit").limit_mw

    def nvmlDeviceSetPowerManagementLimit(self, h: FakeGpu, limit_mw: int) -> None:
        g = self._use(h, "nvmlDeviceSetPowerManagementLimit")
        if not g.min_limit_mw <= limit_mw <= g.max_limit_mw:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        g.limit_mw = limit_mw

    def nvmlDeviceGetSupportedMemoryClocks(self, h: FakeGpu) -> list[int]:
        return list(self._use(h, "nvmlDeviceGetSupportedMemoryClocks").supported_mem_clocks_mhz)

    def nvmlDeviceGetSupportedGraphicsClocks(self, h: FakeGpu, mem_clock_mhz: int) -> list[int]:
        g = self._use(h, "nvmlDeviceGetSupportedGraphicsClocks")
        if mem_clock_mhz not in g.supported_mem_clocks_mhz:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return list(g.supported_sm_clocks_mhz)

    def nvmlDeviceSetGpuLockedClocks(self, h: FakeGpu, min_mhz: int, max_mhz: int) -> None:
        self._use(h, "nvmlDeviceSetGpuLockedClocks").locked_clocks_mhz = (min_mhz, max_mhz)

    def nvmlDeviceResetGpuLockedClocks(self, h: FakeGpu) -> None:
        self._use(h, "nvmlDeviceResetGpuLockedClocks").locked_clocks_mhz = None


class LegacyFakeNvml(FakeNvml):
    """Bindings older than NVML 12.x: no ``nvmlDeviceGetCurrentClocksEventReasons``."""

    nvmlDeviceGetCurrentClocksEventReasons = None
