"""The emulated GPU (``emulated:<gpu>``): a roofline + DVFS power model behind the Device interface.

Two layers:

* :func:`predict_iteration` -- a pure function: the modeled time, power, SM clock and activities of
  one engine iteration (:class:`~serving.devices.base.IterationWork`) of a model shape
  (:class:`~serving.config.ModelConfig`, bf16) on a GPU (:mod:`serving.devices.gpu_specs`), under a
  power limit and/or a locked SM clock range. Analytics can call it without a device.
* :class:`EmulatedDevice` -- a :class:`~serving.devices.base.Device` that the serving engine drives:
  :meth:`EmulatedDevice.on_iteration` models each iteration the engine ran (the real math runs on
  the host CPU), sleeps until the modeled GPU would have finished (so wall time is paced to the
  modeled GPU), keeps a short history of modeled busy intervals, and reports NVML-like counters
  through :meth:`EmulatedDevice.snapshot` with the same knobs, bounds and errors as the NVML path.

The equations, the constants and their calibration against H200 measurements are in
``docs/EMULATION.md``.
"""

from __future__ import annotations

import functools
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from serving.config import ModelConfig, model_config_for, preset
from serving.devices.base import (
    Device,
    DeviceKind,
    EmulatedSample,
    IterationTiming,
    IterationWork,
    PowerLimitConstraints,
)
from serving.devices.errors import DeviceValueError
from serving.devices.gpu_specs import GpuSpec, gpu_spec

Bound = Literal["compute", "memory", "overhead"]

# NVML clock-event (throttle) reason bits the emulator sets.
CLOCK_EVENT_GPU_IDLE = 0x1
CLOCK_EVENT_SW_POWER_CAP = 0x4

BF16_BYTES = 2


@dataclass(frozen=True, slots=True)
class EmulationConstants:
    """The model's fitted constants (see docs/EMULATION.md for where each comes from).

    Power figures are fractions of the GPU's dynamic range ``tdp_w - idle_w`` so one set serves
    every GPU in :data:`~serving.devices.gpu_specs.GPU_SPECS`.
    """

    gemm_efficiency: float = 0.65  # achieved/peak tensor FLOP/s of compute-bound GEMMs and attention
    memory_efficiency: float = 0.85  # achieved/peak HBM bandwidth of memory-bound kernels
    gemm_tile_tokens: int = 16  # GEMM token dimension is padded to this (swap-AB 64x16 Hopper tiles)
    activation_passes: float = 7.5  # bf16 passes over (hidden + intermediate) per token per layer
    overhead_s: float = 2.0e-4  # per iteration: launches, sampling, synchronisation
    overhead_per_layer_s: float = 4.0e-6
    # power, as fractions of (tdp_w - idle_w), at the maximum SM clock
    compute_power: float = 0.95  # SM power through a compute-bound kernel
    stream_power: float = 0.09  # SM power through a memory-bound kernel (load issue, L2, NoC)
    hbm_power: float = 0.09  # HBM and controllers at peak bandwidth (memory clock, not SM clock)
    busy_power: float = 0.08  # clock-independent power whenever a kernel runs
    # SM power ~ (f/f_max) * V(f)^2 with V(f)/V_max = max(voltage_floor, v0 + (1 - v0) * f/f_max)
    voltage_offset: float = 0.31  # v0
    voltage_floor: float = 0.68
    # activity counters (GPM-like), calibrated to the H200 readings of this engine
    sm_active_compute: float = 0.55  # SM-active fraction through compute-bound kernels
    sm_active_memory: float = 0.25  # ... through memory-bound kernels
    sm_occupancy_compute: float = 0.20
    sm_occupancy_memory: float = 0.40
    tensor_active_scale: float = 0.37  # tensor-active fraction per unit of tensor-pipe time


DEFAULT_CONSTANTS = EmulationConstants()


@dataclass(frozen=True, slots=True)
class IterationEstimate:
    """The modeled GPU execution of one iteration.

    ``compute_s`` and ``memory_s`` are the summed compute and memory roofline terms of the
    iteration's kernels at the chosen clock; ``time_s`` sums each kernel's larger term plus the fixed
    overhead. Activities are fractions (0-1) of ``time_s``.
    """

    time_s: float
    power_w: float
    sm_clock_mhz: int
    compute_s: float
    memory_s: float
    sm_active: float
    dram_active: float
    bound: Bound
    tensor_active: float = 0.0
    sm_occupancy: float = 0.0
    power_capped: bool = False  # the power limit held the SM clock below the allowed maximum
    flops: float = 0.0
    hbm_bytes: float = 0.0

    @property
    def energy_j(self) -> float:
        return self.power_w * self.time_s


@dataclass(frozen=True, slots=True)
class _ShapeCosts:
    body_params: int  # parameters every computed token passes through (no embedding, no LM head)
    lm_head_params: int
    kv_bytes_per_token: int
    attn_flops_per_pair: int  # QK^T and PV, every layer and head
    act_bytes_per_token: float  # elementwise/activation traffic of one token through all layers
    weight_bytes: int  # all parameters, bf16 (memory in use)


@functools.lru_cache(maxsize=64)
def _shape_costs(shape: ModelConfig, activation_passes: float) -> _ShapeCosts:
    d = shape.hidden_size
    lm_head = shape.vocab_size * d
    embed = shape.vocab_size * d
    total = shape.param_count()
    body = total - embed - (0 if shape.tie_word_embeddings else lm_head)
    return _ShapeCosts(
        body_params=body,
        lm_head_params=lm_head,
        kv_bytes_per_token=shape.kv_bytes_per_token(BF16_BYTES),
        attn_flops_per_pair=4 * shape.num_layers * shape.num_heads * shape.head_dim,
        act_bytes_per_token=activation_passes
        * (shape.hidden_size + shape.intermediate_size)
        * shape.num_layers
        * BF16_BYTES,
        weight_bytes=total * BF16_BYTES,
    )


def _pad(n: int, tile: int) -> int:
    return -(-n // tile) * tile if n > 0 else 0


def estimate_at_clock(
    gpu: str | GpuSpec,
    shape: ModelConfig,
    work: IterationWork,
    sm_clock_mhz: int,
    *,
    constants: EmulationConstants = DEFAULT_CONSTANTS,
) -> IterationEstimate:
    """Model ``work`` on ``gpu`` with the SM clock fixed at ``sm_clock_mhz`` (no power limit applied).

    Each kernel class (the linear layers, the LM head for sampled rows, attention, the elementwise
    and activation traffic) takes ``max(FLOPs / (peak * eff * f/f_max), bytes / (bw * eff_m))``;
    the iteration sums them and adds a fixed overhead.
    """
    spec = gpu_spec(gpu)
    c = constants
    costs = _shape_costs(shape, c.activation_passes)
    x = sm_clock_mhz / spec.max_sm_clock_mhz
    flops_per_s = spec.peak_flops * c.gemm_efficiency * x
    bytes_per_s = spec.bandwidth_bytes_s * c.memory_efficiency
    tokens = max(0, work.prefill_tokens) + max(0, work.decode_seqs)
    sampled = max(0, work.sampled_seqs)
    kv = costs.kv_bytes_per_token
    kernels: list[tuple[float, float]] = []  # (flops, bytes)
    if tokens:
        kernels.append((2.0 * costs.body_params * _pad(tokens, c.gemm_tile_tokens), 2.0 * costs.body_params))
        kernels.append(
            (
                float(costs.attn_flops_per_pair * max(0, work.attention_pairs)),
                float(kv * (max(0, work.context_tokens) + tokens)),  # read the context, write the new
            )
        )
        kernels.append((0.0, costs.act_bytes_per_token * tokens))
    if sampled:
        kernels.append(
            (2.0 * costs.lm_head_params * _pad(sampled, c.gemm_tile_tokens), 2.0 * costs.lm_head_params)
        )
    overhead = c.overhead_s + c.overhead_per_layer_s * shape.num_layers
    compute_s = memory_s = busy_kernels = 0.0
    sm_weighted = act_weighted = occ_weighted = 0.0
    total_flops = total_bytes = 0.0
    for flops, nbytes in kernels:
        tc, tm = flops / flops_per_s, nbytes / bytes_per_s
        tk = max(tc, tm)
        if tk <= 0.0:
            continue
        u = tc / tk  # compute-pipe utilisation within this kernel
        compute_s += tc
        memory_s += tm
        busy_kernels += tk
        sm_weighted += tk * (c.stream_power + (c.compute_power - c.stream_power) * u)
        act_weighted += tk * (c.sm_active_memory + (c.sm_active_compute - c.sm_active_memory) * u)
        occ_weighted += tk * (c.sm_occupancy_memory + (c.sm_occupancy_compute - c.sm_occupancy_memory) * u)
        total_flops += flops
        total_bytes += nbytes
    time_s = busy_kernels + overhead
    dram = total_bytes / (time_s * spec.bandwidth_bytes_s)
    dynamic = spec.tdp_w - spec.idle_w
    volts = max(c.voltage_floor, c.voltage_offset + (1.0 - c.voltage_offset) * x)
    power = spec.idle_w + dynamic * (
        c.busy_power + c.hbm_power * dram + x * volts * volts * sm_weighted / time_s
    )
    if overhead >= max(compute_s, memory_s):
        bound: Bound = "overhead"
    else:
        bound = "compute" if compute_s >= memory_s else "memory"
    return IterationEstimate(
        time_s=time_s,
        power_w=power,
        sm_clock_mhz=int(sm_clock_mhz),
        compute_s=compute_s,
        memory_s=memory_s,
        sm_active=act_weighted / time_s,
        dram_active=dram,
        bound=bound,
        tensor_active=min(1.0, c.tensor_active_scale * compute_s / time_s),
        sm_occupancy=occ_weighted / time_s,
        flops=total_flops,
        hbm_bytes=total_bytes,
    )


@functools.lru_cache(maxsize=256)
def _allowed_ceiling(spec: GpuSpec, sm_clock_range: tuple[int, int] | None) -> tuple[tuple[int, ...], int]:
    """The supported clocks and the index of the highest one the locked range allows."""
    clocks = spec.supported_sm_clocks_mhz()
    if sm_clock_range is None:
        return clocks, len(clocks) - 1
    low, high = sm_clock_range
    in_range = [i for i, f in enumerate(clocks) if low <= f <= high]
    if in_range:
        return clocks, in_range[-1]
    below = [i for i, f in enumerate(clocks) if f <= high]
    return clocks, below[-1] if below else 0


def predict_iteration(
    gpu: str | GpuSpec,
    shape: ModelConfig,
    work: IterationWork,
    *,
    power_limit_w: float | None = None,
    sm_clock_range: tuple[int, int] | None = None,
    constants: EmulationConstants = DEFAULT_CONSTANTS,
) -> IterationEstimate:
    """Model one iteration of ``work`` for ``shape`` (bf16) on ``gpu`` under the given knobs.

    The SM clock is the highest supported clock within ``sm_clock_range`` (all of them when
    ``None``) whose modeled power fits ``power_limit_w`` (default: the TDP). When even the lowest
    clock of the range does not fit, the power limit wins, as on real GPUs: the clock drops below
    the locked range, down to the minimum supported clock. ``power_capped`` says the limit bound.
    """
    spec = gpu_spec(gpu)
    limit = spec.tdp_w if power_limit_w is None else power_limit_w
    clocks, top = _allowed_ceiling(spec, sm_clock_range)
    best = estimate_at_clock(spec, shape, work, clocks[top], constants=constants)
    if best.power_w <= limit:
        return best
    # Power rises monotonically with the clock: binary-search the highest clock that fits.
    lo, hi = 0, top - 1
    fit: IterationEstimate | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        est = estimate_at_clock(spec, shape, work, clocks[mid], constants=constants)
        if est.power_w <= limit:
            fit, lo = est, mid + 1
        else:
            hi = mid - 1
    if fit is None:
        fit = estimate_at_clock(spec, shape, work, clocks[0], constants=constants)
    return replace(fit, power_capped=True)


def emulated_device_label(device: str, shape: str) -> dict[str, Any] | None:
    """What a worker on ``device`` models, for banners and APIs; ``None`` unless ``emulated:<gpu>``.

    ``shape`` is the preset name or Hugging Face folder of the modeled shape (``--emulate-shape``,
    else the served model). Returns ``{"device", "emulated": True, "gpu", "models_shape"}``.
    """
    if not device.startswith("emulated:"):
        return None
    gpu = gpu_spec(device.split(":", 1)[1])
    return {"device": device, "emulated": True, "gpu": gpu.name, "models_shape": model_config_for(shape).name}


# --- the device -----------------------------------------------------------------------------------

_SPIN_S = 3e-4  # the last stretch of a real-time pacing sleep is a spin: time.sleep overshoots
_MAX_HOOK_DELAY_S = 0.05  # started_s is trusted when it is at most this much older than elapsed_s says
SAMPLE_WINDOW_S = 0.1  # default trailing window of a snapshot's means (NVML-like sample period)
_CONTEXT_BYTES = 512 * 2**20  # CUDA context and allocator slack, for mem_used_bytes


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


@dataclass(slots=True)
class _Busy:
    """One modeled GPU busy interval (an iteration), on the device's clock."""

    start: float
    end: float
    power_w: float
    sm_clock_mhz: int
    sm_active: float
    sm_occupancy: float
    tensor_active: float
    dram_active: float
    mem_active: float
    capped: bool


class EmulatedDevice(Device):
    """A modeled GPU (spec ``emulated:<gpu>``) that paces the engine and reports NVML-like counters.

    ``model_shape`` is the model whose bf16 work is modeled (default: the ``tiny`` preset); it may
    differ from the model the host actually runs. ``pace=False`` models and accounts without
    sleeping (the modeled GPU then runs behind the host like a CUDA launch queue). ``clock`` (a
    monotonic seconds clock) and ``sleep`` are injectable so tests run without real time.
    ``sample_window_s`` is the trailing window a :meth:`snapshot` averages over by default.
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
    ) -> None:
        self._gpu = gpu_spec(gpu)
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
        self._costs = _shape_costs(self._shape, constants.activation_passes)
        self._uuid = f"GPU-emulated-{uuid.uuid4()}"
        self._lock = threading.Lock()
        # knobs
        self._limit_w = self._gpu.tdp_w
        self._locked_sm_mhz: tuple[int, int] | None = None
        # modeled timeline
        now = self._clock()
        self._opened = now
        self._history: deque[_Busy] = deque()
        self._gpu_free_at = now  # when the modeled GPU finishes its queue, for pacing
        self._timeline_end = now  # end of the last busy interval on the accounted timeline
        self._cursor = now  # the counters are integrated (and may have been reported) up to here
        self._reports: deque[tuple[float, bool]] = deque()  # (when the host reported it, lagged)
        # cumulative counters over [opened, cursor]
        self._energy_j = self._busy_s = self._sm_s = self._occ_s = 0.0
        self._tensor_s = self._dram_s = self._mem_s = 0.0
        self._temp_c = self._gpu.ambient_c + self._gpu.thermal_c_per_w * self._gpu.idle_w
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
        return f"{self._gpu.name} (emulated)"

    @property
    def pace(self) -> bool:
        return self._pace

    @property
    def sample_window_s(self) -> float:
        return self._sample_window_s

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

        The counters' timeline never changes behind a reading: where that start lies before the
        time the counters were last integrated to (a snapshot taken while the host computed), the
        iteration's busy interval is placed from that time on instead, so its whole modeled energy
        and busy time are counted.
        """
        entry = self._clock()
        since_start = self._wall() - started_s
        if not elapsed_s <= since_start <= elapsed_s + _MAX_HOOK_DELAY_S:
            since_start = elapsed_s  # a wall-clock step, or a started_s from another clock
        est = self.predict(work)
        with self._lock:
            modeled_start = max(entry - max(0.0, since_start), self._gpu_free_at)
            modeled_end = modeled_start + est.time_s
            self._gpu_free_at = modeled_end
            start = max(modeled_start, self._cursor, self._timeline_end)
            self._timeline_end = start + est.time_s
            self._history.append(
                _Busy(
                    start=start,
                    end=self._timeline_end,
                    power_w=est.power_w,
                    sm_clock_mhz=est.sm_clock_mhz,
                    sm_active=est.sm_active,
                    sm_occupancy=est.sm_occupancy,
                    tensor_active=est.tensor_active,
                    dram_active=est.dram_active,
                    mem_active=min(1.0, est.memory_s / est.time_s) if est.time_s > 0 else 0.0,
                    capped=est.power_capped,
                )
            )
            self._kv_bytes_in_use = max(0, work.context_tokens) * self._costs.kv_bytes_per_token
            self._last_estimate = est
            self._iterations += 1
            self._modeled_s += est.time_s
            lag = entry - modeled_end
            self._reports.append((entry, lag > 0))
            if lag > 0:
                self._lagged += 1
                self._lag_s += lag
                self._last_err_s = lag
            elif not self._pace:
                self._last_err_s = entry - modeled_end
            self._last_timing = IterationTiming(modeled_s=est.time_s, lag_s=max(0.0, lag))
            if (
                self._history[0].end < entry - self._history_s
                or self._reports[0][0] < entry - self._history_s
            ):
                self._advance(entry)
                self._trim(entry)
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

    # --- the modeled timeline (callers hold self._lock) -----------------------------------------

    def _segment(self, busy: _Busy | None, dt: float) -> None:
        """Add ``dt`` seconds of ``busy`` (or of idle) to the cumulative counters and the thermal model."""
        if dt <= 0:
            return
        power_w = self._gpu.idle_w if busy is None else busy.power_w
        self._energy_j += power_w * dt
        if busy is not None:
            self._busy_s += dt
            self._sm_s += busy.sm_active * dt
            self._occ_s += busy.sm_occupancy * dt
            self._tensor_s += busy.tensor_active * dt
            self._dram_s += busy.dram_active * dt
            self._mem_s += busy.mem_active * dt
        g = self._gpu
        steady = g.ambient_c + g.thermal_c_per_w * power_w
        self._temp_c = steady + (self._temp_c - steady) * math.exp(-dt / g.thermal_tau_s)

    def _advance(self, now: float) -> None:
        """Integrate the counters from the cursor up to ``now`` (idle between iterations).

        Busy intervals are never placed before the cursor (see :meth:`on_iteration`), so each is
        integrated exactly once, whole.
        """
        t = self._cursor
        if now <= t:
            return
        for busy in self._history:
            if busy.end <= t:
                continue
            if busy.start >= now:
                break
            if busy.start > t:
                self._segment(None, busy.start - t)
                t = busy.start
            stop = min(busy.end, now)
            self._segment(busy, stop - t)
            t = stop
        self._segment(None, now - t)
        self._cursor = now

    def _trim(self, now: float) -> None:
        horizon = min(now - self._history_s, self._cursor)
        while self._history and self._history[0].end < horizon:
            self._history.popleft()
        while self._reports and self._reports[0][0] < now - self._history_s:
            self._reports.popleft()

    def _window(self, w0: float, w1: float) -> dict[str, float | int | None]:
        """Time-weighted means over ``[w0, w1]``; idle time counts as zero activity and idle power."""
        length = w1 - w0
        busy = energy = clock = sm = occ = tensor = dram = mem = 0.0
        capped = False
        for b in self._history:
            overlap = min(b.end, w1) - max(b.start, w0)
            if overlap <= 0:
                continue
            busy += overlap
            energy += overlap * b.power_w
            clock += overlap * b.sm_clock_mhz
            sm += overlap * b.sm_active
            occ += overlap * b.sm_occupancy
            tensor += overlap * b.tensor_active
            dram += overlap * b.dram_active
            mem += overlap * b.mem_active
            capped = capped or b.capped
        energy += (length - busy) * self._gpu.idle_w
        reasons = (0 if busy > 0 else CLOCK_EVENT_GPU_IDLE) | (CLOCK_EVENT_SW_POWER_CAP if capped else 0)
        idle_clock = self._locked_sm_mhz[0] if self._locked_sm_mhz else self._clocks[0]
        pct = 100.0 / length
        reported = [lagged for at, lagged in self._reports if w0 < at <= w1]
        return {
            "gpu_util_pct": busy * pct,
            "mem_util_pct": mem * pct,
            "sm_active_pct": sm * pct,
            "sm_occupancy_pct": occ * pct,
            "tensor_active_pct": tensor * pct,
            "dram_active_pct": dram * pct,
            "power_w": energy / length,
            "sm_clock_mhz": round(clock / busy) if busy > 0 else idle_clock,
            "clock_event_reasons": reasons,
            "host_bound_pct": 100.0 * sum(reported) / len(reported) if reported else None,
        }

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
            self._advance(now)
            window = self._window(now - length, now)
            locked = self._locked_sm_mhz
            energy_mj = int(self._energy_j * 1000.0)
            counters = {
                "uptime_s": now - self._opened,
                "busy_s_total": self._busy_s,
                "sm_active_s_total": self._sm_s,
                "sm_occupancy_s_total": self._occ_s,
                "tensor_active_s_total": self._tensor_s,
                "dram_active_s_total": self._dram_s,
                "mem_active_s_total": self._mem_s,
                "iterations_total": self._iterations,
                "paced_iterations_total": self._paced,
                "lagged_iterations_total": self._lagged,
                "lag_s_total": self._lag_s,
                "modeled_s_total": self._modeled_s,
            }
            temperature = self._temp_c
            limit = self._limit_w
            used = self._costs.weight_bytes + self._kv_bytes_in_use + _CONTEXT_BYTES
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
