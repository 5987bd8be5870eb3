"""The Device interface: one consistent sample per tick, and the power/clock knobs.

Every implementation (NVML, CPU, emulated GPU) reports a :class:`DeviceSample`. A metric the
device cannot measure is ``None`` -- never a string such as ``'N/A'`` and never a crash.
Knobs a device does not have raise :class:`DeviceNotSupportedError`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Literal, TypeVar

from serving.devices.errors import DeviceNotSupportedError

DeviceKind = Literal["cpu", "cuda", "emulated"]
Phase = Literal["prefill", "decode", "mixed", "idle"]
T = TypeVar("T")


@dataclass(slots=True)
class DeviceSample:
    """One snapshot of a device, taken at ``ts_s`` (epoch seconds, UTC).

    Percentages are 0-100. ``lost`` is True once the device has fallen off the bus; all metrics
    are then ``None``.

    An emulated device's samples are :class:`EmulatedSample` s (more fields).
    """

    ts_s: float
    device: str
    kind: DeviceKind
    index: int | None
    name: str
    uuid: str | None
    emulated: bool
    gpu_util_pct: float | None = None
    mem_util_pct: float | None = None
    sm_active_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_active_pct: float | None = None
    dram_active_pct: float | None = None
    power_w: float | None = None
    energy_mj: int | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    temperature_c: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    clock_event_reasons: int | None = None
    locked_sm_clock_min_mhz: int | None = None
    locked_sm_clock_max_mhz: int | None = None
    lost: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Return the sample as a flat, JSON-able dict keyed by field name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(slots=True)
class EmulatedSample(DeviceSample):
    """A sample of an emulated GPU: the :class:`DeviceSample` fields plus what makes it trustworthy.

    ``window_s`` is the trailing window the ``*_pct``, ``power_w``, ``sm_clock_mhz`` and
    ``host_bound_pct`` means cover. The ``*_total`` fields are monotonic counters since the device
    was opened, over ``uptime_s`` seconds of its clock, so any reader differences two samples for
    exact means over its own interval (``Δbusy_s_total / Δuptime_s`` is the utilization,
    ``Δenergy_mj / Δuptime_s`` the power). ``host_bound_pct`` is the share of the iterations
    finished in the window whose host time ran past the modeled GPU time, i.e. that were not paced
    (``None`` when none finished in it). See docs/EMULATION.md.
    """

    window_s: float | None = None
    uptime_s: float | None = None
    busy_s_total: float | None = None
    sm_active_s_total: float | None = None
    sm_occupancy_s_total: float | None = None
    tensor_active_s_total: float | None = None
    dram_active_s_total: float | None = None
    mem_active_s_total: float | None = None
    iterations_total: int | None = None
    paced_iterations_total: int | None = None
    lagged_iterations_total: int | None = None
    lag_s_total: float | None = None
    modeled_s_total: float | None = None
    host_bound_pct: float | None = None


@dataclass(frozen=True, slots=True)
class PowerLimitConstraints:
    """The power limits a device accepts, in watts."""

    min_w: float
    max_w: float
    default_w: float


@dataclass(frozen=True, slots=True)
class IterationWork:
    """What one serving-engine iteration ran on the device."""

    phase: Phase
    prefill_tokens: int
    decode_seqs: int
    context_tokens: int  # sum of the context lengths attended by the iteration
    batch_size: int
    attention_pairs: int = 0  # (query token, key token) pairs attended, summed over sequences
    sampled_seqs: int = 0  # sequences that sampled a token (rows through the LM head)


@dataclass(frozen=True, slots=True)
class IterationTiming:
    """How a device accounted the iteration it last heard about (emulated devices only).

    ``modeled_s``: the modeled GPU time of the iteration. ``lag_s``: host time beyond the modeled
    time (the host finished after the modeled GPU would have); 0 when the iteration was paced.
    ``flops``/``hbm_bytes``: the modeled work's count on one rank (serving/devices/roofline.py).
    """

    modeled_s: float
    lag_s: float
    flops: float | None = None
    hbm_bytes: float | None = None


class Device(ABC):
    """A device a worker runs on: telemetry through :meth:`snapshot`, plus power/clock knobs.

    Knob methods raise :class:`DeviceNotSupportedError` unless an implementation overrides them.
    """

    @property
    @abstractmethod
    def spec(self) -> str:
        """The device spec string, e.g. ``"cuda:0"``, ``"cpu"``, ``"emulated:h100-sxm"``."""

    @property
    @abstractmethod
    def kind(self) -> DeviceKind:
        """``"cpu"``, ``"cuda"`` or ``"emulated"``."""

    @property
    @abstractmethod
    def torch_device(self) -> str:
        """The device string to pass to torch, e.g. ``"cpu"`` or ``"cuda:0"``."""

    @property
    def is_emulated(self) -> bool:
        """True when the counters are modeled rather than measured."""
        return self.kind == "emulated"

    @abstractmethod
    def snapshot(self) -> DeviceSample:
        """Take one consistent sample of every metric the device exposes."""

    # --- knobs (unsupported unless overridden) ---------------------------------------------

    def _unsupported(self, what: str) -> DeviceNotSupportedError:
        return DeviceNotSupportedError(f"{self.spec} does not support {what}")

    def power_limit_constraints_w(self) -> PowerLimitConstraints:
        """Return the min, max and default power limit in watts."""
        raise self._unsupported("power limits")

    def power_limit_w(self) -> float:
        """Return the current power limit in watts."""
        raise self._unsupported("power limits")

    def set_power_limit_w(self, limit_w: float) -> None:
        """Set the power limit in watts (validated against the constraints first)."""
        raise self._unsupported("setting the power limit")

    def reset_power_limit(self) -> None:
        """Restore the default power limit."""
        raise self._unsupported("setting the power limit")

    def sm_clock_range_mhz(self) -> tuple[int, int] | None:
        """Return the locked SM clock range in MHz, or ``None`` when clocks are not locked."""
        raise self._unsupported("SM clock locking")

    def supported_sm_clocks_mhz(self) -> list[int]:
        """Return the SM clocks the device supports, in MHz, ascending."""
        raise self._unsupported("SM clock locking")

    def set_sm_clock_range_mhz(self, min_mhz: int, max_mhz: int) -> None:
        """Lock the SM clock to ``[min_mhz, max_mhz]``."""
        raise self._unsupported("SM clock locking")

    def reset_sm_clocks(self) -> None:
        """Unlock the SM clocks."""
        raise self._unsupported("SM clock locking")

    def _gpu_name(self) -> str:
        """The GPU's name as NVML reports it (an emulated one's ends in ``(emulated)``)."""
        return getattr(self, "_name", None) or getattr(self, "name", None) or self.snapshot().name

    def driver_version(self) -> str | None:
        """The driver that runs the device (NVML's system driver version); ``None`` where there is none."""
        return None

    def knobs(self) -> dict[str, Any]:
        """Return current knob values and bounds as a JSON-able dict; ``None`` where unsupported.

        ``supported_sm_clocks_mhz`` lists every settable SM clock (a calibration sweep picks its
        clock windows from it, so it never tries one the device would refuse); ``gpu_name`` and
        ``driver_version`` identify what a calibration was measured on."""
        constraints = _or_none(self.power_limit_constraints_w)
        supported = _or_none(self.supported_sm_clocks_mhz) or None
        locked = _or_none(self.sm_clock_range_mhz)
        return {
            "device": self.spec,
            "gpu_name": None if self.kind == "cpu" else self._gpu_name(),
            "driver_version": self.driver_version(),
            "emulated": self.is_emulated,
            "power_limit_w": _or_none(self.power_limit_w),
            "power_limit_min_w": constraints.min_w if constraints else None,
            "power_limit_max_w": constraints.max_w if constraints else None,
            "power_limit_default_w": constraints.default_w if constraints else None,
            "locked_sm_clock_min_mhz": locked[0] if locked else None,
            "locked_sm_clock_max_mhz": locked[1] if locked else None,
            "supported_sm_clock_min_mhz": supported[0] if supported else None,
            "supported_sm_clock_max_mhz": supported[-1] if supported else None,
            "supported_sm_clocks_mhz": list(supported) if supported else None,
        }

    # --- lifecycle and engine hook -------------------------------------------------------------

    def on_iteration(self, work: IterationWork, started_s: float, elapsed_s: float) -> float:
        """Hear about one engine iteration; return the seconds of extra pacing applied (none here)."""
        return 0.0

    def last_iteration_timing(self) -> IterationTiming | None:
        """The modeled time and lag of the last iteration; ``None`` when the device measures, not models."""
        return None

    def emulation_counters(self) -> dict[str, Any] | None:
        """Pacing and lag counters of an emulated device as a JSON-able dict; ``None`` on measured devices."""
        return None

    def close(self) -> None:
        """Release vendor resources. Safe to call more than once; nothing to release here."""
        return None

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"


class CudaIndexDevice(Device):
    """A CUDA GPU named by its index ``_index``: spec and torch device ``cuda:<index>``."""

    _index: int

    @property
    def spec(self) -> str:
        return f"cuda:{self._index}"

    @property
    def kind(self) -> DeviceKind:
        return "cuda"

    @property
    def torch_device(self) -> str:
        return f"cuda:{self._index}"


def _or_none(getter: Callable[[], T]) -> T | None:
    """Call a knob getter; an unsupported knob reads as ``None``."""
    try:
        return getter()
    except DeviceNotSupportedError:
        return None
