"""The emulated GPU (``emulated:<gpu>``): a roofline + DVFS power model behind the Device interface.

Two layers:

* :func:`predict_iteration` -- a pure function: the modeled time, power, SM clock and activities of
  one engine iteration (:class:`~serving.devices.base.IterationWork`) of a model shape
  (:class:`~serving.config.ModelConfig`, bf16) on a GPU (:mod:`serving.devices.gpu_specs`), under a
  power limit and/or a locked SM clock range. Analytics can call it without a device.
* :class:`EmulatedDevice` -- a :class:`~serving.devices.base.Device` that the serving engine drives:
  :meth:`EmulatedDevice.on_iteration` models each iteration the engine ran (the real math runs on
  the host CPU), sleeps until the modeled GPU would have finished (so wall time is paced to the
  modeled GPU), keeps a short history of modeled busy intervals (:mod:`serving.devices.emulated_timeline`,
  which integrates the counters), and reports NVML-like counters through
  :meth:`EmulatedDevice.snapshot` with the same knobs, bounds and errors as the NVML path. Its label,
  fidelity and UUID are :mod:`serving.devices.emulated_label`'s.

The equations, the constants and their calibration against H200 measurements are in
``docs/EMULATION.md``; the model itself is :mod:`serving.devices.gpu_model`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from serving.config import ModelConfig, preset
from serving.devices.base import (
    Device,
    DeviceKind,
    EmulatedSample,
    IterationTiming,
    IterationWork,
    PowerLimitConstraints,
)
from serving.devices.emulated_label import emulated_uuid, emulation_fidelity
from serving.devices.emulated_timeline import BusyInterval, BusyTimeline
from serving.devices.errors import DeviceValueError
from serving.devices.gpu_model import (
    BF16_BYTES,
    CONTEXT_BYTES,
    DEFAULT_CONSTANTS,
    DEFAULT_PROFILE,
    PROFILES,
    Bound,
    EmulationConstants,
    EngineProfile,
    IterationEstimate,
    LinkSpec,
    engine_profile,
    estimate_at_clock,
    gap_energy_j,
    gap_power_w,
    gap_sm_clock_mhz,
    predict_iteration,
    shard_shape,
)
from serving.devices.gpu_specs import DTYPES, GpuSpec, gpu_spec

__all__ = [
    "BF16_BYTES",
    "DEFAULT_CONSTANTS",
    "DEFAULT_PROFILE",
    "PROFILES",
    "Bound",
    "EmulatedDevice",
    "EmulationConstants",
    "EmulationStats",
    "EngineProfile",
    "IterationEstimate",
    "estimate_at_clock",
    "gap_energy_j",
    "gap_power_w",
    "gap_sm_clock_mhz",
    "predict_iteration",
]

_SPIN_S = 3e-4  # the last stretch of a real-time pacing sleep is a spin: time.sleep overshoots
_MAX_HOOK_DELAY_S = 0.05  # started_s is trusted when it is at most this much older than elapsed_s says
SAMPLE_WINDOW_S = 0.1  # default trailing window of a snapshot's means (NVML-like sample period)
_CONTEXT_BYTES = CONTEXT_BYTES  # CUDA context and allocator slack, for mem_used_bytes


@dataclass(frozen=True, slots=True)
class EmulationStats:
    """How well the host kept up with the modeled GPU (see :meth:`EmulatedDevice.on_iteration`).

    ``lag``: the host's own iteration time already exceeded the modeled GPU time, so nothing was
    slept and the wall time ran long by that much. ``last_pacing_error_s``: the last iteration's
    wall end minus its modeled end (positive: late; for a lagged iteration, its lag).
    """

    iterations: int
    lagged_iterations: int
    lag_s_total: float
    last_pacing_error_s: float
    paced_iterations: int
    pacing_s_total: float  # seconds slept (and spun) to pace iterations
    pacing_abs_error_s_total: float  # sum of |wall end - modeled end| over paced iterations
    modeled_s_total: float

    @property
    def mean_pacing_error_s(self) -> float:
        return self.pacing_abs_error_s_total / self.paced_iterations if self.paced_iterations else 0.0

    @property
    def host_bound_fraction(self) -> float:
        """Share of the iterations whose host time ran past the modeled GPU time (0 with none yet)."""
        return self.lagged_iterations / self.iterations if self.iterations else 0.0


class EmulatedDevice(Device):
    """A modeled GPU (spec ``emulated:<gpu>``) that paces the engine and reports NVML-like counters.

    ``model_shape`` is the model whose work is modeled (default: the ``tiny`` preset); it may
    differ from the model the host actually runs. ``dtype`` is its weights' and KV's precision:
    ``bf16`` (default) or ``fp8`` (one byte per weight and KV element at the GPU's dense FP8 peak, as
    the simulator's ``dtype=fp8``); FP8 figures are **unvalidated** (no measurement checked the model
    on FP8), and the device says so in its :attr:`name` (``"... (emulated, fp8, unvalidated)"``, which
    the store and analytics read) and :meth:`emulation_counters`. ``pace=False`` models and accounts without
    sleeping (the modeled GPU then runs behind the host like a CUDA launch queue). ``clock`` (a
    monotonic seconds clock) and ``sleep`` are injectable so tests run without real time.
    ``sample_window_s`` is the trailing window a :meth:`snapshot` averages over by default.
    ``profile`` is the engine whose host time is modeled before each iteration's GPU work (an
    :data:`~serving.devices.gpu_model.PROFILES` name or an
    :class:`~serving.devices.gpu_model.EngineProfile`; default ``DEFAULT_PROFILE``); ``tp`` and
    ``link`` model one rank of a tensor-parallel group. Between iterations the GPU follows the gap
    model (:func:`~serving.devices.gpu_model.gap_power_w`): boost clock and elevated power through
    short gaps, idle power and the lowest clock after a sustained one.
    """

    def __init__(
        self,
        gpu: str | GpuSpec = "h100-sxm",
        *,
        model_shape: ModelConfig | None = None,
        pace: bool = True,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
        spin_s: float | None = None,
        constants: EmulationConstants = DEFAULT_CONSTANTS,
        history_s: float = 10.0,
        index: int | None = None,
        sample_window_s: float = SAMPLE_WINDOW_S,
        profile: str | EngineProfile | None = None,
        tp: int = 1,
        link: str | LinkSpec = "nvlink",
        dtype: str = "bf16",
    ) -> None:
        self._gpu = gpu_spec(gpu)
        self._validated, self._fidelity_note = emulation_fidelity(self._gpu, dtype)
        self._dtype = dtype
        self._profile = engine_profile(profile)
        self._tp = tp
        self._link = link
        self._index = index  # which emulated GPU of the host (each worker has its own)
        self._shape = model_shape if model_shape is not None else preset("tiny")
        self._pace = pace
        self._clock = clock if clock is not None else time.monotonic
        # The clock the engine's started_s comes from (time.time); an injected clock serves as both.
        self._wall = clock if clock is not None else time.time
        self._sleep = sleep if sleep is not None else time.sleep
        # An injected sleep usually advances an injected clock exactly: no spin needed (or possible).
        self._spin_s = spin_s if spin_s is not None else (_SPIN_S if sleep is None else 0.0)
        self._constants = constants
        self._history_s = history_s
        self._sample_window_s = self._check_window(sample_window_s, "sample_window_s")
        self._clocks = self._gpu.supported_sm_clocks_mhz()
        shard = shard_shape(self._shape, tp)  # validates tp against the shape
        weight_b, kv_b = DTYPES[dtype]
        self._kv_bytes_per_token = shard.kv_bytes_per_token(kv_b)
        self._weight_bytes = shard.param_count() * weight_b
        self._uuid = emulated_uuid(self._gpu.name, index)
        self._lock = threading.Lock()
        # knobs
        self._limit_w = self._gpu.tdp_w
        self._locked_sm_mhz: tuple[int, int] | None = None
        # modeled timeline and the counters integrated over it
        now = self._clock()
        self._opened = now
        self._gpu_free_at = now  # when the modeled GPU finishes its queue, for pacing
        self._timeline = BusyTimeline(self._gpu, constants, history_s, now)
        self._kv_bytes_in_use = 0
        self._last_estimate: IterationEstimate | None = None
        self._last_timing: IterationTiming | None = None
        # pacing accounting
        self._iterations = self._lagged = self._paced = 0
        self._lag_s = self._pacing_s = self._abs_err_s = self._modeled_s = 0.0
        self._last_err_s = 0.0

    def _check_window(self, window_s: float, what: str) -> float:
        if not 0 < window_s <= self._history_s:
            raise DeviceValueError(
                f"{self.spec} {what} {window_s:g} s is outside (0, {self._history_s:g}] s "
                "(the modeled history the device keeps)"
            )
        return float(window_s)

    # --- identity ----------------------------------------------------------------------------

    @property
    def spec(self) -> str:
        return f"emulated:{self._gpu.key}"

    @property
    def kind(self) -> DeviceKind:
        return "emulated"

    @property
    def torch_device(self) -> str:
        """The real model math runs on the host."""
        return "cpu"

    @property
    def gpu(self) -> GpuSpec:
        return self._gpu

    @property
    def model_shape(self) -> ModelConfig:
        return self._shape

    @property
    def name(self) -> str:
        """``"<GPU> (emulated)"``; with fp8 ``"<GPU> (emulated, fp8, unvalidated)"`` (the store keeps the
        name, so every figure read from this GPU can carry its dtype and the unvalidated label)."""
        if self._dtype == "bf16":
            return f"{self._gpu.name} (emulated)"
        tail = "" if self._validated else ", unvalidated"
        return f"{self._gpu.name} (emulated, {self._dtype}{tail})"

    @property
    def dtype(self) -> str:
        """The modeled weights' and KV's precision (``bf16`` or ``fp8``)."""
        return self._dtype

    @property
    def validated(self) -> bool:
        """Whether the GPU model was checked against measurements on this GPU and dtype."""
        return self._validated

    @property
    def pace(self) -> bool:
        return self._pace

    @property
    def sample_window_s(self) -> float:
        return self._sample_window_s

    @property
    def profile(self) -> EngineProfile:
        """The engine profile whose host time each iteration models."""
        return self._profile

    @property
    def tp(self) -> int:
        return self._tp

    # --- the model --------------------------------------------------------------------------

    def predict(self, work: IterationWork) -> IterationEstimate:
        """Model ``work`` under the current power limit and locked clocks (no side effects)."""
        with self._lock:
            limit, locked = self._limit_w, self._locked_sm_mhz
        return predict_iteration(
            self._gpu,
            self._shape,
            work,
            power_limit_w=limit,
            sm_clock_range=locked,
            constants=self._constants,
            tp=self._tp,
            link=self._link,
            profile=self._profile,
            dtype=self._dtype,
        )

    @property
    def last_estimate(self) -> IterationEstimate | None:
        """The estimate of the most recent iteration, if any."""
        return self._last_estimate

    def last_iteration_timing(self) -> IterationTiming | None:
        """The modeled time and lag of the most recent iteration (``None`` before the first)."""
        return self._last_timing

    def stats(self) -> EmulationStats:
        """Pacing and lag counters since the device was opened."""
        with self._lock:
            return EmulationStats(
                iterations=self._iterations,
                lagged_iterations=self._lagged,
                lag_s_total=self._lag_s,
                last_pacing_error_s=self._last_err_s,
                paced_iterations=self._paced,
                pacing_s_total=self._pacing_s,
                pacing_abs_error_s_total=self._abs_err_s,
                modeled_s_total=self._modeled_s,
            )

    def emulation_counters(self) -> dict[str, Any]:
        """:meth:`stats` as a JSON-able dict, plus what is modeled (gpu, shape) and the host-bound share."""
        s = self.stats()
        return {
            "device": self.spec,
            "gpu": self._gpu.name,
            "models_shape": self._shape.name,
            "dtype": self._dtype,
            "validated": self._validated,
            **({"fidelity": self._fidelity_note} if self._fidelity_note else {}),
            "paced": self._pace,
            "iterations": s.iterations,
            "paced_iterations": s.paced_iterations,
            "lagged_iterations": s.lagged_iterations,
            "lag_s_total": s.lag_s_total,
            "modeled_s_total": s.modeled_s_total,
            "host_bound_fraction": s.host_bound_fraction,
        }

    def on_iteration(self, work: IterationWork, started_s: float, elapsed_s: float) -> float:
        """Model the iteration the engine just ran and pace it; return the seconds slept.

        The modeled GPU starts the iteration when the host started it or when it finished the
        previous one, whichever is later, and runs it for the modeled time. With pacing on, this
        sleeps until that modeled end; when the host already overran it, the overrun is counted as
        lag. The host start is ``started_s`` (wall clock, as the engine reads it) when that agrees
        with ``elapsed_s`` (so host work after the engine's own measurement counts too), else
        ``elapsed_s`` before now; the device paces on its own monotonic clock.

        The modeled iteration is ``est.host_s`` of engine host time (GPU idle, gap power) followed by
        ``est.busy_s`` of GPU work. Back to back (the engine started the iteration within ``host_s``
        of the previous modeled end) it begins at that end, so the engine's real host time between
        iterations is counted once, as the modeled host time — as the simulator runs them. An
        iteration with decode sequences is back to back by construction (the engine does not wait
        while sequences run): when its real loop took longer than ``host_s``, the loop *is* the host
        time, and the GPU work begins when the engine started it (``max(L, host_s)`` between
        iterations, not ``L + host_s``). The counters' timeline never changes behind a reading: where that
        start lies before the time the counters were last integrated to (a snapshot taken while the
        host computed), the iteration is placed from that time on instead, so its whole modeled
        energy and busy time are counted.
        """
        entry = self._clock()
        since_start = self._wall() - started_s
        if not elapsed_s <= since_start <= elapsed_s + _MAX_HOOK_DELAY_S:
            since_start = elapsed_s  # a wall-clock step, or a started_s from another clock
        est = self.predict(work)
        with self._lock:
            host_start = entry - max(0.0, since_start)
            # The engine's real host work since the previous iteration is the modeled host time
            # (est.host_s), not extra: an iteration the engine started within host_s of the modeled
            # GPU's previous end begins at that end. One that carries running (decode) sequences
            # was started back to back whatever the loop took (an engine with running sequences never
            # waits), so its GPU work begins at the later of that end + host_s and the engine's start:
            # a loop longer than host_s replaces the modeled host time instead of adding to it. Any
            # other (the engine sat idle, then scheduled a prompt) begins when the engine started it.
            if host_start < self._gpu_free_at + est.host_s:
                modeled_start = self._gpu_free_at
            elif work.decode_seqs > 0:
                modeled_start = host_start - est.host_s
            else:
                modeled_start = host_start
            modeled_end = modeled_start + est.time_s
            self._gpu_free_at = modeled_end
            timeline = self._timeline
            start = timeline.place(modeled_start, est.time_s)
            locked = self._locked_sm_mhz
            lag = entry - modeled_end
            timeline.add(
                BusyInterval(
                    start=start + est.host_s,
                    end=timeline.end,
                    power_w=est.power_w,
                    sm_clock_mhz=est.sm_clock_mhz,
                    sm_active=est.sm_active,
                    sm_occupancy=est.sm_occupancy,
                    tensor_active=est.tensor_active,
                    dram_active=est.dram_active,
                    mem_active=min(1.0, est.memory_s / est.busy_s) if est.busy_s > 0 else 0.0,
                    capped=est.power_capped,
                    held_mhz=timeline.held_mhz(locked),
                ),
                reported_at=entry,
                lagged=lag > 0,
            )
            self._kv_bytes_in_use = max(0, work.context_tokens) * self._kv_bytes_per_token
            self._last_estimate = est
            self._iterations += 1
            self._modeled_s += est.time_s
            if lag > 0:
                self._lagged += 1
                self._lag_s += lag
                self._last_err_s = lag
            elif not self._pace:
                self._last_err_s = entry - modeled_end
            self._last_timing = IterationTiming(est.time_s, max(0.0, lag), est.flops, est.hbm_bytes)
        if lag > 0 or not self._pace:
            return 0.0
        self._sleep_until(modeled_end)
        leave = self._clock()
        with self._lock:
            self._paced += 1
            self._pacing_s += leave - entry
            self._abs_err_s += abs(leave - modeled_end)
            self._last_err_s = leave - modeled_end
        return leave - entry

    def _sleep_until(self, deadline: float) -> None:
        """Sleep most of the way, then spin the last ``spin_s`` (time.sleep overshoots by ~0.1 ms)."""
        remaining = deadline - self._clock()
        while remaining > 0:
            if remaining > self._spin_s:
                self._sleep(remaining - self._spin_s)
                if self._spin_s <= 0:
                    return
            remaining = deadline - self._clock()

    # --- telemetry ------------------------------------------------------------------------------

    def snapshot(self, window_s: float | None = None) -> EmulatedSample:
        """Counters now: means over the trailing ``window_s`` (default ``sample_window_s``), plus
        monotonic cumulative counters.

        No reader changes what another reads: nothing here depends on earlier snapshots. A reader
        that wants exact means over its own interval passes its period as ``window_s``, or
        differences the cumulative counters (``energy_mj``, ``*_total``) of two samples over
        ``uptime_s``. ``energy_mj`` integrates the modeled power since the device was opened (idle
        power between iterations); ``temperature_c`` follows a first-order thermal model.
        """
        length = self._sample_window_s if window_s is None else self._check_window(window_s, "window_s")
        now = self._clock()
        ts_s = self._wall()
        with self._lock:
            timeline = self._timeline
            timeline.advance(now)
            locked = self._locked_sm_mhz
            idle_mhz = locked[0] if locked else self._clocks[0]
            window = timeline.window(now - length, now, idle_mhz)
            energy_mj = int(timeline.energy_j * 1000.0)
            counters = {
                "uptime_s": now - self._opened,
                "busy_s_total": timeline.busy_s,
                "sm_active_s_total": timeline.sm_s,
                "sm_occupancy_s_total": timeline.occ_s,
                "tensor_active_s_total": timeline.tensor_s,
                "dram_active_s_total": timeline.dram_s,
                "mem_active_s_total": timeline.mem_s,
                "iterations_total": self._iterations,
                "paced_iterations_total": self._paced,
                "lagged_iterations_total": self._lagged,
                "lag_s_total": self._lag_s,
                "modeled_s_total": self._modeled_s,
            }
            temperature = timeline.temp_c
            limit = self._limit_w
            used = self._weight_bytes + self._kv_bytes_in_use + _CONTEXT_BYTES
        return EmulatedSample(
            ts_s=ts_s,
            device=self.spec,
            kind="emulated",
            index=self._index,
            name=self.name,
            uuid=self._uuid,
            emulated=True,
            energy_mj=energy_mj,
            power_limit_w=limit,
            mem_clock_mhz=self._gpu.mem_clock_mhz,
            temperature_c=round(temperature, 2),
            mem_used_bytes=min(used, self._gpu.memory_bytes),
            mem_total_bytes=self._gpu.memory_bytes,
            locked_sm_clock_min_mhz=locked[0] if locked else None,
            locked_sm_clock_max_mhz=locked[1] if locked else None,
            window_s=length,
            **counters,
            **window,
        )

    # --- knobs (bounds, validation and messages as on the NVML path) ----------------------------

    def driver_version(self) -> str:
        """No driver: the GPU model stands in for one (``emulated``)."""
        return "emulated"

    def power_limit_constraints_w(self) -> PowerLimitConstraints:
        g = self._gpu
        return PowerLimitConstraints(min_w=g.min_power_limit_w, max_w=g.tdp_w, default_w=g.tdp_w)

    def power_limit_w(self) -> float:
        with self._lock:
            return self._limit_w

    def set_power_limit_w(self, limit_w: float) -> None:
        bounds = self.power_limit_constraints_w()
        if not bounds.min_w <= limit_w <= bounds.max_w:
            raise DeviceValueError.out_of_range(
                f"{self.spec} power limit", limit_w, bounds.min_w, bounds.max_w, "W"
            )
        with self._lock:
            self._limit_w = round(limit_w * 1000) / 1000  # NVML takes milliwatts

    def reset_power_limit(self) -> None:
        with self._lock:
            self._limit_w = self._gpu.tdp_w

    def sm_clock_range_mhz(self) -> tuple[int, int] | None:
        with self._lock:
            return self._locked_sm_mhz

    def supported_sm_clocks_mhz(self) -> list[int]:
        return list(self._clocks)

    def set_sm_clock_range_mhz(self, min_mhz: int, max_mhz: int) -> None:
        if min_mhz > max_mhz:
            raise DeviceValueError(f"{self.spec} SM clock range [{min_mhz}, {max_mhz}] MHz has min > max")
        clocks = self._clocks
        for value in (min_mhz, max_mhz):
            if not clocks[0] <= value <= clocks[-1]:
                raise DeviceValueError.out_of_range(
                    f"{self.spec} SM clock", value, clocks[0], clocks[-1], "MHz"
                )
        with self._lock:
            self._locked_sm_mhz = (int(min_mhz), int(max_mhz))

    def reset_sm_clocks(self) -> None:
        with self._lock:
            self._locked_sm_mhz = None
