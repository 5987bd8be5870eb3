"""A simulation's telemetry on its way out: each source's pending events, cut into batches of the
live stack's format (docs/TELEMETRY.md) and delivered in the order the live stack would send them.

The router's events are envelopes (a :class:`~serving.telemetry_columns.TokenTimesBatch` in a
columnar run); a worker's iteration events are held as one row of values per iteration
(:func:`~serving.engine_core.iteration_values`), each an event per GPU of the worker, and go out as
an :class:`~serving.telemetry_columns.IterationBatch` (columnar) or its envelope.

Delivery order: a batch goes out in the order of its ``sent_s`` (the virtual time its last event
was emitted), ties in the order emitted. A replica running a decode run (:mod:`serving.sim.decode_runs`)
emits its iterations' events when the run is committed, after other sources may have sent later
batches; :meth:`SimTelemetry.deliver` holds each batch until no run still open can emit an earlier
one (``horizon_s``), so the order is the one the iteration-by-iteration loop gives.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from serving.telemetry import envelope
from serving.telemetry_columns import IterationBatch, TokenTimesBatch

BATCH_EVENTS = 4096  # events per telemetry batch (the live stack batches by time; the size is free)


@dataclass(slots=True)
class IterationRows:
    """A replica's iteration events not yet in a batch: one row of values per iteration
    (:func:`~serving.engine_core.iteration_values`), ``skip`` GPUs of the first already sent."""

    rows: list[tuple[Any, ...]] = field(default_factory=list)
    extras: list[dict[str, Any] | None] = field(default_factory=list)
    skip: int = 0
    events: int = 0  # events pending: len(rows) * tp - skip


class SimTelemetry:
    """The pending events of every source of a run and the batches made of them.

    ``on_batch(batch)`` receives each batch (None: they are kept in ``batches``); ``columnar``: a
    worker's batch goes as an :class:`IterationBatch`, the router's as a :class:`TokenTimesBatch`.
    ``horizon_s()`` (optional) is the earliest ``sent_s`` a batch not yet made can still have; batches
    from then on are held until it has passed (None: each goes out at once)."""

    def __init__(
        self,
        on_batch: Callable[[Any], None] | None,
        columnar: bool,
        workers: dict[str, Any],
        horizon_s: Callable[[], float] | None = None,
    ) -> None:
        self.batches: list[Any] = []
        self.emitted = 0
        self._on_batch = on_batch
        self._columnar = columnar and on_batch is not None
        self._workers = workers  # source -> its EngineCore (worker id, device, gpus)
        # per source, in the order of its first event: the router's events, a worker's iteration rows
        self._pending: dict[str, list[dict[str, Any]] | IterationRows] = {}
        self._seq: dict[str, int] = {}
        self._horizon_s = horizon_s
        self._held: list[tuple[float, int, Any]] = []  # (sent_s, order, batch): a heap
        self._order = itertools.count()

    @property
    def columnar(self) -> bool:
        return self._columnar

    def emit(self, source: str, event: dict[str, Any], now_s: float) -> None:
        """Queue one event of ``source`` (the router's); a full batch goes out."""
        events = self._pending.setdefault(source, [])
        events.append(event)
        if len(events) >= BATCH_EVENTS:
            self.flush_source(source, now_s)

    def emit_iteration(self, source: str, tp: int, values: tuple[Any, ...], extra: Any, now_s: float) -> None:
        """Queue an iteration's events (one per GPU of the worker ``source``); a full batch goes out."""
        pending = self._pending.get(source)
        if pending is None:
            pending = self._pending[source] = IterationRows()
        pending.rows.append(values)
        pending.extras.append(extra)
        pending.events += tp
        if pending.events >= BATCH_EVENTS:  # the batch ends with its BATCH_EVENTS-th event
            self._flush_iterations(source, pending, now_s, BATCH_EVENTS)

    def emit_iterations(
        self, source: str, tp: int, rows: list[tuple[Any, ...]], extras: list[Any], sent_s: list[float]
    ) -> None:
        """:meth:`emit_iteration` for each of ``rows`` in turn (``sent_s``: each one's time), in one
        step while no batch fills."""
        pending = self._pending.get(source)
        if pending is not None and pending.events + len(rows) * tp < BATCH_EVENTS:
            pending.rows += rows
            pending.extras += extras
            pending.events += len(rows) * tp
            return
        for values, extra, now_s in zip(rows, extras, sent_s, strict=True):
            self.emit_iteration(source, tp, values, extra, now_s)

    def flush_source(self, source: str, now_s: float) -> None:
        """Send what ``source`` has pending (a worker's whole GPUs' events only)."""
        events = self._pending.get(source)
        if isinstance(events, IterationRows):
            if events.events:
                self._flush_iterations(source, events, now_s, events.events)
            return
        if not events:
            return
        self._pending[source] = []
        batch = envelope(source, self._next_seq(source), now_s, 0, events)
        self.deliver(TokenTimesBatch(batch) if self._columnar else batch, now_s)

    def flush_all(self, now_s: float) -> None:
        """Send everything pending, then every batch held (the run's end)."""
        for source in list(self._pending):
            self.flush_source(source, now_s)
        self._release(float("inf"))

    def _next_seq(self, source: str) -> int:
        seq = self._seq.get(source, 0)
        self._seq[source] = seq + 1
        return seq

    def deliver(self, batch: Any, sent_s: float) -> None:
        """Send ``batch`` (made at ``sent_s``) in its place in the order of sending."""
        if self._horizon_s is None:
            self._send(batch)
            return
        heapq.heappush(self._held, (sent_s, next(self._order), batch))
        self._release(self._horizon_s())

    def _release(self, horizon_s: float) -> None:
        held = self._held
        while held and held[0][0] < horizon_s:
            self._send(heapq.heappop(held)[2])

    def _send(self, batch: Any) -> None:
        self.emitted += 1
        if self._on_batch is None:
            self.batches.append(batch)
        else:
            self._on_batch(batch)

    def _flush_iterations(self, source: str, pending: IterationRows, now_s: float, n: int) -> None:
        core = self._workers[source]
        tp = len(core.gpus)
        end = pending.skip + n  # events of the rows taken, counted from rows[0]'s first GPU
        taken = -(-end // tp)
        batch = IterationBatch(
            source,
            self._next_seq(source),
            now_s,
            source,
            core.device_name,
            tuple(core.gpus),
            pending.rows[:taken],
            pending.extras[:taken],
            n,
            pending.skip,
        )
        keep = taken - (1 if end % tp else 0)  # a row whose last GPUs are not sent stays
        del pending.rows[:keep], pending.extras[:keep]
        pending.skip = end % tp
        pending.events -= n
        if self._columnar:
            batch.columns()  # now, while its rows are in the cache; the store reads them later
            self.deliver(batch, now_s)
        else:
            self.deliver(batch.envelope(), now_s)
