"""The collector's DuckDB store: one writing process, batched Arrow appends, simple queries.

Threading: a ``Store`` is meant to be written by ONE thread (the collector service's writer
thread, which drains its queues and appends whatever has accumulated). Every write method takes
an internal lock, so a stray call from another thread is serialised rather than corrupting state.
Read methods (``query``, ``range``, ``latest_per_device``) run on their own DuckDB cursor and may
be called from any thread concurrently with the writer; they see committed data only (not rows
still in the write buffer -- call ``flush()`` from the writer first where that matters), and
wait for a background flush in flight (below) before they start.

Device attributes: ``gpu_samples`` input may be "wide" (``kind``, ``uuid``, ``name``, ``k8s_*`` on
every row, as ``DeviceSample`` and the sources produce it); the store writes the samples without
them and adds a ``devices`` row, in the same transaction, only when a GPU's attributes are first
seen or change (``collector.store.devices``). Readers get the wide shape from ``gpu_samples_full``
(``range("gpu_samples")`` and ``latest_per_device`` read it).

Durability: every write is one DuckDB transaction. A committed write survives the writer being
killed (it is in DuckDB's write-ahead log, replayed on the next open); ``checkpoint()`` folds the
log into the file. With ``buffer_rows > 0`` appends are held in memory until that many rows are
pending (or ``flush()``/``checkpoint()``/``close()``): a crash loses at most those unflushed rows,
so a buffering writer should also call ``flush()`` on a timer (e.g. every second). Batches of at
least DuckDB's row-group size (122,880 rows) are written straight into the file, which makes the
buffer worth having at high sample rates.

Background flush (``buffer_rows > 0``): a buffer that becomes due in an append is handed to a
thread of its own, which writes it on a second DuckDB connection (``con.cursor()``) in its own
transaction while the writer converts the next rows (DuckDB releases the GIL while it inserts).
One flush is in flight at a time: the next due buffer first waits for it, so at most two buffers
are held. ``flush()``, ``checkpoint()``, ``close()``, ``transaction()``, ``telemetry_cursors()``
and every read wait for it, and so does the duplicate check of a telemetry batch that is in it
(whether that batch is stored depends on how the flush ends). A background flush that fails is rolled back (nothing of it written, the devices registry
re-read) and its :class:`~collector.store.errors.FlushError` is raised by the next call that
reports it: ``flush()``, ``checkpoint()``, ``close()`` (after doing their own work) or the next
append that finds the buffer due (which then takes nothing of its own rows: call it again).
Until a ``flush()`` returns, its rows may be in the buffer or in flight: a kill -9 loses at most
what was appended since the last ``flush()`` returned, as without it. With ``buffer_rows = 0``
every append is written, synchronously, before it returns.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from itertools import chain, repeat
from operator import attrgetter
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from collector.store import gpu_keys, iteration_seconds
from collector.store.columns import ColumnBlock, ColumnRun, block_names, build_columns, column_runs
from collector.store.devices import DEVICE_ATTRIBUTES, DEVICE_KEY, SPLIT_COLUMNS, DeviceRegistry
from collector.store.errors import FlushError, StoreError, StoreLockedError
from collector.store.held import HeldDrop, drop_oldest, invalidated, write_failure_cause
from collector.store.schema import LATEST_VERSION, apply_migrations, check_version
from collector.store.tables import TABLES, table_spec
from collector.store.telemetry_rows import BatchKey, TelemetryColumns, check_envelope
from serving.devices.base import DeviceSample
from serving.telemetry import Gap

Rows = Sequence[Mapping[str, Any]] | pa.Table | pd.DataFrame
TimeLike = float | int | datetime
READER_CLOSE_TIMEOUT_S = 10.0  # close() waits this long for interrupted readers to let go
log = logging.getLogger(__name__)

_ARROW_TYPES: dict[str, pa.DataType] = {
    "VARCHAR": pa.string(),
    "JSON": pa.string(),
    "DOUBLE": pa.float64(),
    "FLOAT": pa.float32(),
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "SMALLINT": pa.int16(),
    "UBIGINT": pa.uint64(),
    "UINTEGER": pa.uint32(),
    "BOOLEAN": pa.bool_(),
}
_STRING_TYPES = (pa.string(), pa.large_string(), pa.string_view())
_SAMPLE_FIELDS = tuple(DeviceSample.__dataclass_fields__)
ROW_GROUP_ROWS = 122_880  # DuckDB's row-group size: a batch this big is written straight to the file
# The collector's write buffer: a flush is due at this many rows (or each flush interval). Under a
# sustained high-rate stream every flush is then 4 whole row groups, which DuckDB takes at
# 1.4-1.7 M rows/s here against ~0.65 M at 1 row group (bench/ingest.py); ~50 MB of samples at most.
WRITER_BUFFER_ROWS = 4 * ROW_GROUP_ROWS
_DEVICE_INPUT = (*DEVICE_KEY, *DEVICE_ATTRIBUTES, "ts_s")  # what the devices rows are worked out from
# While the disk refuses writes a buffering store holds up to this many buffers' rows (held.py)
HELD_BUFFERS = 2
# From this many pending wide rows on, a flush works out the devices rows on a thread of its own
# while DuckDB inserts the samples (which keeps one core busy and releases the GIL).
_BACKGROUND_DEVICE_ROWS = 50_000


@dataclass(frozen=True, slots=True)
class Column:
    """A column of a store table, with the Arrow type appends are converted to."""

    name: str
    duckdb_type: str
    arrow_type: pa.DataType
    not_null: bool

    @property
    def is_json(self) -> bool:
        """True for JSON columns (stored as JSON text)."""
        return self.duckdb_type == "JSON"


@dataclass(frozen=True, slots=True)
class TelemetryIngest:
    """What ``append_telemetry_batch`` stored from one batch, and what it left out."""

    source: str
    iterations: int
    requests: int
    tokens: int
    control_events: int
    rejected_events: int
    rejected_batch: str | None  # why the whole batch was refused (bad envelope), else None
    duplicate: bool = False  # the same batch (node, source, seq, sent_s) was stored before: skipped


class Store:
    """A phaselens DuckDB file, opened with :meth:`Store.open`."""

    __slots__ = (
        "_buffer_rows",
        "_closing",
        "_columns",
        "_con",
        "_deferred",
        "_devices",
        "_devices_lock",
        "_flight",
        "_flight_con",
        "_gpu_keys",
        "_held_drops",
        "_inflight_batches",
        "_invalidated",
        "_lock",
        "_max_held_rows",
        "_pending",
        "_pending_batches",
        "_pending_rows",
        "_pending_wide",
        "_readers",
        "_readers_done",
        "_wide_samples",
        "_write_failure",
        "path",
        "read_only",
    )

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        path: Path,
        *,
        read_only: bool,
        buffer_rows: int,
        max_held_rows: int | None = None,
    ) -> None:
        """Wrap an open, migrated connection (use :meth:`Store.open`)."""
        self._con = con
        self.path = path
        self.read_only = read_only
        self._buffer_rows = buffer_rows
        self._max_held_rows = HELD_BUFFERS * buffer_rows if max_held_rows is None else max_held_rows
        self._write_failure: str | None = None  # why the last write failed, until one commits
        self._held_drops: list[HeldDrop] = []  # held rows dropped past the bound, not yet taken
        self._invalidated = False  # DuckDB invalidated the database: the next use opens it again
        self._lock = threading.RLock()
        self._pending: dict[str, list[pa.Table]] = {}
        self._pending_rows = 0
        self._pending_wide: list[pa.Table] = []  # gpu_samples input whose devices rows are due at flush
        self._pending_batches: set[BatchKey] = set()  # telemetry batches in the buffer
        self._flight: _Flight | None = None  # the background flush being written, if any
        self._flight_con: duckdb.DuckDBPyConnection | None = None  # its cursor (made on first use)
        self._inflight_batches: set[BatchKey] = set()  # telemetry batches of that flush
        self._deferred: FlushError | None = None  # a failed background flush not yet reported
        self._devices_lock = threading.Lock()  # the registry: the writer's notes, a flight's changes
        self._readers: set[duckdb.DuckDBPyConnection] = set()  # reader cursors open now
        self._readers_done = threading.Condition()  # guards _readers and _closing
        self._closing = False
        self._columns = _load_columns(con)
        # what a wide gpu_samples input may carry: the table's columns + the device attributes
        self._wide_samples = {
            **self._columns["gpu_samples"],
            **{c: self._columns["devices"][c] for c in SPLIT_COLUMNS},
        }
        self._devices = DeviceRegistry()
        self._devices.load(con)
        self._gpu_keys = gpu_keys.GpuKeys()
        self._gpu_keys.load(con)

    # -- open / close -------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        read_only: bool = False,
        buffer_rows: int = 0,
        max_held_rows: int | None = None,
    ) -> Store:
        """Open (creating if needed) the store at ``path`` and bring its schema up to date.

        An older file is migrated in one transaction; a file with a newer schema version than
        this code knows raises StoreError naming both versions. A file held by another process
        raises StoreLockedError. ``read_only`` never migrates: an out-of-date file is refused.
        ``buffer_rows`` > 0 holds appends in memory until that many rows are pending; it also
        holds the rows of a flush the disk refused (no space left, ...) to write them with the next
        one, up to ``max_held_rows`` (default ``HELD_BUFFERS * buffer_rows``; collector/store/held.py).
        """
        path = Path(path)
        if not isinstance(buffer_rows, int) or buffer_rows < 0:
            raise StoreError(f"buffer_rows must be a non-negative integer, got {buffer_rows!r}")
        if max_held_rows is not None and (not isinstance(max_held_rows, int) or max_held_rows < 0):
            raise StoreError(f"max_held_rows must be a non-negative integer, got {max_held_rows!r}")
        if read_only and not path.exists():
            raise StoreError(f"{path} does not exist; a read-only open cannot create it")
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            con = duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as e:
            if "lock" in str(e).lower():
                raise StoreLockedError(_locked_message(path, str(e), read_only)) from e
            raise StoreError(f"cannot open {path}: {e}") from e
        except duckdb.Error as e:
            raise StoreError(f"cannot open {path}: {e}") from e
        try:
            if read_only:
                version = check_version(con, str(path))
                if version < LATEST_VERSION:
                    raise StoreError(
                        f"{path} has schema version {version}, older than this phaselens "
                        f"(version {LATEST_VERSION}); open it read-write once to migrate it"
                    )
            else:
                apply_migrations(con, where=str(path))
            return cls(con, path, read_only=read_only, buffer_rows=buffer_rows, max_held_rows=max_held_rows)
        except BaseException:
            con.close()
            raise

    def close(self, reader_timeout_s: float = READER_CLOSE_TIMEOUT_S) -> None:
        """Flush pending rows and close the file. Safe to call more than once.

        New readers are refused from the start of the call; a query still running on a reader
        cursor (e.g. a dashboard's recomputation on its own thread) is interrupted and waited for,
        up to ``reader_timeout_s``, so closing never fails because a reader is busy.
        """
        self._end_readers(reader_timeout_s)
        with self._lock:
            if self._con is None and not self._invalidated:
                return
            try:
                if not self.read_only:
                    self._flush_reporting()
            finally:
                self._settle()  # a flush still in flight (e.g. interrupted wait) ends first
                if self._pending_rows:  # held: the disk refused them to the end
                    log.error(
                        "%s closed with %d rows not written: %s",
                        self.path,
                        self._pending_rows,
                        self._write_failure,
                    )
                if self._flight_con is not None:
                    self._flight_con.close()
                    self._flight_con = None
                if self._con is not None:
                    self._con.close()
                self._con, self._invalidated = None, False

    def _end_readers(self, timeout_s: float) -> None:
        """Refuse new readers, interrupt the running ones and wait for them to close."""
        deadline = time.monotonic() + timeout_s
        with self._readers_done:
            self._closing = True
            while self._readers and (left := deadline - time.monotonic()) > 0:
                for cur in list(self._readers):  # again each round: a query may start after one
                    try:
                        cur.interrupt()
                    except duckdb.Error:  # already finished or closed
                        pass
                self._readers_done.wait(min(left, 0.05))
            if self._readers:
                log.warning("closing %s with %d reader(s) still open", self.path, len(self._readers))

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "read-write"
        return f"Store({str(self.path)!r}, {mode})"

    # -- metadata -------------------------------------------------------------------------------

    @property
    def schema_version(self) -> int:
        """The file's applied schema version."""
        with self._lock:
            return check_version(self._conn(), str(self.path))

    def columns(self, table: str) -> list[Column]:
        """The columns of ``table``, in table order."""
        return list(self._table_columns(table).values())

    @property
    def write_failure(self) -> str | None:
        """Why the storage refuses writes (``no space left on device``, ...) since the last write
        that failed so, until one commits again; None while writes succeed. Read without a lock."""
        return self._write_failure

    @property
    def held_rows(self) -> int:
        """Rows appended and not yet committed: the write buffer (with the rows of flushes the
        disk refused, held) and a background flush in flight. Read without a lock."""
        flight = self._flight
        return self._pending_rows + (flight.rows if flight is not None else 0)

    def take_held_drops(self) -> list[HeldDrop]:
        """The held rows dropped past ``max_held_rows`` since the last call (collector/store/held.py)."""
        with self._lock:
            drops, self._held_drops = self._held_drops, []
        return drops

    # -- writes ---------------------------------------------------------------------------------

    def append(self, table: str, rows: Rows) -> int:
        """Append rows to ``table`` in one batch; return the number of rows taken.

        ``rows`` is a list of dicts, a ``pyarrow.Table`` or a ``pandas.DataFrame``. Columns missing
        from the input are NULL (or the table's default); unknown columns, values that do not fit
        a column's type, and NULLs in required columns raise StoreError naming the columns and
        nothing is written. JSON columns take any JSON-able Python value from dict rows (encoded
        with ``json.dumps``) and JSON text from Arrow/pandas string columns.

        ``gpu_samples`` also takes the device attribute columns (``kind``, ``uuid``, ``name``,
        ``k8s_pod``, ``k8s_namespace``, ``k8s_container``): they go to ``devices`` when they change.
        Input without any of them adds no ``devices`` rows.
        """
        if table == "gpu_samples":
            return self._append_samples(self._input_table(table, rows, self._wide_samples))
        data = self._to_arrow(table, rows)
        with self._lock:
            self._writer()
            if table == "devices":
                with self._devices_lock:
                    self._devices.note(data)
            self._enqueue({table: data})
        return data.num_rows

    def append_columns(self, table: str, blocks: Sequence[ColumnBlock]) -> int:
        """Append rows given as columns (one :class:`~collector.store.columns.ColumnBlock` per
        source poll) in one batch; return the rows taken. What ``append`` checks, it checks here:
        unknown columns, values that do not fit a column's type, NULLs in required columns raise
        StoreError naming the column, and nothing is written. Each column is built once, with the
        table's Arrow type; ``gpu_samples`` takes the device attribute columns as ``append`` does."""
        if not all(map(_n_of, blocks)):
            blocks = [b for b in blocks if b.n]
        if not blocks:
            return 0
        if table == "gpu_samples":
            runs = column_runs(blocks)
            data = self._columns_table(table, blocks, self._wide_samples, runs)
            return self._append_samples(data, _device_spans(runs))
        data = self._columns_arrow(table, blocks)
        with self._lock:
            self._writer()
            if table == "devices":
                with self._devices_lock:
                    self._devices.note(data)
            self._enqueue({table: data})
        return data.num_rows

    def _columns_arrow(self, table: str, blocks: Sequence[ColumnBlock]) -> pa.Table:
        """Column blocks as an Arrow table with exactly ``table``'s columns and types."""
        cols = self._table_columns(table)
        return _conform(table, self._columns_table(table, blocks, cols), cols)

    def _columns_table(
        self,
        table: str,
        blocks: Sequence[ColumnBlock],
        cols: Mapping[str, Column],
        runs: Sequence[ColumnRun] | None = None,
    ) -> pa.Table:
        """Column blocks as one Arrow table, each column built with its type from ``cols``
        (``runs``: ``column_runs(blocks)``, when the caller has them)."""
        runs = column_runs(blocks) if runs is None else runs
        names = block_names(blocks, runs)
        _check_names(table, names, cols)
        encoders = {n: partial(_json_text, table, n) for n in names if cols[n].is_json}
        inferred: set[str] = set()  # columns whose values do not build as their type: Arrow infers,
        while True:  # and the cast in append then names what does not fit
            try:
                types = {n: None if n in inferred else cols[n].arrow_type for n in names}
                arrays = build_columns(blocks, types, encoders, runs, names)
                break
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
                bad = getattr(e, "column", None)
                if bad is None or bad in inferred:
                    raise StoreError(f"{table}.{bad}: values of mixed or unsupported types: {e}") from e
                inferred.add(bad)
        return pa.Table.from_arrays(list(arrays.values()), names=list(arrays))

    def append_gpu_samples(
        self,
        samples: Iterable[DeviceSample],
        node: str,
        source: str,
        *,
        k8s: Mapping[str, str | None] | None = None,
    ) -> int:
        """Append device samples taken on ``node`` by ``source`` (nvml, emulated, cpu, dcgm ...).

        ``k8s`` optionally gives ``k8s_pod``/``k8s_namespace``/``k8s_container`` for every sample.
        Like ``append("gpu_samples", ...)``, a GPU's attributes reach ``devices`` when they change.
        """
        samples = list(samples)
        if not samples:
            return 0
        columns: dict[str, list[Any]] = {name: [getattr(s, name) for s in samples] for name in _SAMPLE_FIELDS}
        n = len(samples)
        columns["node"] = [node] * n
        columns["source"] = [source] * n
        for key, value in (k8s or {}).items():
            columns[key] = [value] * n
        table = _columns_to_table("gpu_samples", columns)
        return self._append_samples(self._input_table("gpu_samples", table, self._wide_samples))

    def append_telemetry_batch(
        self, batch: Any, node: str, *, received_s: float | None = None, endpoint: str | None = None
    ) -> TelemetryIngest:
        """Store one serving telemetry batch (docs/TELEMETRY.md) received from ``node``; see
        :meth:`append_telemetry_batches`."""
        return self.append_telemetry_batches([batch], node, received_s=received_s, endpoint=endpoint)[0]

    def append_telemetry_batches(
        self,
        batches: Sequence[Any],
        node: str,
        *,
        received_s: float | None = None,
        endpoint: str | None = None,
    ) -> list[TelemetryIngest]:
        """Store serving telemetry batches (docs/TELEMETRY.md) received from ``node``, in order.

        Each batch is split into iterations, requests, tokens (one row per output token) and
        control_events, plus one telemetry_batches row; all of them are written in one transaction.
        Events of unknown type or with missing/mistyped fields are left out and counted in
        ingest_errors under the batch's source; the rest of the batch is kept. A batch whose
        envelope fails ``serving.telemetry.validate_batch`` is refused whole and counted.
        A batch already stored (same node, source, seq and sent_s -- e.g. re-read from the
        router's ring after a collector restart) is skipped and reported as ``duplicate``.
        ``endpoint`` (the serving URL read) is kept on the telemetry_batches rows, for
        :meth:`telemetry_cursors`.
        """
        now = time.time() if received_s is None else received_s
        splits = [check_envelope(b, node, now) for b in batches]
        out = TelemetryColumns()
        errors: Counter[tuple[str, str, str]] = Counter()
        results: list[TelemetryIngest] = []
        with self._lock:
            seen = self._seen_batches([s.key for s in splits if s.key is not None])
            keys: list[BatchKey] = []
            for batch, split in zip(batches, splits, strict=True):
                if split.key is not None and split.key in seen:
                    results.append(TelemetryIngest(split.source, 0, 0, 0, 0, 0, None, duplicate=True))
                    continue
                if split.key is not None:
                    seen.add(split.key)
                    keys.append(split.key)
                    out.add(batch, split, now, endpoint)
                for (kind, message), count in split.errors.items():
                    errors[split.source, kind, message] += count
                results.append(
                    TelemetryIngest(
                        source=split.source,
                        iterations=split.iterations,
                        requests=split.requests,
                        tokens=split.tokens,
                        control_events=split.control_events,
                        rejected_events=split.rejected_events,
                        rejected_batch=split.rejected_batch,
                    )
                )
            parts = {
                table: self._columns_arrow(table, [ColumnBlock.of(values, {"node": node})])
                for table, values in out.columns().items()
            }
            if errors:
                rows = [
                    {"node": node, "source": src, "ts_s": now, "kind": kind, "message": msg, "count": n}
                    for (src, kind, msg), n in errors.items()
                ]
                parts["ingest_errors"] = self._to_arrow("ingest_errors", rows)
            if parts:
                self._enqueue(parts, keys=keys)
        return results

    def telemetry_cursors(self, node: str, endpoint: str) -> dict[str, tuple[int, float]]:
        """Per telemetry source read from ``endpoint`` on ``node``: ``(seq, sent_s)`` of the newest
        batch stored (by arrival; rows stored before version 8 have no endpoint and count too).
        A collector resumes its cursors from these after a restart."""
        with self._lock:
            self._flush_locked()  # waits for a flush in flight; its failure stays for flush()
        rows = self.query(
            "SELECT source, seq, sent_s FROM telemetry_batches "
            "WHERE node = ? AND (endpoint = ? OR endpoint IS NULL) "
            "QUALIFY row_number() OVER (PARTITION BY source ORDER BY received_s DESC, seq DESC) = 1",
            [node, endpoint],
        )
        return {r.source: (int(r.seq), float(r.sent_s)) for r in rows.itertuples()}

    def record_gaps(self, gaps: Iterable[Gap], node: str, *, detected_at_s: float | None = None) -> int:
        """Record telemetry sequence gaps (``serving.telemetry.Gap``) seen by the reader."""
        at = time.time() if detected_at_s is None else detected_at_s
        rows = [
            {
                "node": node,
                "source": g.source,
                "after_seq": g.after_seq,
                "missing_batches": g.missing_batches,
                "detected_at_s": at,
            }
            for g in gaps
        ]
        return self.append("telemetry_gaps", rows) if rows else 0

    def record_ingest_error(self, node: str, source: str, kind: str, message: str, count: int = 1) -> None:
        """Count ``count`` bad inputs of ``kind`` from ``source`` (e.g. a StoreError from append)."""
        self.record_ingest_errors(node, [(source, kind, message, count)])

    def record_ingest_errors(self, node: str, errors: Iterable[tuple[str, str, str, int]]) -> None:
        """Count many problems at once, ``(source, kind, message, count)`` each: one append."""
        now_s = time.time()
        rows = [
            {"node": node, "source": source, "ts_s": now_s, "kind": kind, "message": message, "count": count}
            for source, kind, message, count in errors
        ]
        if rows:
            self.append("ingest_errors", rows)

    def flush(self, *, wait: bool = True) -> None:
        """Write buffered rows now, in one transaction; a no-op when nothing is pending.

        If DuckDB refuses the write (disk full, ...) the buffered rows are discarded and
        StoreError says how many; they are not retried. A background flush that failed since the
        last report raises its FlushError here, after the rows buffered since have been written.

        ``wait=False`` (with a write buffer): hand the buffered rows to a background flush, once
        the one in flight has ended, and return; the next ``flush()``, ``checkpoint()``,
        ``close()`` or read waits for it, and the next call that reports raises its failure (this
        call raises an earlier one's, after handing its rows on). Without a buffer: ``flush()``.
        """
        with self._lock:
            if wait or not self._buffer_rows:
                self._flush_reporting()
                return
            self._writer()
            self._settle()
            self._start_flight()
            self._raise_deferred()

    def checkpoint(self) -> None:
        """Flush, then fold DuckDB's write-ahead log into the database file."""
        with self._lock:
            try:
                self._flush_locked()
                try:
                    self._conn().execute("CHECKPOINT")
                except duckdb.Error as e:
                    cause = write_failure_cause(e)
                    if cause is not None:
                        self._write_failure = cause
                    if invalidated(e):
                        self._drop_connection()
                    raise StoreError(f"checkpoint of {self.path} failed: {e}") from e
            except StoreError as e:
                self._raise_deferred(also=e)
                raise
            self._raise_deferred()

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """Flush, then hold the writer lock and one transaction for multi-statement SQL.

        Yields the writer connection; commits on success, rolls back (and raises StoreError for
        DuckDB errors) otherwise. A background flush in flight is waited for (its failure, if
        any, is left for the next ``flush()`` to report). Used by ``collector.store.retention``.
        The writer's copy of ``devices`` is reloaded after a commit (the SQL may have changed it).
        """
        with self._lock:
            self._flush_locked()
            con = self._writer()
            con.begin()
            try:
                yield con
            except duckdb.Error as e:
                con.rollback()
                raise StoreError(f"transaction on {self.path} failed: {e}") from e
            except BaseException:
                con.rollback()
                raise
            con.commit()
            self._reload_devices()

    # -- reads ----------------------------------------------------------------------------------

    @contextmanager
    def reader(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A fresh DuckDB cursor for reading, usable from any thread; closed afterwards.

        DuckDB errors raised inside the block become StoreError. A background flush in flight is
        waited for first (its failure is left for the writer's next ``flush()``), so a read sees
        every flush begun before it, as when flushes ran on the writer's own thread.
        """
        with self._lock:
            self._settle()
            with self._readers_done:
                con = self._conn()  # "is closed" once closed
                if self._closing:
                    raise StoreError(f"store {self.path} is closing; no new reads")
                cur = con.cursor()
                self._readers.add(cur)
        try:
            yield cur
        except duckdb.Error as e:
            raise StoreError(f"query on {self.path} failed: {e}") from e
        finally:
            cur.close()
            with self._readers_done:
                self._readers.discard(cur)
                self._readers_done.notify_all()

    def query(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> pd.DataFrame:
        """Run SQL (``?`` or ``$name`` parameters) on a fresh cursor; return a DataFrame."""
        with self.reader() as cur:
            return cur.execute(sql, params if params is not None else []).df()

    def range(
        self,
        table: str,
        start: TimeLike | None,
        end: TimeLike | None,
        *,
        device: str | None = None,
        node: str | None = None,
        limit: int | None = None,
    ) -> pd.DataFrame:
        """Rows of ``table`` whose time column lies in ``[start, end)``, oldest first.

        Times are UTC epoch seconds or timezone-aware datetimes; ``None`` leaves that end open.
        ``gpu_samples`` and ``gpu_samples_10s`` rows come with their device attributes (the
        ``*_full`` views).
        """
        spec = table_spec(table)
        cols = self._table_columns(table)
        tc = spec.time_column
        where: list[str] = []
        params: list[Any] = []
        if start is not None:
            where.append(f'"{tc}" >= ?')
            params.append(to_epoch_s(start, "start"))
        if end is not None:
            where.append(f'"{tc}" < ?')
            params.append(to_epoch_s(end, "end"))
        for name, value in (("device", device), ("node", node)):
            if value is None:
                continue
            if name not in cols:
                raise StoreError(f"table {table!r} has no {name!r} column to filter on")
            where.append(f'"{name}" = ?')
            params.append(value)
        sql = f'SELECT * FROM "{spec.read_as or table}"'
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f' ORDER BY "{tc}"'
        if limit is not None:
            if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
                raise StoreError(f"limit must be a non-negative integer, got {limit!r}")
            sql += f" LIMIT {limit}"
        return self.query(sql, params)

    def latest_per_device(self, *, since_s: float | None = None) -> pd.DataFrame:
        """The newest sample of every GPU (node, device, index, uuid: each emulated GPU of a worker
        counts apart) with its device attributes, optionally only from ``since_s`` on."""
        where = "WHERE ts_s >= ?" if since_s is not None else ""
        return self.query(
            f"SELECT * FROM gpu_samples_full {where} "
            'QUALIFY row_number() OVER (PARTITION BY node, device, "index", uuid ORDER BY ts_s DESC) = 1 '
            'ORDER BY node, device, "index"',
            [to_epoch_s(since_s, "since_s")] if since_s is not None else [],
        )

    # -- internals ------------------------------------------------------------------------------

    def _conn(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            if not self._invalidated:
                raise StoreError(f"store {self.path} is closed")
            self._reconnect()
        return self._con  # type: ignore[return-value]  # set by _reconnect

    def _drop_connection(self) -> None:
        """Close the connection of a database DuckDB invalidated (a checkpoint that failed on a full
        disk does that; caller holds the lock); the next use opens the file again, whose WAL
        replays what was committed. Readers still on the old connection are interrupted."""
        log.error("%s: DuckDB invalidated the database; it is opened again on next use", self.path)
        if self._flight_con is not None:
            try:
                self._flight_con.close()
            except duckdb.Error:
                pass
            self._flight_con = None
        with self._readers_done:
            for cur in list(self._readers):
                try:
                    cur.interrupt()
                except duckdb.Error:
                    pass
        if self._con is not None:
            try:
                self._con.close()
            except duckdb.Error:
                pass
        self._con, self._invalidated = None, True

    def _reconnect(self) -> None:
        """Open the file again after ``_drop_connection``; StoreError when it cannot (tried again
        on the next use)."""
        try:
            con = duckdb.connect(str(self.path))
        except duckdb.Error as e:
            raise StoreError(f"cannot open {self.path} again after DuckDB invalidated it: {e}") from e
        self._con, self._invalidated = con, False
        self._gpu_keys.load(con)
        self._reload_devices()
        log.warning("%s: opened again", self.path)

    def _writer(self) -> duckdb.DuckDBPyConnection:
        con = self._conn()
        if self.read_only:
            raise StoreError(f"store {self.path} was opened read-only")
        return con

    def _table_columns(self, table: str) -> dict[str, Column]:
        cols = self._columns.get(table)
        if cols is None or table not in TABLES:
            raise StoreError(f"unknown table {table!r}; tables: {', '.join(sorted(TABLES))}")
        return cols

    def _to_arrow(self, table: str, rows: Rows) -> pa.Table:
        """Convert input rows to an Arrow table with exactly ``table``'s columns and types."""
        cols = self._table_columns(table)
        return _conform(table, self._input_table(table, rows, cols), cols)

    def _input_table(self, table: str, rows: Rows, cols: Mapping[str, Column]) -> pa.Table:
        """Input rows as an Arrow table, column names checked against ``cols`` (types not yet)."""
        if isinstance(rows, pa.Table):
            data = rows
        elif isinstance(rows, pd.DataFrame):
            _check_names(table, [str(c) for c in rows.columns], cols)
            try:
                data = pa.Table.from_pandas(rows, preserve_index=False)
            except (pa.ArrowException, ValueError, TypeError) as e:
                raise StoreError(f"{table}: cannot convert the DataFrame to Arrow: {e}") from e
        elif isinstance(rows, Sequence) and not isinstance(rows, str | bytes):
            data = _rows_to_table(table, rows, cols)
        else:
            raise StoreError(
                f"{table}: rows must be a list of dicts, a pyarrow.Table or a pandas.DataFrame, "
                f"got {type(rows).__name__}"
            )
        _check_names(table, data.column_names, cols)
        return data

    def _append_samples(self, data: pa.Table, spans: Sequence[_Span] | None = None) -> int:
        """Queue gpu_samples input (names checked): the samples, and when the input carries device
        attributes, those for the flush to write ``devices`` rows where they changed (``spans``:
        the rows that can change them, from ``_device_spans``; every row when None)."""
        wide = any(c in data.column_names for c in SPLIT_COLUMNS)
        samples = self._columns["gpu_samples"]
        data = _conform("gpu_samples", data, self._wide_samples if wide else samples)
        if not wide:
            self._enqueue({"gpu_samples": data})
        else:
            self._enqueue({"gpu_samples": data.select(list(samples))}, _device_input(data, spans))
        return data.num_rows

    def _device_changes(self, batches: list[pa.Table]) -> list[dict[str, Any]]:
        """The devices rows that pending wide batches add, in append order (recorded as written)."""
        return [row for batch in batches for row in self._devices.changes(batch)]

    def _device_changes_locked(self, batches: list[pa.Table]) -> list[dict[str, Any]]:
        with self._devices_lock:
            return self._device_changes(batches)

    def _reload_devices(self) -> None:
        """Re-read ``devices`` after a write that failed or SQL that may have changed it."""
        with self._devices_lock:
            try:
                self._devices.load(self._writer())
            except (duckdb.Error, StoreError):
                self._devices.clear()  # every GPU's next sample writes its attributes again

    def _enqueue(
        self, parts: Mapping[str, pa.Table], wide: pa.Table | None = None, keys: Iterable[BatchKey] = ()
    ) -> None:
        """Add converted tables (the device attributes of wide gpu_samples input, the keys of the
        telemetry batches they hold) to the buffer, atomically, and write when due: at once with
        no buffer, else on a background flush once the previous one has ended. A previous one that
        failed raises its FlushError here, before anything of this call is taken."""
        with self._lock:
            self._writer()
            rows = sum(data.num_rows for data in parts.values())
            # while the disk refuses writes, only flush() tries again (once per flush interval)
            due = self._pending_rows + rows >= self._buffer_rows and not (
                self._buffer_rows and self._write_failure
            )
            if due and self._buffer_rows:
                self._settle()  # double buffering: one flush in flight at most
                self._raise_deferred()
            if wide is not None and wide.num_rows:
                self._pending_wide.append(wide)
            for name, data in parts.items():
                if data.num_rows:
                    self._pending.setdefault(name, []).append(data)
                    self._pending_rows += data.num_rows
            self._pending_batches.update(keys)
            if self._write_failure and self._buffer_rows:
                self._bound()
            if not due:
                return
            if self._buffer_rows:
                self._start_flight()
            else:
                self._flush_locked()

    def _take_pending(self) -> tuple[dict[str, list[pa.Table]], int, list[pa.Table]]:
        pending, rows, wide = self._pending, self._pending_rows, self._pending_wide
        self._pending, self._pending_rows, self._pending_wide = {}, 0, []
        return pending, rows, wide

    def _start_flight(self) -> None:
        """Hand the buffer to a background flush (caller holds the lock; none is in flight)."""
        if not self._pending:
            return
        pending, rows, wide = self._take_pending()
        self._inflight_batches, self._pending_batches = self._pending_batches, set()
        if self._flight_con is None:
            self._flight_con = self._writer().cursor()  # a connection of its own: one per thread
        job = _Job(self._write_pending, self._flight_con, pending, rows, wide, background=True)
        self._flight = _Flight(job, tuple(pending), rows, pending, wide, self._inflight_batches)

    def _settle(self) -> None:
        """Wait for the background flush in flight, if any (caller holds the lock). A failure
        re-reads the devices registry and is kept for the next call that reports it."""
        flight, self._flight = self._flight, None
        if flight is None:
            return
        try:
            flight.job.result()
            self._write_failure = None
        except BaseException as e:
            detail = e.__cause__ if isinstance(e, StoreError) and e.__cause__ is not None else e
            if self._flight_con is not None:  # the next flush gets a fresh connection
                try:
                    self._flight_con.close()
                except duckdb.Error:
                    pass
                self._flight_con = None
            held = self._held(e, flight.pending, flight.rows, flight.wide, flight.keys)
            err = FlushError(
                f"background flush of {flight.rows} rows to {', '.join(flight.tables)} failed and "
                f"was rolled back (nothing of it written): {detail}"
                + (f"; held for the next flush ({self._pending_rows} rows held)" if held else ""),
                tables=flight.tables,
                rows=flight.rows,
                held_rows=flight.rows if held else 0,
            )
            err.__cause__ = e
            earlier = self._deferred
            if earlier is not None:
                err = FlushError(
                    f"{earlier}; then {err}",
                    tables=tuple(dict.fromkeys((*earlier.tables, *err.tables))),
                    rows=earlier.rows + err.rows,
                    held_rows=earlier.held_rows + err.held_rows,
                )
            self._deferred = err
        finally:
            self._inflight_batches = set()  # written (the store finds them) or not at all

    def _raise_deferred(self, also: StoreError | None = None) -> None:
        """Raise the failure of a background flush not yet reported (with ``also``, an error of
        the caller's own work, in its message)."""
        err, self._deferred = self._deferred, None
        if err is None:
            return
        if also is not None:
            more = also if isinstance(also, FlushError) else None
            raise FlushError(
                f"{err}; then: {also}",
                tables=tuple(dict.fromkeys((*err.tables, *(more.tables if more else ())))),
                rows=err.rows + (more.rows if more else 0),
                held_rows=err.held_rows + (more.held_rows if more else 0),
            ) from also
        raise err

    def _flush_reporting(self) -> None:
        """Write the buffer now, then raise a background flush's unreported failure."""
        try:
            self._flush_locked()
        except StoreError as e:
            self._raise_deferred(also=e)
            raise
        self._raise_deferred()

    def _seen_batches(self, keys: Sequence[BatchKey]) -> set[BatchKey]:
        """Those of ``keys`` already stored or buffered (caller holds the lock): one query for all.
        A key of the flush in flight waits for it: whether that batch is stored depends on how
        the flush ends (a failed one wrote nothing, so the batch read again is stored)."""
        if any(k in self._inflight_batches for k in keys):
            self._settle()
        seen = {k for k in keys if k in self._pending_batches or k in self._inflight_batches}
        rest = [k for k in keys if k not in seen]
        if not rest:
            return seen
        _phaselens_keys = pa.table(
            {
                name: pa.array([k[i] for k in rest], type=t)
                for i, (name, t) in enumerate(
                    (
                        ("node", pa.string()),
                        ("source", pa.string()),
                        ("seq", pa.int64()),
                        ("sent_s", pa.float64()),
                    )
                )
            }
        )
        found = (
            self._writer()
            .execute(
                "SELECT k.node, k.source, k.seq, k.sent_s FROM _phaselens_keys k SEMI JOIN "
                # the sent_s range lets DuckDB skip row groups (min/max) of batches sent long before
                "(SELECT * FROM telemetry_batches WHERE sent_s BETWEEN ? AND ?) t "
                "ON t.sent_s = k.sent_s AND t.node = k.node AND t.source = k.source AND t.seq = k.seq",
                [min(k[3] for k in rest), max(k[3] for k in rest)],
            )
            .fetchall()
        )
        return seen | {(n, s, int(q), float(t)) for n, s, q, t in found}

    def _flush_locked(self) -> None:
        """Wait for a flush in flight, then write the buffer on the writer's connection."""
        self._settle()
        if not self._pending:
            return
        pending, rows, wide = self._take_pending()
        keys, self._pending_batches = self._pending_batches, set()
        try:
            self._write_pending(self._writer(), pending, rows, wide)
        except BaseException as e:
            if self._held(e, pending, rows, wide, keys):
                raise FlushError(
                    f"writing {rows} rows to {', '.join(pending)} failed (nothing written): "
                    f"{e.__cause__ or e}; held for the next flush ({self._pending_rows} rows held)",
                    tables=tuple(pending),
                    rows=rows,
                    held_rows=rows,
                ) from e
            raise
        self._write_failure = None

    def _held(
        self,
        error: BaseException,
        pending: dict[str, list[pa.Table]],
        rows: int,
        wide: list[pa.Table],
        keys: set[BatchKey],
    ) -> bool:
        """After a failed write (caller holds the lock): when the storage refused it (no space,
        ...) and the store buffers, put its rows back in front of the buffer, to be written first
        by the next flush, and keep the buffer within ``max_held_rows`` (held.py); True then. Else
        the rows are discarded. Either way the devices registry is re-read (their devices rows
        were not written), and a database DuckDB invalidated is opened again on next use."""
        cause = write_failure_cause(error) if self._buffer_rows else None
        if invalidated(error):
            self._drop_connection()
        self._reload_devices()
        if cause is None:
            return False
        self._write_failure = cause
        for name, parts in pending.items():
            self._pending[name] = [*parts, *self._pending.get(name, [])]
        self._pending_rows += rows
        self._pending_wide = [*wide, *self._pending_wide]
        self._pending_batches |= keys
        self._bound()
        return True

    def _bound(self) -> None:
        """Drop the oldest held sample rows past ``max_held_rows`` (caller holds the lock); the
        drops wait in ``take_held_drops`` to be recorded as gaps."""
        excess = self._pending_rows - self._max_held_rows
        if excess <= 0:
            return
        drops = drop_oldest(self._pending, excess, self._write_failure or "store writes failing")
        for drop in drops:
            self._pending_rows -= drop.rows
            log.error("%s: held buffer full, dropped %s", self.path, drop)
        self._held_drops += drops

    def _write_pending(
        self,
        con: duckdb.DuckDBPyConnection,
        pending: Mapping[str, list[pa.Table]],
        rows: int,
        wide: list[pa.Table],
    ) -> None:
        """Write buffered tables, and the devices rows their wide samples add, in one transaction
        on ``con``; on failure roll back (the caller restores the devices registry)."""
        background = sum(w.num_rows for w in wide) >= _BACKGROUND_DEVICE_ROWS
        devices = _Job(self._device_changes_locked, wide, background=background)
        added: dict[gpu_keys.Identity, int] = {}
        con.begin()
        try:
            try:
                for name, parts in pending.items():
                    if name == "gpu_samples":
                        keyed, added = self._gpu_keys.key_rows(con, _one_table(parts))
                        _insert(con, gpu_keys.ROWS_TABLE, [keyed])
                    elif name == "iterations":  # and their per-second rollup, in the same transaction
                        data = _one_table(parts)
                        _insert(con, name, [data])
                        iteration_seconds.add_arrow(con, data)
                    else:
                        _insert(con, name, parts)
            finally:
                devices.join()
            changed = devices.result()
            if changed:
                _insert(con, "devices", [self._to_arrow("devices", changed)])
            con.commit()
            self._gpu_keys.commit(added)
        except BaseException as e:
            try:
                con.rollback()
            except duckdb.Error:
                pass  # a connection that broke keeps nothing of its transaction either
            if isinstance(e, duckdb.Error | OSError):
                raise StoreError(
                    f"writing {rows} rows to {', '.join(pending)} failed (nothing written): {e}"
                ) from e
            raise


@dataclass(frozen=True, slots=True)
class _Flight:
    """A background flush: its job and what it writes (for the error that names them, and to be
    held when the disk refuses it)."""

    job: _Job
    tables: tuple[str, ...]
    rows: int
    pending: dict[str, list[pa.Table]]
    wide: list[pa.Table]
    keys: set[BatchKey]


class _Job:
    """``fn(*args)``, on a thread of its own when ``background`` (else when the result is asked for)."""

    def __init__(self, fn: Callable[..., Any], *args: Any, background: bool) -> None:
        self._fn, self._args = fn, args
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True) if background else None
        if self._thread is not None:
            self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn(*self._args)
        except BaseException as e:  # handed to the caller by result()
            self._error = e

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def result(self) -> Any:
        if self._thread is None:
            return self._fn(*self._args)
        self.join()
        if self._error is not None:
            raise self._error
        return self._value


def _one_table(parts: list[pa.Table]) -> pa.Table:
    """Appended tables of one store table as one table of one contiguous chunk."""
    if len(parts) > 1 and any(not p.schema.equals(parts[0].schema) for p in parts):
        # a column dictionary-encoded in one append and not in another: all plain, one schema
        parts = [_decoded_table(p) for p in parts]
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts).combine_chunks()


def _insert(con: duckdb.DuckDBPyConnection, table: str, parts: list[pa.Table]) -> None:
    # one contiguous chunk: DuckDB writes whole row groups straight to the file (dictionary-encoded
    # columns, the writer's repeated and constant ones, are read by DuckDB as they are)
    _phaselens_append = _one_table(parts)
    # DuckDB finds the Arrow table by this local's name (a replacement scan): no catalog entry to
    # create and drop, which costs more than the INSERT itself for the writer's small batches
    con.execute(f'INSERT INTO "{table}" BY NAME SELECT * FROM _phaselens_append')


# -- helpers ----------------------------------------------------------------------------------------


def _decoded_table(data: pa.Table) -> pa.Table:
    """``data`` with its dictionary-encoded columns as plain values."""
    if not any(pa.types.is_dictionary(t) for t in data.schema.types):
        return data
    return pa.Table.from_arrays([_decoded(c) for c in data.columns], names=data.column_names)


_Span = tuple[int, int, int]  # (first row, rows, rows per block when only the first block counts else 0)


_n_of = attrgetter("n")


def _device_spans(runs: Sequence[ColumnRun]) -> list[_Span]:
    """Per run of gpu_samples blocks, the rows whose device attributes the flush must look at: a
    run whose device key and attribute columns are one shared ``repeats`` object and constants
    (the same GPUs, unchanged, poll after poll) needs its first block only, with each GPU's
    earliest ts; any other run all its rows."""
    spans: list[_Span] = []
    offset = 0
    for run in runs:
        rows = run.rows
        first = run.blocks[0]
        per_block = first.n if len(run.blocks) > 1 and run.repeats and _same_devices(run) else 0
        spans.append((offset, rows, per_block))
        offset += rows
    return spans


def _same_devices(run: ColumnRun) -> bool:
    """Whether every block of ``run`` holds the same GPUs with the same attributes, each once."""
    first = run.blocks[0]
    constants = [b.constants for b in run.blocks]
    if constants.count(first.constants) != len(constants):  # e.g. polls of two nodes in one run
        return False
    keyed: list[Any] = []
    for name in _DEVICE_INPUT[:-1]:  # all but ts_s
        if name in run.keys:
            return False
        if name in DEVICE_KEY:
            keyed.append(
                run.repeats[name] if name in run.repeats else repeat(first.constants.get(name), first.n)
            )
    return len(set(zip(*keyed, strict=False))) == first.n  # no GPU twice in one poll (repeat: endless)


def _device_input(data: pa.Table, spans: Sequence[_Span] | None) -> pa.Table:
    """The rows of wide gpu_samples ``data`` that the devices bookkeeping must see."""
    wide = data.select(_DEVICE_INPUT)
    if spans is None or not any(per_block for _, _, per_block in spans):
        return _decoded_table(wide)
    ts = data.column("ts_s").to_numpy()
    rows, times = [], []
    for offset, n, per_block in spans:
        if per_block:
            rows.append(np.arange(offset, offset + per_block))
            times.append(ts[offset : offset + n].reshape(-1, per_block).min(axis=0))
        else:
            rows.append(np.arange(offset, offset + n))
            times.append(ts[offset : offset + n])
    wide = _decoded_table(wide.take(pa.array(np.concatenate(rows))))
    return wide.set_column(len(_DEVICE_INPUT) - 1, "ts_s", pa.array(np.concatenate(times)))


def _load_columns(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, Column]]:
    out: dict[str, dict[str, Column]] = {}
    rows = con.execute(
        "SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns "
        "WHERE table_schema = 'main' AND table_catalog = current_database() "
        "ORDER BY table_name, ordinal_position"
    ).fetchall()
    stored: dict[str, bool] = {}  # the columns of the keyed gpu_samples' tables: NOT NULL or not
    for table, name, dtype, nullable in rows:
        if table in (gpu_keys.ROWS_TABLE, gpu_keys.KEYS_TABLE):
            stored[name] = stored.get(name, False) or nullable == "NO"
        if table not in TABLES:
            continue
        arrow_type = _ARROW_TYPES.get(dtype)
        if arrow_type is None:
            raise StoreError(f"column {table}.{name} has type {dtype}, which the append path does not handle")
        out.setdefault(table, {})[name] = Column(name, dtype, arrow_type, nullable == "NO")
    if stored and "gpu_samples" in out:  # a view: its columns are as NOT NULL as what they show
        out["gpu_samples"] = {
            n: Column(n, c.duckdb_type, c.arrow_type, stored.get(n, c.not_null))
            for n, c in out["gpu_samples"].items()
        }
    return out


def _check_names(table: str, names: Sequence[str], cols: Mapping[str, Column]) -> None:
    unknown = [n for n in names if n not in cols]
    if unknown:
        raise StoreError(
            f"{table}: unknown column(s) {', '.join(map(repr, unknown))}; columns: {', '.join(cols)}"
        )
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if list(names).count(n) > 1})
        raise StoreError(f"{table}: duplicate column(s) {', '.join(map(repr, dupes))}")


def _rows_to_table(table: str, rows: Sequence[Mapping[str, Any]], cols: Mapping[str, Column]) -> pa.Table:
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise StoreError(f"{table}: row {i} is a {type(row).__name__}, not a dict")
    names = list(dict.fromkeys(chain.from_iterable(rows)))
    _check_names(table, names, cols)
    first = rows[0].keys() if rows else None
    if first is not None and not any(cols[n].is_json for n in names) and all(r.keys() == first for r in rows):
        try:  # every row has the same keys (rows from one source): Arrow pivots them in one pass
            return pa.Table.from_pylist(rows)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            pass  # the column by column path below names the column that is wrong
    columns: dict[str, list[Any]] = {}
    for name in names:
        values = [row.get(name) for row in rows]
        if cols[name].is_json:
            values = [_json_text(table, name, v) for v in values]
        columns[name] = values
    return _columns_to_table(table, columns)


def _columns_to_table(table: str, columns: Mapping[str, list[Any]]) -> pa.Table:
    arrays = []
    for name, values in columns.items():
        try:
            arrays.append(pa.array(values))
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            raise StoreError(f"{table}.{name}: values of mixed or unsupported types: {e}") from e
    return pa.Table.from_arrays(arrays, names=list(columns))


def _json_text(table: str, name: str, value: Any) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise StoreError(f"{table}.{name}: value is not JSON-serialisable: {e}") from e


def _conform(table: str, data: pa.Table, cols: Mapping[str, Column]) -> pa.Table:
    """Cast every input column to its target type; missing columns and NULLs get the default, if any."""
    spec = TABLES[table]
    n = data.num_rows
    present = set(data.column_names)
    arrays: list[pa.Array | pa.ChunkedArray] = []
    for col in cols.values():
        if col.name in present:
            arr = data.column(col.name)
            if pa.types.is_dictionary(arr.type):
                keep = not col.is_json and col.name not in spec.defaults and col.name != spec.generated_id
                arr = _dictionary_cast(table, col, arr) if keep else _decoded(arr)
            else:
                arr = _cast(table, col, arr)
        else:
            arr = pa.nulls(n, col.arrow_type)
        if col.name in spec.defaults and arr.null_count:
            arr = arr.fill_null(pa.scalar(spec.defaults[col.name], col.arrow_type))
        if col.name == spec.generated_id and arr.null_count:
            ids = arr.to_pylist()
            arr = pa.array([v if v is not None else uuid.uuid4().hex for v in ids], type=col.arrow_type)
        if col.not_null and arr.null_count:
            raise StoreError(f"{table}.{col.name} must not be NULL ({arr.null_count} of {n} rows are)")
        arrays.append(arr)
    return pa.Table.from_arrays(arrays, names=list(cols))


def _decoded(arr: pa.ChunkedArray) -> pa.ChunkedArray:
    """A dictionary-encoded column as plain values (anything else as it is)."""
    return arr.cast(arr.type.value_type) if pa.types.is_dictionary(arr.type) else arr


def _dictionary_cast(table: str, col: Column, arr: pa.ChunkedArray) -> pa.ChunkedArray:
    """A dictionary-encoded column (the writer's repeated and constant columns) with its values
    cast to the column's type, still encoded: checks and casts run over the distinct values, not
    every row. A dictionary holding a NULL or a NaN is decoded first, so that the NULL checks and
    the NaN-means-NULL rule count rows, as for any other column."""
    target = pa.dictionary(arr.type.index_type, col.arrow_type)
    chunks = []
    for chunk in arr.chunks:
        values = chunk.dictionary
        if values.null_count or (pa.types.is_floating(values.type) and pc.any(pc.is_nan(values)).as_py()):
            return _cast(table, col, _decoded(arr))
        if values.type != col.arrow_type:
            values = _cast(table, col, pa.chunked_array([values])).combine_chunks()
        chunks.append(pa.DictionaryArray.from_arrays(chunk.indices, values))
    return pa.chunked_array(chunks, type=target)


def _cast(table: str, col: Column, arr: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_floating(arr.type) and pc.any(pc.is_nan(arr)).as_py():
        arr = pc.if_else(pc.is_nan(arr), pa.scalar(None, arr.type), arr)  # NaN means "no value": NULL
    if arr.type == col.arrow_type:
        return arr
    if col.is_json and arr.type not in _STRING_TYPES and not pa.types.is_null(arr.type):
        return pa.chunked_array(
            [pa.array([_json_text(table, col.name, v) for v in arr.to_pylist()], type=pa.string())]
        )
    try:
        return arr.cast(col.arrow_type, safe=True)
    except (pa.ArrowException, ValueError, TypeError) as e:
        raise StoreError(f"{table}.{col.name}: cannot store {arr.type} as {col.duckdb_type}: {e}") from e


def to_epoch_s(value: TimeLike, what: str = "time") -> float:
    """Epoch seconds from a number or a timezone-aware datetime; StoreError naming ``what``."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise StoreError(
                f"{what}: naive datetime {value}; pass a timezone-aware datetime or epoch seconds"
            )
        return value.timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise StoreError(f"{what} must be epoch seconds or a timezone-aware datetime, got {type(value).__name__}")


def _locked_message(path: Path, duckdb_message: str, read_only: bool) -> str:
    match = re.search(r"PID (\d+)", duckdb_message)
    pid = match.group(1) if match else "unknown"
    msg = (
        f"{path} is open by another phaselens collector (pid {pid}?) — DuckDB allows one writing "
        f"process; stop that process, or read through its collector API"
    )
    if read_only:
        msg += " (DuckDB refuses even a read-only open while a writer holds the file)"
    return msg
