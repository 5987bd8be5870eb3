"""A simulated run's compact records: each replica's GPU busy intervals and each finished request's
figures, as typed arrays (a fleet's hour is millions of iterations)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

BUSY_CHUNK = 4096  # iterations whose estimates a replica's busy intervals hold before appending them


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
    # the estimates of the iterations whose power, clock and activities are not appended yet (in
    # chunks, by ``settle``: one list append per iteration rather than eight array appends)
    pending: list[Any] = field(default_factory=list)

    def add(self, start_s: float, end_s: float, est: Any, kv_bytes: int) -> None:
        """One iteration's busy interval: ``est`` is its estimate (power, clock, activities)."""
        self.start_s.append(start_s)
        self.end_s.append(end_s)
        self.kv_bytes.append(kv_bytes)
        pending = self.pending
        pending.append(est)
        if len(pending) >= BUSY_CHUNK:
            self.settle()

    def settle(self) -> None:
        """Append the pending estimates' columns (the simulation does at its end)."""
        ests = self.pending
        if not ests:
            return
        self.power_w.extend([e.power_w for e in ests])
        self.sm_clock_mhz.extend([e.sm_clock_mhz for e in ests])
        self.sm_active.extend([e.sm_active for e in ests])
        self.sm_occupancy.extend([e.sm_occupancy for e in ests])
        self.tensor_active.extend([e.tensor_active for e in ests])
        self.dram_active.extend([e.dram_active for e in ests])
        self.mem_active.extend([min(1.0, e.memory_s / e.busy_s) if e.busy_s > 0 else 0.0 for e in ests])
        self.capped.extend([e.power_capped for e in ests])
        self.pending = []


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
