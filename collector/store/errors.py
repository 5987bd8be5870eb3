"""The store's errors: one base class so callers can catch everything the store raises."""

from __future__ import annotations


class StoreError(Exception):
    """The store refused an operation; the message says what and why."""


class StoreLockedError(StoreError):
    """The DuckDB file is held by another process (DuckDB allows one writing process)."""


class ExportFormatError(StoreError):
    """A directory given to import is not a Parquet export this store can take (nothing imported)."""
