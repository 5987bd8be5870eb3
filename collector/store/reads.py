"""The store's reads: a cursor of their own per read, any thread; a mixin of
:class:`collector.store.store.Store` (which holds the connection and the reader bookkeeping)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import duckdb
import pandas as pd

from collector.store.errors import StoreError
from collector.store.tables import table_spec

TimeLike = float | int | datetime


class Reads:
    """``reader``, ``query``, ``range`` and ``latest_per_device`` of a Store."""

    __slots__ = ()

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
