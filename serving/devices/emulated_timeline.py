"""The modeled timeline of an emulated GPU: the busy intervals it ran, the counters integrated over them.

:class:`BusyTimeline` keeps a short history of modeled busy intervals (one per engine iteration,
:class:`BusyInterval`), integrates the cumulative counters (energy, busy and activity seconds) and a
first-order thermal model over them, with the gap model (:func:`~serving.devices.gpu_model.gap_power_w`)
between iterations, and computes the trailing-window means a snapshot reports. It holds no lock and
reads no clock: :class:`~serving.devices.emulated.EmulatedDevice` owns both and calls it under its lock.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from serving.devices.gpu_model import EmulationConstants, _gap_energy_scalar
from serving.devices.gpu_specs import GpuSpec

__all__ = ["CLOCK_EVENT_GPU_IDLE", "CLOCK_EVENT_SW_POWER_CAP", "BusyInterval", "BusyTimeline"]

# NVML clock-event (throttle) reason bits the emulator sets.
CLOCK_EVENT_GPU_IDLE = 0x1
CLOCK_EVENT_SW_POWER_CAP = 0x4


@dataclass(slots=True)
class BusyInterval:
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
    held_mhz: int  # the clock the GPU holds in the gap after this interval (the allowed ceiling)


class BusyTimeline:
    """The busy intervals of one emulated GPU since ``opened`` and the counters integrated over them.

    ``history_s`` is how much history is kept (the longest window a snapshot may average over).
    Counters are integrated up to :attr:`cursor`; a busy interval is never placed before it
    (:meth:`place`), so each is integrated exactly once, whole.
    """

    def __init__(self, gpu: GpuSpec, constants: EmulationConstants, history_s: float, opened: float) -> None:
        self._gpu = gpu
        self._constants = constants
        self._history_s = history_s
        self._clocks = gpu.supported_sm_clocks_mhz()
        self.history: deque[BusyInterval] = deque()
        self.end = opened  # end of the last busy interval on the accounted timeline
        self.cursor = opened  # the counters are integrated (and may have been reported) up to here
        self._reports: deque[tuple[float, bool]] = deque()  # (when the host reported it, lagged)
        # the last busy interval trimmed from the history (its end and held clock), for gap power
        self._trimmed_end = -math.inf
        self._trimmed_held_mhz = gpu.max_sm_clock_mhz
        # the last busy interval integrated whole into the counters (its end and held clock)
        self._integrated_end = -math.inf
        self._integrated_held_mhz = gpu.max_sm_clock_mhz
        # cumulative counters over [opened, cursor]
        self.energy_j = self.busy_s = self.sm_s = self.occ_s = 0.0
        self.tensor_s = self.dram_s = self.mem_s = 0.0
        self.temp_c = gpu.ambient_c + gpu.thermal_c_per_w * gpu.idle_w

    # --- adding iterations ----------------------------------------------------------------------

    def held_mhz(self, locked: tuple[int, int] | None) -> int:
        """The clock an idle GPU holds after a kernel: the top the locked range allows, else f_max."""
        if locked is None:
            return self._gpu.max_sm_clock_mhz
        below = [f for f in self._clocks if f <= locked[1]]
        return below[-1] if below else self._clocks[0]

    def place(self, modeled_start: float, time_s: float) -> float:
        """Where an iteration of ``time_s`` modeled to start at ``modeled_start`` goes on the timeline:
        not before the cursor (the counters never change behind a reading) nor the previous one's end.
        Moves :attr:`end` past it and returns its start."""
        start = max(modeled_start, self.cursor, self.end)
        self.end = start + time_s
        return start

    def add(self, busy: BusyInterval, reported_at: float, lagged: bool) -> None:
        """Keep ``busy`` (placed by :meth:`place`) and the host's report of it (when, and whether the
        host lagged the modeled GPU); integrate and trim once the oldest entry falls out of the history."""
        self.history.append(busy)
        self._reports.append((reported_at, lagged))
        horizon = reported_at - self._history_s
        if self.history[0].end < horizon or self._reports[0][0] < horizon:
            self.advance(reported_at)
            self._trim(reported_at)

    # --- integration ----------------------------------------------------------------------------

    def _gap_j(self, since0: float, since1: float, held_mhz: int) -> float:
        """Energy of the idle stretch from ``since0`` to ``since1`` seconds after a busy interval."""
        x = held_mhz / self._gpu.max_sm_clock_mhz
        c = self._constants
        return _gap_energy_scalar(self._gpu, since1, c, x) - _gap_energy_scalar(self._gpu, since0, c, x)

    def _gap_clock_s(self, since0: float, since1: float, held_mhz: int, idle_mhz: int) -> float:
        """Integral of the gap SM clock (MHz x s) from ``since0`` to ``since1`` after a busy interval."""
        hold = self._constants.gap_hold_s
        held = max(0.0, min(since1, hold) - min(since0, hold))
        return held * held_mhz + (since1 - since0 - held) * idle_mhz

    def _idle_segment(self, t0: float, t1: float, last_end: float, held_mhz: int) -> None:
        """Add the idle stretch ``[t0, t1]`` (the last busy interval ended at ``last_end``)."""
        dt = t1 - t0
        if dt <= 0:
            return
        energy = self._gap_between(t0, t1, last_end, held_mhz)
        self.energy_j += energy
        self._relax(energy / dt, dt)

    def _busy_segment(self, busy: BusyInterval, dt: float) -> None:
        """Add ``dt`` seconds of ``busy`` to the cumulative counters and the thermal model."""
        if dt <= 0:
            return
        self.energy_j += busy.power_w * dt
        self.busy_s += dt
        self.sm_s += busy.sm_active * dt
        self.occ_s += busy.sm_occupancy * dt
        self.tensor_s += busy.tensor_active * dt
        self.dram_s += busy.dram_active * dt
        self.mem_s += busy.mem_active * dt
        self._relax(busy.power_w, dt)

    def _relax(self, power_w: float, dt: float) -> None:
        g = self._gpu
        steady = g.ambient_c + g.thermal_c_per_w * power_w
        self.temp_c = steady + (self.temp_c - steady) * math.exp(-dt / g.thermal_tau_s)

    def _before(self, t: float) -> tuple[float, int]:
        """(end, held clock) of the last busy interval ending at or before ``t`` (-inf when none)."""
        end, held = self._trimmed_end, self._trimmed_held_mhz
        for busy in self.history:
            if busy.end > t:
                break
            end, held = busy.end, busy.held_mhz
        return end, held

    def advance(self, now: float) -> None:
        """Integrate the counters from the cursor up to ``now`` (gap power between iterations).

        Busy intervals are never placed before the cursor (see :meth:`place`), so each is integrated
        exactly once, whole.
        """
        t = self.cursor
        if now <= t:
            return
        last_end, held = self._integrated_end, self._integrated_held_mhz
        for busy in self.history:
            if busy.end <= t:
                continue
            if busy.start >= now:
                break
            if busy.start > t:
                self._idle_segment(t, busy.start, last_end, held)
                t = busy.start
            stop = min(busy.end, now)
            self._busy_segment(busy, stop - t)
            t = stop
            if stop >= busy.end:
                last_end, held = busy.end, busy.held_mhz
        self._idle_segment(t, now, last_end, held)
        self.cursor = now
        self._integrated_end, self._integrated_held_mhz = last_end, held

    def _trim(self, now: float) -> None:
        horizon = min(now - self._history_s, self.cursor)
        while self.history and self.history[0].end < horizon:
            gone = self.history.popleft()
            self._trimmed_end, self._trimmed_held_mhz = gone.end, gone.held_mhz
        while self._reports and self._reports[0][0] < now - self._history_s:
            self._reports.popleft()

    # --- reading ----------------------------------------------------------------------------------

    def window(self, w0: float, w1: float, idle_mhz: int) -> dict[str, float | int | None]:
        """Time-weighted means over ``[w0, w1]``; idle time counts as zero activity, at the gap
        model's power and clock (``idle_mhz``: the clock a sustained gap falls to)."""
        length = w1 - w0
        busy = energy = clock = sm = occ = tensor = dram = mem = 0.0
        capped = False
        last_end, held = self._before(w0)
        t = w0
        for b in self.history:
            if b.end <= w0:
                continue
            if b.start >= w1:
                break
            if b.start > t:
                energy += self._gap_between(t, b.start, last_end, held)
                clock += self._gap_clock_between(t, b.start, last_end, held, idle_mhz)
                t = b.start
            overlap = min(b.end, w1) - max(b.start, w0)
            t = min(b.end, w1)
            last_end, held = b.end, b.held_mhz
            busy += overlap
            energy += overlap * b.power_w
            clock += overlap * b.sm_clock_mhz
            sm += overlap * b.sm_active
            occ += overlap * b.sm_occupancy
            tensor += overlap * b.tensor_active
            dram += overlap * b.dram_active
            mem += overlap * b.mem_active
            capped = capped or b.capped
        if t < w1:
            energy += self._gap_between(t, w1, last_end, held)
            clock += self._gap_clock_between(t, w1, last_end, held, idle_mhz)
        reasons = (0 if busy > 0 else CLOCK_EVENT_GPU_IDLE) | (CLOCK_EVENT_SW_POWER_CAP if capped else 0)
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
            "sm_clock_mhz": round(clock / length),
            "clock_event_reasons": reasons,
            "host_bound_pct": 100.0 * sum(reported) / len(reported) if reported else None,
        }

    def _gap_between(self, t0: float, t1: float, last_end: float, held_mhz: int) -> float:
        if last_end == -math.inf:
            return self._gpu.idle_w * (t1 - t0)
        return self._gap_j(t0 - last_end, t1 - last_end, held_mhz)

    def _gap_clock_between(
        self, t0: float, t1: float, last_end: float, held_mhz: int, idle_mhz: int
    ) -> float:
        if last_end == -math.inf:
            return idle_mhz * (t1 - t0)
        return self._gap_clock_s(t0 - last_end, t1 - last_end, held_mhz, idle_mhz)
