"""The iteration event's fields (docs/TELEMETRY.md) in one place, and a batch of them held as columns.

An engine's iteration event is its engine's fields (``worker``, ``device``), its GPU's
(``gpu_uuid``, ``gpu_index``) and the iteration's values (:data:`ITERATION_VALUE_FIELDS`, from
:func:`serving.engine_core.iteration_values`), plus an executor's extra fields. The live engine
sends it as a dict (:func:`iteration_event_of`) in the envelope every reader sees. The simulator, in
process, can hand its store writer an :class:`IterationBatch` instead: the same batch (source,
seq, sent_s, the same events in the same order) kept as one row of values per iteration, each
repeated for each of the engine's GPUs. :meth:`IterationBatch.envelope` is that batch as the
envelope; :meth:`IterationBatch.columns` its events as numpy columns, which the store writes
without a dict per event. Its router's batches go as a :class:`TokenTimesBatch`: the envelope with each
request event's ``token_ts_s`` a float64 array (the store's tokens rows are built from it without a
float object per token). Nothing outside the process ever sees either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from serving.telemetry import Batch, Event, envelope

#: the iteration's values of an ``iteration`` event, in the event's order (after worker, device,
#: gpu_uuid, gpu_index)
ITERATION_VALUE_FIELDS = (
    "start_s",
    "end_s",
    "phase",
    "batch_size",
    "prefill_tokens",
    "decode_seqs",
    "context_tokens",
    "kv_blocks_used",
    "kv_blocks_total",
    "preempted",
    "compute_s",
    "pacing_s",
    "modeled_s",
    "lag_s",
    "flops",  # the iteration's work on one GPU (serving/devices/roofline.py); None: not counted
    "hbm_bytes",
)


def iteration_event_of(
    worker: str,
    device: str,
    gpu_uuid: str,
    gpu_index: int,
    values: tuple[Any, ...],
    extra: dict[str, Any] | None,
) -> Event:
    """The ``iteration`` event of one GPU from the iteration's ``values`` (``ITERATION_VALUE_FIELDS``)
    and the executor's ``extra`` fields."""
    event = {
        "type": "iteration",
        "worker": worker,
        "device": device,
        "gpu_uuid": gpu_uuid,
        "gpu_index": gpu_index,
    }
    event.update(zip(ITERATION_VALUE_FIELDS, values, strict=True))
    if extra:
        event.update(extra)
    return event


@dataclass(slots=True)
class IterationBatch:
    """A telemetry batch of one engine's ``iteration`` events (its ``seq``-th from ``source``), as
    rows: ``rows[i]`` holds iteration ``i``'s values (``ITERATION_VALUE_FIELDS``), ``extras[i]`` its
    extra fields; each iteration is one event per GPU of ``gpus`` ((uuid, index), in order). The
    batch holds ``n`` events starting ``skip`` GPUs into ``rows[0]`` (a batch boundary may fall
    between the GPUs of one iteration)."""

    source: str
    seq: int
    sent_s: float
    worker: str
    device: str
    gpus: tuple[tuple[str, int], ...]
    rows: list[tuple[Any, ...]]
    extras: list[dict[str, Any] | None]
    n: int
    skip: int = 0
    dropped_events_total: int = 0
    _columns: dict[str, Any] | None = field(default=None, repr=False)

    def events(self) -> list[Event]:
        """The batch's events as dicts, exactly as the live engine builds them."""
        worker, device, gpus = self.worker, self.device, self.gpus
        out: list[Event] = []
        skip, left = self.skip, self.n
        for values, extra in zip(self.rows, self.extras, strict=True):
            for uuid, index in gpus[skip:]:
                if left == 0:
                    return out
                out.append(iteration_event_of(worker, device, uuid, index, values, extra))
                left -= 1
            skip = 0
        return out

    def envelope(self) -> Batch:
        """The batch as the telemetry envelope (docs/TELEMETRY.md)."""
        return envelope(self.source, self.seq, self.sent_s, self.dropped_events_total, self.events())

    def columns(self) -> dict[str, Any]:
        """The events' ``gpu_uuid``, ``gpu_index`` and ``ITERATION_VALUE_FIELDS`` as numpy columns of
        ``n`` values (``worker`` and ``device`` are the batch's). A column whose values are not all of
        one plain kind (a None, a bool, mixed types) comes back with dtype object; the caller checks."""
        if self._columns is not None:
            return self._columns
        tp, n, skip = len(self.gpus), self.n, self.skip
        whole = skip == 0 and n == len(self.rows) * tp  # every GPU of every row (the usual batch)
        if whole:
            it = rank = None
        else:
            event = np.arange(skip, skip + n)
            it, rank = event // tp, event % tp
        cols: dict[str, Any] = {}
        uuids = np.array([g[0] for g in self.gpus], dtype=object)
        indexes = np.array([g[1] for g in self.gpus], dtype=np.int64)
        cols["gpu_uuid"] = np.tile(uuids, len(self.rows)) if whole else uuids[rank]
        cols["gpu_index"] = np.tile(indexes, len(self.rows)) if whole else indexes[rank]
        for name, values in zip(ITERATION_VALUE_FIELDS, zip(*self.rows, strict=True), strict=True):
            column = _column(values)
            cols[name] = (column if tp == 1 else np.repeat(column, tp)) if whole else column[it]
        self._columns = cols
        return cols


def _column(values: tuple[Any, ...]) -> np.ndarray:
    """``values`` as one numpy column: int64, float64 (ints among floats kept exact only below
    2**53, as the store's DOUBLE does) or object (strings, and anything mixed or None)."""
    kinds = set(map(type, values))
    try:
        if kinds == {int}:
            return np.array(values, dtype=np.int64)
        if kinds == {float} or kinds == {int, float}:
            return np.array(values, dtype=np.float64)
    except OverflowError:  # an integer beyond int64
        pass
    return np.array(values, dtype=object)


@dataclass(slots=True)
class TokenTimesBatch:
    """A telemetry batch (``batch``, the envelope) whose ``request`` events carry ``token_ts_s`` as a
    float64 numpy array rather than a list: the simulator's in-process form of its router's batches.
    :meth:`envelope` is the batch every reader outside the process sees (the lists)."""

    batch: Batch

    def envelope(self) -> Batch:
        """The batch as the telemetry envelope (docs/TELEMETRY.md): the token times as lists."""
        events = [
            {**e, "token_ts_s": times.tolist()} if isinstance(times := e.get("token_ts_s"), np.ndarray) else e
            for e in self.batch["events"]
        ]
        return {**self.batch, "events": events}
