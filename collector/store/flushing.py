"""The store's write path: the buffer, the background flush and the rows held while the disk
refuses writes (collector/store/held.py); a mixin of :class:`collector.store.store.Store`, which
holds the state (its ``__slots__``) and the connections. The threading and durability rules are
in collector/store/store.py's docstring.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from collector.store import gpu_keys, iteration_seconds
from collector.store.arrow_input import one_table
from collector.store.errors import FlushError, StoreError
from collector.store.held import drop_oldest, invalidated, write_failure_cause
from collector.store.telemetry_rows import BatchKey

log = logging.getLogger("collector.store.store")  # the store's own logger: one name for its messages

# From this many pending wide rows on, a flush works out the devices rows on a thread of its own
# while DuckDB inserts the samples (which keeps one core busy and releases the GIL).
_BACKGROUND_DEVICE_ROWS = 50_000


class Flushing:
    """The buffer and flush methods of a Store (the caller holds ``_lock`` where they say so)."""

    __slots__ = ()

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
        job = Job(self._write_pending, self._flight_con, pending, rows, wide, background=True)
        self._flight = Flight(job, tuple(pending), rows, pending, wide, self._inflight_batches)

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
        devices = Job(self._device_changes_locked, wide, background=background)
        added: dict[gpu_keys.Identity, int] = {}
        con.begin()
        try:
            try:
                for name, parts in pending.items():
                    if name == "gpu_samples":
                        keyed, added = self._gpu_keys.key_rows(con, one_table(parts))
                        _insert(con, gpu_keys.ROWS_TABLE, [keyed])
                    elif name == "iterations":  # and their per-second rollup, in the same transaction
                        data = one_table(parts)
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
class Flight:
    """A background flush: its job and what it writes (for the error that names them, and to be
    held when the disk refuses it)."""

    job: Job
    tables: tuple[str, ...]
    rows: int
    pending: dict[str, list[pa.Table]]
    wide: list[pa.Table]
    keys: set[BatchKey]


class Job:
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


def _insert(con: duckdb.DuckDBPyConnection, table: str, parts: list[pa.Table]) -> None:
    # one contiguous chunk: DuckDB writes whole row groups straight to the file (dictionary-encoded
    # columns, the writer's repeated and constant ones, are read by DuckDB as they are)
    _phaselens_append = one_table(parts)
    # DuckDB finds the Arrow table by this local's name (a replacement scan): no catalog entry to
    # create and drop, which costs more than the INSERT itself for the writer's small batches
    con.execute(f'INSERT INTO "{table}" BY NAME SELECT * FROM _phaselens_append')
