"""A simulated run's compact records: each replica's GPU busy intervals and each finished request's
figures, as typed arrays (a fleet's hour is millions of iterations)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_BUSY_COLUMNS = (  # the busy_values of an estimate, in order, and their array types
    ("power_w", "d"),
    ("sm_clock_mhz", "i"),
    ("sm_active", "d"),
    ("sm_occupancy", "d"),
    ("tensor_active", "d"),
    ("dram_active", "d"),
    ("mem_active", "d"),
    ("capped", "b"),
)


def _doubles() -> array:
    return array("d")


class BusyTable:
    """The distinct :func:`busy_values` of an executor's estimates, as columns: each gets an id (its
    row) when it is first seen (its estimate computed), and the busy intervals of the iterations it
    times hold only that id. An id is made where its values are in hand, so a run's end reads the
    iterations' values from this table with numpy instead of from tuples spread over the run's memory."""

    __slots__ = ("columns",)

    def __init__(self) -> None:
        self.columns = tuple(array(code) for _name, code in _BUSY_COLUMNS)

    def add(self, values: tuple[Any, ...]) -> int:
        """The id of a new row of ``values`` (:func:`busy_values` of one estimate)."""
        c = self.columns  # one append per column, unrolled (once per estimate made)
        c[0].append(values[0])
        c[1].append(values[1])
        c[2].append(values[2])
        c[3].append(values[3])
        c[4].append(values[4])
        c[5].append(values[5])
        c[6].append(values[6])
        c[7].append(values[7])
        return len(c[0]) - 1


@dataclass(slots=True)
class Busy:
    """A replica's GPU busy intervals (one per iteration), as compact columns; every rank of the
    replica runs the same iteration, so its GPUs share them. Times are virtual seconds since the
    run's ``start_s``. Each iteration's power, clock and activities are a row of ``table`` (its
    estimate's), held as that row's id until :meth:`settle` fills their columns."""

    table: BusyTable = field(default_factory=BusyTable)
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
    ids: array = field(default_factory=lambda: array("q"))  # each iteration's row of ``table``
    settled: int = 0  # iterations whose columns are filled

    def add(self, start_s: float, end_s: float, row: int, kv_bytes: int) -> None:
        """One iteration's busy interval: ``row`` is its estimate's id in ``table``."""
        self.start_s.append(start_s)
        self.end_s.append(end_s)
        self.kv_bytes.append(kv_bytes)
        self.ids.append(row)

    def extend(self, start_s: list[float], end_s: Any, rows: list[int], kv_bytes: list[int]) -> None:
        """:meth:`add` of several iterations in order (columns of equal length)."""
        self.start_s.extend(start_s)
        self.end_s.extend(end_s)
        self.kv_bytes.extend(kv_bytes)
        self.ids.extend(rows)

    def settle(self) -> None:
        """Fill the power, clock and activity columns of the iterations added since the last call
        (the simulation does at its end)."""
        if self.settled == len(self.ids):
            return
        rows = np.frombuffer(self.ids, dtype=np.int64)[self.settled :]
        self.settled = len(self.ids)
        for (name, code), column in zip(_BUSY_COLUMNS, self.table.columns, strict=True):
            values = np.frombuffer(column, dtype=np.dtype(code))
            getattr(self, name).frombytes(values[rows].tobytes())
        del rows, values  # the buffers' views: their arrays may grow again


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
