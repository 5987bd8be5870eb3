"""A simulated run's compact records: each replica's GPU busy intervals and each finished request's
figures, as typed arrays (a fleet's hour is millions of iterations)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

BUSY_CHUNK = 4096  # iterations whose values a replica's busy intervals hold before appending them


def _doubles() -> array:
    return array("d")


@dataclass(slots=True)
class Busy:
    """A replica's GPU busy intervals (one per iteration), as compact columns; every rank of the
    replica runs the same iteration, so its GPUs share them. Times are virtual seconds since the
    run's ``start_s``."""

    start_s: array = field(default_factory=_doubles)
    end_s: array = field(default_factory=_doubles)
    power_w: array = field(default_factory=_doubles)
    sm_clock_mhz: array = field(default_factory=lambda: array("i"))
    sm_active: array = field(default_factory=_doubles)
    sm_occupancy: array = field(default_factory=_doubles)
    tensor_active: array = field(default_factory=_doubles)
    dram_active: array = field(default_factory=_doubles)
    mem_active: array = field(default_factory=_doubles)
    capped: array = field(default_factory=lambda: array("b"))
    kv_bytes: array = field(default_factory=lambda: array("q"))  # KV in use during the iteration (per GPU)
    # the power, clock and activities of the iterations not appended yet (:func:`busy_values` of
    # each one's estimate; an estimate's tuple is made once and shared by the iterations it times),
    # appended in chunks by ``settle``: one list append per iteration rather than eight array appends
    pending: list[tuple[Any, ...]] = field(default_factory=list)

    def add(self, start_s: float, end_s: float, values: tuple[Any, ...], kv_bytes: int) -> None:
        """One iteration's busy interval: ``values`` are its estimate's :func:`busy_values`."""
        self.start_s.append(start_s)
        self.end_s.append(end_s)
        self.kv_bytes.append(kv_bytes)
        pending = self.pending
        pending.append(values)
        if len(pending) >= BUSY_CHUNK:
            self.settle()

    def settle(self) -> None:
        """Append the pending iterations' columns (the simulation does at its end)."""
        if not self.pending:
            return
        power, clock, sm, occupancy, tensor, dram, mem, capped = zip(*self.pending, strict=True)
        self.pending = []
        self.power_w.extend(power)
        self.sm_clock_mhz.extend(clock)
        self.sm_active.extend(sm)
        self.sm_occupancy.extend(occupancy)
        self.tensor_active.extend(tensor)
        self.dram_active.extend(dram)
        self.mem_active.extend(mem)
        self.capped.extend(capped)


def busy_values(est: Any) -> tuple[Any, ...]:
    """What a replica's busy intervals keep of an iteration's estimate (an
    :class:`~serving.devices.gpu_model.IterationEstimate`): power, SM clock, SM activity and
    occupancy, tensor and DRAM activity, memory activity (the memory-bound share of the busy
    time) and whether the power cap bound."""
    busy_s = est.busy_s
    return (
        est.power_w,
        est.sm_clock_mhz,
        est.sm_active,
        est.sm_occupancy,
        est.tensor_active,
        est.dram_active,
        min(1.0, est.memory_s / busy_s) if busy_s > 0 else 0.0,
        est.power_capped,
    )


@dataclass(slots=True)
class RequestStats:
    """Per request that finished ok, compact columns for the run's summary (epoch seconds), and
    every inter-token gap; filled whether or not the telemetry batches are kept (failed requests
    are counted in ``SimResult.failed``)."""

    arrival_s: array = field(default_factory=_doubles)
    first_token_s: array = field(default_factory=_doubles)
    finish_s: array = field(default_factory=_doubles)
    prompt_tokens: array = field(default_factory=lambda: array("q"))
    output_tokens: array = field(default_factory=lambda: array("q"))
    itl_s: array = field(default_factory=_doubles)
