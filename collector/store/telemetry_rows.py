"""Serving telemetry batches (docs/TELEMETRY.md) turned into store rows, event by event.

Rows are built as columns (``TelemetryColumns``): the writer turns each into one typed Arrow
column per flush. A bad event never spoils its batch: it is left out and counted by ``(kind, message)``, and the
store writes those counts to ``ingest_errors``. Unknown fields are ignored, as the contract says.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from serving.telemetry import validate_batch

Row = dict[str, Any]

# Field kinds: "str", "num" (int or float, not bool), "int" (not bool), "nums" (list of num), "json".
_FieldSpec = tuple[str, bool]  # (kind, required)

ITERATION_FIELDS: dict[str, _FieldSpec] = {
    "worker": ("str", True),
    "device": ("str", False),
    "start_s": ("num", True),
    "end_s": ("num", True),
    "phase": ("str", True),
    "batch_size": ("int", False),
    "prefill_tokens": ("int", False),
    "decode_seqs": ("int", False),
    "context_tokens": ("int", False),
    "kv_blocks_used": ("int", False),
    "kv_blocks_total": ("int", False),
    "preempted": ("int", False),
    "compute_s": ("num", False),
    "pacing_s": ("num", False),
    "gpu_uuid": ("str", False),
    "gpu_index": ("int", False),
    "lag_s": ("num", False),
    "modeled_s": ("num", False),
    "flops": ("num", False),
    "hbm_bytes": ("num", False),
}

REQUEST_FIELDS: dict[str, _FieldSpec] = {
    "request_id": ("str", True),
    "arrival_s": ("num", True),
    "first_scheduled_s": ("num", False),
    "prefill_start_s": ("num", False),
    "prefill_end_s": ("num", False),
    "kv_transfer_start_s": ("num", False),
    "kv_transfer_end_s": ("num", False),
    "kv_transfer_bytes": ("int", False),
    "first_token_s": ("num", False),
    "token_ts_s": ("nums", False),
    "finish_s": ("num", False),
    "prompt_tokens": ("int", False),
    "output_tokens": ("int", False),
    "prefill_worker": ("str", False),
    "decode_worker": ("str", False),
    "status": ("str", False),
    "finish_reason": ("str", False),
    "error": ("str", False),
    "attempts": ("int", False),
    "preemptions": ("int", False),
}

CONTROL_FIELDS: dict[str, _FieldSpec] = {
    "ts_s": ("num", True),
    "action": ("str", True),
    "target": ("str", False),
    "before": ("json", False),
    "after": ("json", False),
    "actor": ("str", False),
}

ALLOWED_VALUES: dict[tuple[str, str], frozenset[str]] = {
    ("iteration", "phase"): frozenset({"prefill", "decode", "mixed"}),
    ("request", "status"): frozenset({"ok", "error", "aborted"}),
}

_EVENT_FIELDS = {"iteration": ITERATION_FIELDS, "request": REQUEST_FIELDS, "control": CONTROL_FIELDS}


_BASE = ("source", "batch_seq")  # on iterations, requests and control_events rows (and node)
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "telemetry_batches": (
        "source",
        "seq",
        "sent_s",
        "received_s",
        "events",
        "rejected_events",
        "dropped_events_total",
        "endpoint",
    ),
    "iterations": (*_BASE, *ITERATION_FIELDS),
    "requests": (*_BASE, *(f for f in REQUEST_FIELDS if f != "token_ts_s")),
    "tokens": ("request_id", "idx", "ts_s", "itl_s", "worker"),
    "control_events": (*_BASE, *CONTROL_FIELDS),
}
BatchKey = tuple[str, str, int, float]  # (node, source, seq, sent_s): the same batch read twice


@dataclass(slots=True)
class BatchSplit:
    """What one batch gave: rows per table, and the events left out, counted by (kind, message)."""

    source: str
    key: BatchKey | None = None  # None when the envelope was refused
    iterations: int = 0
    requests: int = 0
    tokens: int = 0
    control_events: int = 0
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    rejected_batch: str | None = None  # why the whole batch was refused (bad envelope)

    @property
    def rejected_events(self) -> int:
        """Events of this batch that were left out."""
        return sum(self.errors.values())


def check_envelope(batch: Any, node: str, received_s: float) -> BatchSplit:
    """A batch's source and key (``sent_s`` falls back to ``received_s``), or why it is refused:
    a bad envelope (``validate_batch`` fails) rejects the whole batch with one ``invalid_batch``."""
    try:
        validate_batch(batch)
    except ValueError as e:
        source = batch.get("source") if isinstance(batch, dict) else None
        out = BatchSplit(source=source if isinstance(source, str) and source else "unknown")
        out.rejected_batch = str(e)
        out.errors["invalid_batch", str(e)] += 1
        return out
    sent_s = batch.get("sent_s")
    key = (node, batch["source"], batch["seq"], float(sent_s) if _is_num(sent_s) else received_s)
    return BatchSplit(source=batch["source"], key=key)


class TelemetryColumns:
    """The rows of many telemetry batches, per table as column lists (``node`` is the same for all:
    a constant of the block). Valid events are kept by type and turned into columns at the end,
    one list comprehension per field; a token is three list extends per request, not a dict."""

    _TABLES: ClassVar[dict[str, str]] = {
        "iteration": "iterations",
        "request": "requests",
        "control": "control_events",
    }
    _FIELDS: ClassVar[dict[str, Any]] = {
        "iteration": ITERATION_FIELDS,
        "request": None,
        "control": CONTROL_FIELDS,
    }

    def __init__(self) -> None:
        self._events: dict[str, list[dict[str, Any]]] = {t: [] for t in self._TABLES}
        self._base: dict[str, tuple[list[str], list[int]]] = {t: ([], []) for t in self._TABLES}
        # per request event with tokens: its id, its worker, its token times (one list each)
        self._token_requests: list[str] = []
        self._token_workers: list[str | None] = []
        self._token_ts: list[list[Any]] = []
        self._batches: dict[str, list[Any]] = {c: [] for c in TABLE_COLUMNS["telemetry_batches"]}

    def columns(self) -> dict[str, dict[str, list[Any]]]:
        """The non-empty tables' columns (without ``node``)."""
        out: dict[str, dict[str, list[Any]]] = {}
        if self._batches["seq"]:
            out["telemetry_batches"] = self._batches
        for etype, table in self._TABLES.items():
            events = self._events[etype]
            if not events:
                continue
            sources, seqs = self._base[etype]
            fields = self._FIELDS[etype] or _REQUEST_ROW_FIELDS
            cols: dict[str, list[Any]] = {"source": sources, "batch_seq": seqs}
            for name in fields:
                cols[name] = [e.get(name) for e in events]
            out[table] = cols
        return out

    def tokens_table(self) -> pa.Table | None:
        """The ``tokens`` rows (without ``node``) as an Arrow table, built with numpy: ``idx``
        counts each request's tokens from 0, ``itl_s`` is each token's time less the one before
        it (NULL for the first); ``request_id`` and ``worker`` are dictionary-encoded (one value per
        request, not per token). None when no request carried tokens."""
        lists = self._token_ts
        if not lists:
            return None
        lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        total = int(lengths.sum())
        if all(type(t) is np.ndarray for t in lists):  # the simulator's (TokenTimesBatch)
            ts = np.concatenate(lists)
        else:
            ts = np.fromiter(chain.from_iterable(lists), dtype=np.float64, count=total)
        starts = np.cumsum(lengths) - lengths  # each request's first row
        idx = np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)
        itl = np.empty(total, dtype=np.float64)
        itl[1:] = ts[1:] - ts[:-1]
        first = np.zeros(total, dtype=bool)
        first[starts] = True
        requests, request_codes = _codes(self._token_requests)
        workers, worker_codes = _codes(self._token_workers)
        return pa.Table.from_arrays(
            [
                pa.DictionaryArray.from_arrays(
                    pa.array(np.repeat(request_codes, lengths)), pa.array(requests, type=pa.string())
                ),
                pa.array(idx),
                pa.array(ts),
                pa.array(itl, mask=first),
                pa.DictionaryArray.from_arrays(
                    pa.array(np.repeat(worker_codes, lengths)), pa.array(workers, type=pa.string())
                ),
            ],
            names=["request_id", "idx", "ts_s", "itl_s", "worker"],
        )

    def add(self, batch: dict[str, Any], split: BatchSplit, received_s: float, endpoint: str | None) -> None:
        """Split an accepted batch (``split`` from :func:`check_envelope`) into the tables; each bad
        event is left out and counted in ``split.errors``. Unknown fields are ignored."""
        if split.key is None:
            raise ValueError(f"telemetry batch of {split.source!r} was refused: {split.rejected_batch}")
        source, seq, sent_s = split.key[1], split.key[2], split.key[3]
        taken = {t: 0 for t in self._TABLES}
        for event in batch["events"]:
            problem = _check_event(event)
            if problem is not None:
                split.errors[problem] += 1
                continue
            etype = event["type"]
            self._events[etype].append(event)
            taken[etype] += 1
            if etype == "request":
                token_ts = event.get("token_ts_s")
                if token_ts is not None and len(token_ts):  # a list, or a float64 array in process
                    self._token_requests.append(event["request_id"])
                    # the worker that generated them: the decode worker, else the only one
                    self._token_workers.append(event.get("decode_worker") or event.get("prefill_worker"))
                    self._token_ts.append(token_ts)
                    split.tokens += len(token_ts)
        for etype, n in taken.items():
            sources, seqs = self._base[etype]
            sources.extend(repeat(source, n))
            seqs.extend(repeat(seq, n))
        split.iterations += taken["iteration"]
        split.requests += taken["request"]
        split.control_events += taken["control"]
        self._batch_row(
            source,
            seq,
            sent_s,
            received_s,
            len(batch["events"]),
            split,
            batch.get("dropped_events_total"),
            endpoint,
        )

    def add_counted(self, batch: Any, split: BatchSplit, received_s: float, endpoint: str | None) -> None:
        """Count a batch of ``n`` iteration events whose rows are written elsewhere (as columns: every
        event passed the checks) and add its telemetry_batches row."""
        split.iterations += batch.n
        source, seq, sent_s = split.key[1], split.key[2], split.key[3]
        self._batch_row(source, seq, sent_s, received_s, batch.n, split, batch.dropped_events_total, endpoint)

    def _batch_row(
        self,
        source: str,
        seq: int,
        sent_s: float,
        received_s: float,
        events: int,
        split: BatchSplit,
        dropped: Any,
        endpoint: str | None,
    ) -> None:
        row = {
            "source": source,
            "seq": seq,
            "sent_s": sent_s,
            "received_s": received_s,
            "events": events,
            "rejected_events": split.rejected_events,
            "dropped_events_total": dropped if _is_int(dropped) else None,
            "endpoint": endpoint,
        }
        for name, value in row.items():
            self._batches[name].append(value)


_REQUEST_ROW_FIELDS = tuple(f for f in REQUEST_FIELDS if f != "token_ts_s")


def _codes(values: list[str | None]) -> tuple[list[str | None], np.ndarray]:
    """The distinct values (first seen first) and each value's index into them."""
    code: dict[str | None, int] = {}
    indices = np.fromiter((code.setdefault(v, len(code)) for v in values), dtype=np.int32, count=len(values))
    return list(code), indices


def _check_event(event: Any) -> tuple[str, str] | None:
    """Return (kind, message) when the event must be left out, else None."""
    if not isinstance(event, dict):
        return "invalid_event", f"telemetry event must be an object, got {type(event).__name__}"
    etype = event.get("type")
    spec = _EVENT_FIELDS.get(etype) if isinstance(etype, str) else None
    if spec is None:
        return (
            "unknown_event_type",
            f"unknown telemetry event type {etype!r}; known: {', '.join(_EVENT_FIELDS)}",
        )
    for name, kind, required, allowed in _CHECKS[etype]:
        value = event.get(name)
        if value is None:
            if required:
                return "invalid_event", f"{etype} event lacks required field {name!r}"
            continue
        t = type(value)
        # the common cases inline (JSON gives exactly str, int, float); anything else the full check
        if not (
            (kind == "str" and t is str)
            or (kind == "num" and (t is int or (t is float and value - value == 0.0)))  # finite
            or (kind == "int" and t is int)
            or _KIND_CHECKS[kind](value)
        ):
            return (
                "invalid_event",
                f"{etype} field {name!r} must be {_KIND_NAMES[kind]}, got {type(value).__name__}",
            )
        if allowed is not None and value not in allowed:
            return "invalid_event", f"{etype} field {name!r} must be one of {sorted(allowed)}"
    return None


def _is_num(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    return isinstance(v, int) or (isinstance(v, float) and math.isfinite(v))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_nums(v: Any) -> bool:
    if (
        type(v) is np.ndarray
    ):  # in process only (serving.telemetry_columns.TokenTimesBatch): no JSON makes one
        return v.ndim == 1 and v.dtype == np.float64 and bool(np.isfinite(v).all())
    if not isinstance(v, list) or not set(map(type, v)) <= _NUM_TYPES:  # per element in C: no bools
        return False
    try:
        return math.isfinite(math.fsum(v))  # NaN or an infinity anywhere makes the sum one
    except OverflowError:  # values whose sum does not fit a double: look at each
        return all(_is_num(x) for x in v)


_NUM_TYPES = frozenset({int, float})


def _is_json(v: Any) -> bool:
    try:
        json.dumps(v)
    except (TypeError, ValueError):
        return False
    return True


_KIND_CHECKS = {
    "str": lambda v: isinstance(v, str),
    "num": _is_num,
    "int": _is_int,
    "nums": _is_nums,
    "json": _is_json,
}
# per event type: (field, kind, required, allowed values or None), in field order
_CHECKS: dict[str, tuple[tuple[str, str, bool, frozenset[str] | None], ...]] = {
    etype: tuple(
        (name, kind, required, ALLOWED_VALUES.get((etype, name))) for name, (kind, required) in fields.items()
    )
    for etype, fields in _EVENT_FIELDS.items()
}
_KIND_NAMES = {
    "str": "a string",
    "num": "a finite number",
    "int": "an integer",
    "nums": "a list of numbers",
    "json": "JSON-serialisable",
}
