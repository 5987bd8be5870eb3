"""Real NVIDIA GPUs through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Every NVML call goes through :meth:`NvmlDevice._call`, which translates ``pynvml.NVMLError`` into the
project's errors; a metric the GPU does not support reads as ``None``. Tests inject a fake module
through the ``nvml=`` arguments; the default is the real ``pynvml``, imported lazily.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from typing import Any

from serving.devices.base import CudaIndexDevice, DeviceSample, PowerLimitConstraints
from serving.devices.errors import (
    DeviceError,
    DeviceLostError,
    DeviceNotFoundError,
    DeviceNotSupportedError,
    DevicePermissionError,
    DeviceValueError,
)

# DeviceSample field <- pynvml GPM metric constant (Hopper and newer).
_GPM_METRICS: tuple[tuple[str, str], ...] = (
    ("sm_active_pct", "NVML_GPM_METRIC_SM_UTIL"),
    ("sm_occupancy_pct", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("tensor_active_pct", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("dram_active_pct", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
)
_NO_GPM: dict[str, float | None] = dict.fromkeys(name for name, _ in _GPM_METRICS)
_ROOT_HINT = "no permission: changing GPU power limits and clocks needs root (run as root or ask an admin)"


def _import_pynvml() -> Any:
    import pynvml

    return pynvml


def _resolve(nvml: Any | None) -> Any:
    return nvml if nvml is not None else _import_pynvml()


@functools.cache
def _probe(nvml: Any) -> tuple[int, str]:
    """Initialise NVML once per module and count GPUs: the count and what NVML said (0 and why
    when NVML cannot start)."""
    try:
        nvml.nvmlInit()
    except (nvml.NVMLError, OSError) as e:
        return 0, f"NVML could not start ({e}): no NVIDIA driver or GPU here"
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as e:
        return 0, f"NVML started but could not count GPUs ({e})"
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    return count, f"NVML sees {count} GPU(s)" if count else "NVML sees no GPU"


def _probed(nvml: Any | None) -> tuple[int, str]:
    try:
        module = _resolve(nvml)
    except ImportError as e:
        return 0, f"NVML not available: the nvidia-ml-py package is not installed ({e})"
    return _probe(module)


def nvml_device_count(nvml: Any | None = None) -> int:
    """Return how many GPUs NVML sees (0 without a driver or without ``pynvml``). Cached."""
    return _probed(nvml)[0]


def nvml_status(nvml: Any | None = None) -> str:
    """What NVML said when probed, in a sentence: how many GPUs it sees, or why it sees none (no
    ``pynvml``, no driver or library, no GPU). Cached; never raises."""
    return _probed(nvml)[1]


def nvml_available(nvml: Any | None = None) -> bool:
    """Return True when NVML initialises and sees at least one GPU. Cached; never raises."""
    return nvml_device_count(nvml) > 0


def _translate(nvml: Any, err: Exception, where: str) -> DeviceError:
    """Map an ``NVMLError`` to the project's error class, keeping NVML's own message."""
    cls, hint = {
        nvml.NVML_ERROR_NOT_SUPPORTED: (DeviceNotSupportedError, "not supported by this GPU or driver"),
        nvml.NVML_ERROR_FUNCTION_NOT_FOUND: (DeviceNotSupportedError, "not available in this driver"),
        nvml.NVML_ERROR_NO_PERMISSION: (DevicePermissionError, _ROOT_HINT),
        nvml.NVML_ERROR_GPU_IS_LOST: (DeviceLostError, "the GPU is lost (fell off the bus)"),
        nvml.NVML_ERROR_INVALID_ARGUMENT: (DeviceValueError, "NVML rejected an argument"),
        nvml.NVML_ERROR_DRIVER_NOT_LOADED: (DeviceNotFoundError, "no NVIDIA driver is loaded"),
        nvml.NVML_ERROR_LIBRARY_NOT_FOUND: (DeviceNotFoundError, "the NVML library is not installed"),
    }.get(getattr(err, "value", None), (DeviceError, "NVML call failed"))
    return cls(f"{where}: {hint} [NVML: {err}]")


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _mw_to_w(milliwatts: int | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1000.0


class NvmlDevice(CudaIndexDevice):
    """GPU number ``index`` as NVML sees it (spec ``cuda:<index>``)."""

    def __init__(self, index: int, *, nvml: Any | None = None) -> None:
        try:
            self._nvml = _resolve(nvml)
        except ImportError as e:
            raise DeviceNotFoundError("cuda devices need nvidia-ml-py (import pynvml failed)") from e
        self._index = index
        self._lost = False
        self._closed = False
        self._locked_sm_mhz: tuple[int, int] | None = None
        self._supported_sm_mhz: list[int] | None = None
        self._gpm_supported: bool | None = None  # decided on the first snapshot
        self._gpm_samples: list[Any] = []  # [previous, scratch]
        self._gpm_have_prev = False
        n = self._nvml
        self._call(n.nvmlInit, optional=False)
        try:
            count = self._call(n.nvmlDeviceGetCount, optional=False)
            if not 0 <= index < count:
                raise DeviceNotFoundError(f"{self.spec} not found: NVML sees {count} GPU(s)")
            self._handle = self._call(n.nvmlDeviceGetHandleByIndex, index, optional=False)
            self._name = _text(self._call(n.nvmlDeviceGetName, self._handle)) or "NVIDIA GPU"
            self._uuid = _text(self._call(n.nvmlDeviceGetUUID, self._handle))
        except DeviceError:
            with contextlib.suppress(n.NVMLError):
                n.nvmlShutdown()
            raise
        # Event reasons superseded throttle reasons in NVML 12.x; older bindings only have the latter.
        self._clock_reasons = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if self._clock_reasons is None:
            self._clock_reasons = n.nvmlDeviceGetCurrentClocksThrottleReasons

    # --- identity ----------------------------------------------------------------------------

    @property
    def index(self) -> int:
        """The NVML (and CUDA) device index."""
        return self._index

    @property
    def lost(self) -> bool:
        """True once NVML reported the GPU lost; no NVML call is made for it afterwards."""
        return self._lost

    # --- the one query path --------------------------------------------------------------------

    def _call(self, fn: Callable[..., Any], *args: Any, optional: bool = True) -> Any:
        """Call NVML; unsupported -> ``None`` if ``optional``; every other error is translated."""
        if self._lost:
            raise DeviceLostError(f"{self.spec} is lost; not calling NVML again")
        try:
            return fn(*args)
        except self._nvml.NVMLError as e:
            err = _translate(self._nvml, e, f"{self.spec} {getattr(fn, '__name__', fn)}")
            if isinstance(err, DeviceLostError):
                self._lost = True
            if optional and isinstance(err, DeviceNotSupportedError):
                return None
            raise err from e

    # --- telemetry ------------------------------------------------------------------------------

    def snapshot(self) -> DeviceSample:
        """Read every metric once; a lost GPU yields a sample with ``lost=True`` and no metrics."""
        ts_s = time.time()
        if not self._lost:
            with contextlib.suppress(DeviceLostError):
                return self._read(ts_s)
        return self._sample(ts_s, lost=True)

    def _sample(self, ts_s: float, **metrics: Any) -> DeviceSample:
        return DeviceSample(
            ts_s=ts_s,
            device=self.spec,
            kind="cuda",
            index=self._index,
            name=self._name,
            uuid=self._uuid,
            emulated=False,
            **metrics,
        )

    def _read(self, ts_s: float) -> DeviceSample:
        n, h = self._nvml, self._handle
        util = self._call(n.nvmlDeviceGetUtilizationRates, h)
        mem = self._call(n.nvmlDeviceGetMemoryInfo, h)
        locked = self._locked_sm_mhz
        return self._sample(
            ts_s,
            gpu_util_pct=getattr(util, "gpu", None),
            mem_util_pct=getattr(util, "memory", None),
            power_w=_mw_to_w(self._call(n.nvmlDeviceGetPowerUsage, h)),
            energy_mj=self._call(n.nvmlDeviceGetTotalEnergyConsumption, h),
            power_limit_w=_mw_to_w(self._call(n.nvmlDeviceGetEnforcedPowerLimit, h)),
            sm_clock_mhz=self._call(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
            mem_clock_mhz=self._call(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM),
            temperature_c=self._call(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU),
            mem_used_bytes=getattr(mem, "used", None),
            mem_total_bytes=getattr(mem, "total", None),
            clock_event_reasons=self._call(self._clock_reasons, h),
            locked_sm_clock_min_mhz=locked[0] if locked else None,
            locked_sm_clock_max_mhz=locked[1] if locked else None,
            **self._gpm_metrics(),
        )

    def _gpm_ready(self) -> bool:
        """Decide GPM support once per device and allocate the two sample buffers."""
        if self._gpm_supported is None:
            support = self._call(self._nvml.nvmlGpmQueryDeviceSupport, self._handle)
            self._gpm_supported = bool(support is not None and support.isSupportedDevice)
            if self._gpm_supported:
                samples = [self._call(self._nvml.nvmlGpmSampleAlloc) for _ in range(2)]
                self._gpm_samples = [s for s in samples if s is not None]
                self._gpm_supported = len(self._gpm_samples) == 2
        return self._gpm_supported

    def _gpm_metrics(self) -> dict[str, float | None]:
        """GPM metrics between the previous snapshot and this one; ``None`` on the first."""
        if not self._gpm_ready():
            return _NO_GPM
        prev, scratch = self._gpm_samples
        if self._call(self._nvml.nvmlGpmSampleGet, self._handle, scratch) is None:
            self._gpm_have_prev = False
            return _NO_GPM
        values = self._gpm_between(prev, scratch) if self._gpm_have_prev else _NO_GPM
        self._gpm_samples = [scratch, prev]  # the sample just taken is the next one's baseline
        self._gpm_have_prev = True
        return values

    def _gpm_between(self, older: Any, newer: Any) -> dict[str, float | None]:
        n = self._nvml
        request = n.c_nvmlGpmMetricsGet_t()
        request.version = n.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(_GPM_METRICS)
        request.sample1, request.sample2 = older, newer
        for i, (_, constant) in enumerate(_GPM_METRICS):
            request.metrics[i].metricId = getattr(n, constant)
        if self._call(n.nvmlGpmMetricsGet, request) is None:
            return _NO_GPM
        return {
            name: float(request.metrics[i].value) if request.metrics[i].nvmlReturn == n.NVML_SUCCESS else None
            for i, (name, _) in enumerate(_GPM_METRICS)
        }

    # --- knobs ---------------------------------------------------------------------------------

    def driver_version(self) -> str | None:
        """The NVIDIA driver version (``nvmlSystemGetDriverVersion``), ``None`` when NVML has none."""
        fn = getattr(self._nvml, "nvmlSystemGetDriverVersion", None)
        return None if fn is None else _text(self._call(fn))

    def power_limit_constraints_w(self) -> PowerLimitConstraints:
        n, h = self._nvml, self._handle
        min_mw, max_mw = self._call(n.nvmlDeviceGetPowerManagementLimitConstraints, h, optional=False)
        default_mw = self._call(n.nvmlDeviceGetPowerManagementDefaultLimit, h, optional=False)
        return PowerLimitConstraints(min_w=min_mw / 1000, max_w=max_mw / 1000, default_w=default_mw / 1000)

    def power_limit_w(self) -> float:
        return self._call(self._nvml.nvmlDeviceGetPowerManagementLimit, self._handle, optional=False) / 1000

    def set_power_limit_w(self, limit_w: float) -> None:
        bounds = self.power_limit_constraints_w()
        if not bounds.min_w <= limit_w <= bounds.max_w:
            raise DeviceValueError.out_of_range(
                f"{self.spec} power limit", limit_w, bounds.min_w, bounds.max_w, "W"
            )
        self._set_power_limit_mw(round(limit_w * 1000))

    def reset_power_limit(self) -> None:
        self._set_power_limit_mw(round(self.power_limit_constraints_w().default_w * 1000))

    def _set_power_limit_mw(self, limit_mw: int) -> None:
        self._call(self._nvml.nvmlDeviceSetPowerManagementLimit, self._handle, limit_mw, optional=False)

    def sm_clock_range_mhz(self) -> tuple[int, int] | None:
        """The range set through this object (NVML cannot read it back portably)."""
        return self._locked_sm_mhz

    def supported_sm_clocks_mhz(self) -> list[int]:
        if self._supported_sm_mhz is None:
            n, h = self._nvml, self._handle
            mem_clocks = self._call(n.nvmlDeviceGetSupportedMemoryClocks, h, optional=False)
            if not mem_clocks:
                raise self._unsupported("SM clock locking (no supported memory clocks)")
            sm = self._call(n.nvmlDeviceGetSupportedGraphicsClocks, h, max(mem_clocks), optional=False)
            self._supported_sm_mhz = sorted(set(sm))
        return list(self._supported_sm_mhz)

    def set_sm_clock_range_mhz(self, min_mhz: int, max_mhz: int) -> None:
        if min_mhz > max_mhz:
            raise DeviceValueError(f"{self.spec} SM clock range [{min_mhz}, {max_mhz}] MHz has min > max")
        clocks = self.supported_sm_clocks_mhz()
        for value in (min_mhz, max_mhz):
            if not clocks[0] <= value <= clocks[-1]:
                raise DeviceValueError.out_of_range(
                    f"{self.spec} SM clock", value, clocks[0], clocks[-1], "MHz"
                )
        n = self._nvml
        self._call(n.nvmlDeviceSetGpuLockedClocks, self._handle, int(min_mhz), int(max_mhz), optional=False)
        self._locked_sm_mhz = (int(min_mhz), int(max_mhz))

    def reset_sm_clocks(self) -> None:
        self._call(self._nvml.nvmlDeviceResetGpuLockedClocks, self._handle, optional=False)
        self._locked_sm_mhz = None

    # --- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Free GPM buffers and release this object's NVML reference. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for sample in self._gpm_samples if not self._lost else []:
            with contextlib.suppress(DeviceError):
                self._call(self._nvml.nvmlGpmSampleFree, sample)
        self._gpm_samples = []
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()
