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

import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from operator import attrgetter
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa

from collector.store import gpu_keys
from collector.store.arrow_input import (
    Column,
    check_names,
    columns_to_table,
    conform,
    json_text,
    load_columns,
    rows_to_table,
)
from collector.store.column_build import build_columns
from collector.store.columns import ColumnBlock, ColumnRun, block_names, column_runs
from collector.store.device_input import Span, device_input, device_spans
from collector.store.devices import SPLIT_COLUMNS, DeviceRegistry
from collector.store.errors import FlushError, StoreError, StoreLockedError
from collector.store.flushing import Flight, Flushing
from collector.store.held import HeldDrop, invalidated, write_failure_cause
from collector.store.reads import Reads
from collector.store.schema import LATEST_VERSION, apply_migrations, check_version
from collector.store.tables import TABLES
from collector.store.telemetry_rows import BatchKey
from collector.store.telemetry_writes import TelemetryWrites
from serving.devices.base import DeviceSample

Rows = Sequence[Mapping[str, Any]] | pa.Table | pd.DataFrame
READER_CLOSE_TIMEOUT_S = 10.0  # close() waits this long for interrupted readers to let go
log = logging.getLogger(__name__)

_SAMPLE_FIELDS = tuple(DeviceSample.__dataclass_fields__)
ROW_GROUP_ROWS = 122_880  # DuckDB's row-group size: a batch this big is written straight to the file
# The collector's write buffer: a flush is due at this many rows (or each flush interval). Under a
# sustained high-rate stream every flush is then 4 whole row groups, which DuckDB takes at
# 1.4-1.7 M rows/s here against ~0.65 M at 1 row group (bench/ingest.py); ~50 MB of samples at most.
WRITER_BUFFER_ROWS = 4 * ROW_GROUP_ROWS
# While the disk refuses writes a buffering store holds up to this many buffers' rows (held.py)
HELD_BUFFERS = 2
_n_of = attrgetter("n")


class Store(TelemetryWrites, Reads, Flushing):
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
        self._flight: Flight | None = None  # the background flush being written, if any
        self._flight_con: duckdb.DuckDBPyConnection | None = None  # its cursor (made on first use)
        self._inflight_batches: set[BatchKey] = set()  # telemetry batches of that flush
        self._deferred: FlushError | None = None  # a failed background flush not yet reported
        self._devices_lock = threading.Lock()  # the registry: the writer's notes, a flight's changes
        self._readers: set[duckdb.DuckDBPyConnection] = set()  # reader cursors open now
        self._readers_done = threading.Condition()  # guards _readers and _closing
        self._closing = False
        self._columns = load_columns(con)
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
        return self._enqueue_table(table, data)

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
            return self._append_samples(data, device_spans(runs))
        data = self._columns_arrow(table, blocks)
        return self._enqueue_table(table, data)

    def _enqueue_table(self, table: str, data: pa.Table) -> int:
        """Queue converted rows of ``table`` (not ``gpu_samples``); a ``devices`` append also updates
        the writer's registry. The rows taken."""
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
        return conform(table, self._columns_table(table, blocks, cols), cols)

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
        check_names(table, names, cols)
        encoders = {n: partial(json_text, table, n) for n in names if cols[n].is_json}
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
        table = columns_to_table("gpu_samples", columns)
        return self._append_samples(self._input_table("gpu_samples", table, self._wide_samples))

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
        return conform(table, self._input_table(table, rows, cols), cols)

    def _input_table(self, table: str, rows: Rows, cols: Mapping[str, Column]) -> pa.Table:
        """Input rows as an Arrow table, column names checked against ``cols`` (types not yet)."""
        if isinstance(rows, pa.Table):
            data = rows
        elif isinstance(rows, pd.DataFrame):
            check_names(table, [str(c) for c in rows.columns], cols)
            try:
                data = pa.Table.from_pandas(rows, preserve_index=False)
            except (pa.ArrowException, ValueError, TypeError) as e:
                raise StoreError(f"{table}: cannot convert the DataFrame to Arrow: {e}") from e
        elif isinstance(rows, Sequence) and not isinstance(rows, str | bytes):
            data = rows_to_table(table, rows, cols)
        else:
            raise StoreError(
                f"{table}: rows must be a list of dicts, a pyarrow.Table or a pandas.DataFrame, "
                f"got {type(rows).__name__}"
            )
        check_names(table, data.column_names, cols)
        return data

    def _append_samples(self, data: pa.Table, spans: Sequence[Span] | None = None) -> int:
        """Queue gpu_samples input (names checked): the samples, and when the input carries device
        attributes, those for the flush to write ``devices`` rows where they changed (``spans``:
        the rows that can change them, from ``device_spans``; every row when None)."""
        wide = any(c in data.column_names for c in SPLIT_COLUMNS)
        samples = self._columns["gpu_samples"]
        data = conform("gpu_samples", data, self._wide_samples if wide else samples)
        if not wide:
            self._enqueue({"gpu_samples": data})
        else:
            self._enqueue({"gpu_samples": data.select(list(samples))}, device_input(data, spans))
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
