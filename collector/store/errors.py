"""The store's errors: one base class so callers can catch everything the store raises."""

from __future__ import annotations


class StoreError(Exception):
    """The store refused an operation; the message says what and why."""


class StoreLockedError(StoreError):
    """The DuckDB file is held by another process (DuckDB allows one writing process)."""


class ExportFormatError(StoreError):
    """A directory given to import is not a Parquet export this store can take (nothing imported)."""


class FlushError(StoreError):
    """A background flush of the write buffer failed: its rows (``rows``, in ``tables``) were rolled
    back, none of them written. Raised by the next call that waits for that flush (``flush``,
    ``checkpoint``, ``close``, or an append that finds the buffer due); an append that raises it
    took nothing of its own rows (call it again), ``flush``/``checkpoint``/``close`` raise it after
    doing their own work.

    ``held_rows`` of the ``rows`` were not lost: the storage could not take writes (no space left
    on device, ...) and the store holds them in its buffer to write with the next flush
    (collector/store/held.py)."""

    def __init__(self, message: str, *, tables: tuple[str, ...], rows: int, held_rows: int = 0) -> None:
        super().__init__(message)
        self.tables = tables
        self.rows = rows
        self.held_rows = held_rows
