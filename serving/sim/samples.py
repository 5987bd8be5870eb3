"""Device samples of a simulated run, derived the way an NVML reader derives them.

Each GPU's state is integrated into cumulative counters (energy, busy time, SM-active time, ...)
over its busy intervals and the gaps between them; a sample at ``t`` reports the counters at ``t``
and, for the means (``power_w``, ``*_pct``), their differences over the period ending at ``t`` — as
the collector stores a live GPU (``energy_mj`` is a monotonic counter; ``power_w`` is the period's
mean). Busy power and activities are the GPU model's per iteration; the gaps are priced by the
GPU model's gap-power functions (boost-clock linger after an iteration, true idle after a sustained
gap), the same functions the emulated device integrates. Everything here is vectorised with numpy.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from serving.devices.emulated_timeline import CLOCK_EVENT_GPU_IDLE, CLOCK_EVENT_SW_POWER_CAP
from serving.devices.gpu_model import CONTEXT_BYTES, gap_energy_j, gap_sm_clock_mhz
from serving.devices.gpu_specs import GpuSpec, gpu_spec
from serving.sim.simulator import Busy, Replica, SimResult


@dataclass(frozen=True, slots=True)
class SampleColumns:
    """One GPU's samples as columns (``gpu_samples`` names), plus identity and owner."""

    index: int
    uuid: str
    worker: str
    role: str
    columns: dict[str, np.ndarray | list]

    @property
    def n(self) -> int:
        return len(self.columns["ts_s"])


class CumulativeCounters:
    """Cumulative integrals of one replica's busy intervals and gaps, evaluated at any times."""

    def __init__(self, busy: Busy, spec: GpuSpec, held_mhz: float | None = None) -> None:
        self.spec = spec
        self.held_mhz = held_mhz  # the clock a locked range holds through gaps (None: the maximum)
        self.s = np.frombuffer(busy.start_s, dtype=np.float64)  # virtual seconds since the run's start
        self.e = np.frombuffer(busy.end_s, dtype=np.float64)
        d = self.e - self.s
        self.d = d
        self.power = np.asarray(busy.power_w, dtype=np.float64)
        self.clock = np.asarray(busy.sm_clock_mhz, dtype=np.float64)
        self.capped = np.asarray(busy.capped, dtype=bool)
        self.kv_bytes = np.asarray(busy.kv_bytes, dtype=np.int64)
        self.rates = {
            "busy": np.ones_like(d),
            "energy": self.power,
            "sm": np.asarray(busy.sm_active, dtype=np.float64),
            "occ": np.asarray(busy.sm_occupancy, dtype=np.float64),
            "tensor": np.asarray(busy.tensor_active, dtype=np.float64),
            "dram": np.asarray(busy.dram_active, dtype=np.float64),
            "mem": np.asarray(busy.mem_active, dtype=np.float64),
            "clock": self.clock,
        }
        self.cum = {k: np.concatenate(([0.0], np.cumsum(v * d))) for k, v in self.rates.items()}
        # Gap i lies before busy interval i, after interval i-1 (the first: from t0, at true idle).
        prev_end = np.concatenate(([0.0], self.e[:-1])) if len(d) else np.array([0.0])
        gaps = np.maximum(0.0, self.s - prev_end) if len(d) else np.zeros(0)
        gap_e = np.asarray(gap_energy_j(spec, gaps, sm_clock_mhz=held_mhz), dtype=np.float64)
        if len(d):
            gap_e[0] = spec.idle_w * gaps[0]  # before its first iteration the GPU sat at true idle
        self.cum_gap = np.concatenate(([0.0], np.cumsum(gap_e)))
        self.cum_capped = np.concatenate(([0], np.cumsum(self.capped.astype(np.int64))))

    def at(self, t: np.ndarray) -> dict[str, np.ndarray]:
        """Counters at each virtual time of ``t`` (ascending, ≥ 0): busy integrals and total energy."""
        t = np.asarray(t, dtype=np.float64)
        n = len(self.d)
        k = np.searchsorted(self.e, t, side="right")  # intervals ended by t
        inside = np.zeros(len(t), dtype=bool)
        partial = np.zeros(len(t))
        if n:
            kk = np.minimum(k, n - 1)
            inside = (k < n) & (self.s[kk] < t)
            partial = np.where(inside, t - self.s[kk], 0.0)
        out = {}
        for name, cum in self.cum.items():
            rate = self.rates[name][np.minimum(k, n - 1)] if n else np.zeros(len(t))
            out[name] = cum[k] + rate * partial
        # gaps: all gaps before interval k are whole when t is inside interval k or at its start;
        # otherwise t lies in gap k (after interval k-1), partly elapsed.
        if n:
            gap_start = np.where(k > 0, self.e[np.maximum(k - 1, 0)], 0.0)
            in_gap = ~inside
            elapsed = np.where(in_gap, np.maximum(0.0, t - gap_start), 0.0)
            whole = np.where(inside, k + 1, k)  # gaps 0..whole-1 are over
            first_gap = in_gap & (k == 0)
            part = np.where(
                first_gap,
                self.spec.idle_w * elapsed,
                np.asarray(gap_energy_j(self.spec, elapsed, sm_clock_mhz=self.held_mhz), dtype=np.float64),
            )
            out["gap_energy"] = self.cum_gap[np.minimum(whole, n)] + np.where(in_gap, part, 0.0)
            out["since_busy"] = np.where(in_gap & (k > 0), t - gap_start, np.inf)
            out["capped"] = self.cum_capped[np.minimum(whole, n)]
            out["kv_bytes"] = np.where(k < n, self.kv_bytes[np.minimum(k, n - 1)], 0)
        else:
            out["gap_energy"] = self.spec.idle_w * t
            out["since_busy"] = np.full(len(t), np.inf)
            out["capped"] = np.zeros(len(t), dtype=np.int64)
            out["kv_bytes"] = np.zeros(len(t), dtype=np.int64)
        out["energy"] = out["energy"] + out["gap_energy"]
        return out


def sample_times(result: SimResult, period_s: float) -> np.ndarray:
    """Sample instants (virtual seconds since the start) from one period in to the end of the run."""
    count = max(1, math.ceil(result.duration_s / period_s))
    return period_s * np.arange(1, count + 1, dtype=np.float64)


def replica_samples(
    result: SimResult, replica: Replica, period_s: float, weight_bytes_per_gpu: int
) -> Iterator[SampleColumns]:
    """The samples of every GPU of ``replica`` (its ranks share the iteration timeline)."""
    spec = gpu_spec(result.layout.gpu)
    t = sample_times(result, period_s)
    pool = replica.pool
    locked = pool.sm_clock_mhz
    cum = CumulativeCounters(replica.intervals, spec, locked[1] if locked else None)
    now = cum.at(t)
    # the counters at each period's start: the previous sample's, the first period's at 0 (at() is
    # elementwise: the same values as evaluating it again at those instants)
    zero = cum.at(np.zeros(1))
    before = {name: np.concatenate((zero[name], values[:-1])) for name, values in now.items()}
    dt = np.diff(np.concatenate(([0.0], t)))
    busy = now["busy"] - before["busy"]
    pct = 100.0 / dt
    power = (now["energy"] - before["energy"]) / dt
    limit = float(pool.power_limit_w if pool.power_limit_w is not None else spec.tdp_w)
    gap_clock = np.asarray(
        gap_sm_clock_mhz(
            spec,
            now["since_busy"],
            held_mhz=locked[1] if locked else None,
            idle_mhz=locked[0] if locked else None,
        ),
        dtype=np.float64,
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        busy_clock = (now["clock"] - before["clock"]) / busy
    clock = np.where(busy > 1e-12, busy_clock, gap_clock).round().astype(np.int64)
    capped = (now["capped"] - before["capped"]) > 0
    reasons = np.where(busy > 0, 0, CLOCK_EVENT_GPU_IDLE) | np.where(capped, CLOCK_EVENT_SW_POWER_CAP, 0)
    temperature = _temperature(spec, power, dt)
    mem_used = np.minimum(weight_bytes_per_gpu + now["kv_bytes"] + CONTEXT_BYTES, spec.memory_bytes)
    n = len(t)
    base = {
        "ts_s": result.start_s + t,
        "gpu_util_pct": np.minimum(100.0, busy * pct),
        "mem_util_pct": np.minimum(100.0, (now["mem"] - before["mem"]) * pct),
        "sm_active_pct": (now["sm"] - before["sm"]) * pct,
        "sm_occupancy_pct": (now["occ"] - before["occ"]) * pct,
        "tensor_active_pct": (now["tensor"] - before["tensor"]) * pct,
        "dram_active_pct": (now["dram"] - before["dram"]) * pct,
        "power_w": power,
        "energy_mj": np.floor(now["energy"] * 1000.0).astype(np.int64),
        "power_limit_w": np.full(n, limit),
        "sm_clock_mhz": clock,
        "mem_clock_mhz": np.full(n, spec.mem_clock_mhz, dtype=np.int64),
        "temperature_c": temperature.round(2),
        "mem_used_bytes": mem_used.astype(np.int64),
        "mem_total_bytes": np.full(n, spec.memory_bytes, dtype=np.int64),
        "clock_event_reasons": reasons.astype(np.uint64),
        "locked_sm_clock_min_mhz": [pool.sm_clock_mhz[0] if pool.sm_clock_mhz else None] * n,
        "locked_sm_clock_max_mhz": [pool.sm_clock_mhz[1] if pool.sm_clock_mhz else None] * n,
    }
    for g in replica.gpus:
        yield SampleColumns(g.index, g.uuid, replica.id, replica.role, base)


def _temperature(spec: GpuSpec, power_w: np.ndarray, dt: np.ndarray) -> np.ndarray:
    """The emulated device's first-order thermal model, stepped over the sample periods."""
    temp = spec.ambient_c + spec.thermal_c_per_w * spec.idle_w
    steady = spec.ambient_c + spec.thermal_c_per_w * power_w
    decay = np.exp(-dt / spec.thermal_tau_s)
    out = []  # a recurrence: stepped in Python floats (the same float64 arithmetic as numpy's scalars)
    append = out.append
    for s, d in zip(steady.tolist(), decay.tolist(), strict=True):
        temp = s + (temp - s) * d
        append(temp)
    return np.asarray(out, dtype=np.float64).reshape(power_w.shape)


def energy_j(result: SimResult) -> float:
    """Every GPU's modeled energy over the run (its counters at the end), in joules."""
    spec = gpu_spec(result.layout.gpu)
    total = 0.0
    for replica in result.replicas:
        locked = replica.pool.sm_clock_mhz
        cum = CumulativeCounters(replica.intervals, spec, locked[1] if locked else None)
        total += float(cum.at(np.asarray([result.duration_s]))["energy"][0]) * len(replica.gpus)
    return total
