"""Iteration batches handed over as columns (:class:`serving.telemetry_columns.IterationBatch`, the
simulator's in-process form of a worker's telemetry batch) turned into ``iterations`` rows.

The rows are those the batch's envelope gives through the event-by-event path
(collector/store/telemetry_rows.py), built from numpy columns with no dict per event. The checks
are that path's, made per column: a batch with any value the contract refuses (a missing required
field, a non-finite time, a bool or float where an integer belongs, an unknown phase) goes through
the event-by-event path instead, which leaves out and counts exactly the events it would have.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from collector.store.telemetry_rows import ALLOWED_VALUES, ITERATION_FIELDS, BatchKey, BatchSplit, _is_num
from serving.telemetry_columns import IterationBatch


def check_iteration_envelope(batch: IterationBatch, node: str, received_s: float) -> BatchSplit:
    """``check_envelope`` for an :class:`IterationBatch`: its source and key, or why it is refused."""
    if not isinstance(batch.source, str) or not batch.source:
        out = BatchSplit(source="unknown")
        out.rejected_batch = "telemetry batch field 'source' must be str"
        out.errors["invalid_batch", out.rejected_batch] += 1
        return out
    if type(batch.seq) is not int:
        out = BatchSplit(source=batch.source)
        out.rejected_batch = "telemetry batch field 'seq' must be int"
        out.errors["invalid_batch", out.rejected_batch] += 1
        return out
    sent_s = float(batch.sent_s) if _is_num(batch.sent_s) else received_s
    key: BatchKey = (node, batch.source, batch.seq, sent_s)
    return BatchSplit(source=batch.source, key=key)


_PHASES = ALLOWED_VALUES["iteration", "phase"]
_INT_KIND = np.dtype(np.int64)
_NUM_KINDS = (np.dtype(np.int64), np.dtype(np.float64))


def columns_fit(batch: IterationBatch) -> dict[str, Any] | None:
    """The batch's columns when every event passes the contract's checks, else None."""
    if not (isinstance(batch.worker, str) and isinstance(batch.device, str)):
        return None
    if not all(type(u) is str and type(i) is int for u, i in batch.gpus):
        return None
    cols = batch.columns()
    for name, (kind, _required) in ITERATION_FIELDS.items():
        if name in ("worker", "device", "gpu_uuid", "gpu_index"):
            continue
        values = cols[name]
        if kind == "str":  # the phase: one of the allowed (so a string), per event
            try:
                if not set(values) <= _PHASES:
                    return None
            except TypeError:  # unhashable
                return None
        elif kind == "int":
            if values.dtype != _INT_KIND:
                return None
        elif values.dtype not in _NUM_KINDS or (values.dtype == np.float64 and not np.isfinite(values).all()):
            return None
    return cols


class IterationBlocks:
    """The column batches of one store write, joined into one Arrow table of ``iterations`` rows."""

    def __init__(self) -> None:
        self._parts: list[tuple[str, int, str, str, int, dict[str, Any]]] = []

    def add(self, batch: IterationBatch, cols: Mapping[str, Any]) -> None:
        self._parts.append((batch.source, batch.seq, batch.worker, batch.device, batch.n, dict(cols)))

    def __bool__(self) -> bool:
        return bool(self._parts)

    def table(self, node: str) -> pa.Table:
        """Every part's rows as one table (``node`` the same for all), columns named as the table's."""
        parts = self._parts
        lengths = np.array([p[4] for p in parts], dtype=np.int64)
        n = int(lengths.sum())
        arrays: dict[str, pa.Array] = {
            "node": _constant(node, n),
            "source": _per_part([p[0] for p in parts], lengths),
            "batch_seq": pa.array(np.repeat(np.array([p[1] for p in parts], dtype=np.int64), lengths)),
            "worker": _per_part([p[2] for p in parts], lengths),
            "device": _per_part([p[3] for p in parts], lengths),
        }
        for name in ITERATION_FIELDS:
            if name in arrays:
                continue
            column = np.concatenate([p[5][name] for p in parts])
            arrays[name] = pa.array(column, type=pa.string() if column.dtype == object else None)
        return pa.Table.from_arrays(list(arrays.values()), names=list(arrays))


def _constant(value: str, n: int) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), pa.array([value]))


def _per_part(values: list[str], lengths: np.ndarray) -> pa.Array:
    """One string per part, repeated over its rows: dictionary-encoded (no string per row)."""
    distinct = list(dict.fromkeys(values))
    code = {v: i for i, v in enumerate(distinct)}
    indices = np.repeat(np.array([code[v] for v in values], dtype=np.int32), lengths)
    return pa.DictionaryArray.from_arrays(pa.array(indices), pa.array(distinct, type=pa.string()))
