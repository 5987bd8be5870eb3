"""The collector's DuckDB store (single writer): schema migrations, batched appends, retention.

Public API: :class:`Store` (``Store.open``), :class:`StoreError`, :class:`StoreLockedError`,
:class:`TelemetryIngest`, and the functions in :mod:`collector.store.retention`.
"""

from collector.store.errors import StoreError, StoreLockedError
from collector.store.retention import (
    ExportResult,
    ImportResult,
    RetentionPolicy,
    RollupResult,
    apply_retention,
    export_parquet,
    import_parquet,
    rollup,
)
from collector.store.schema import LATEST_VERSION, MIGRATIONS, Migration
from collector.store.store import ROW_GROUP_ROWS, WRITER_BUFFER_ROWS, Column, Store, TelemetryIngest

__all__ = [
    "LATEST_VERSION",
    "MIGRATIONS",
    "ROW_GROUP_ROWS",
    "WRITER_BUFFER_ROWS",
    "Column",
    "ExportResult",
    "ImportResult",
    "Migration",
    "RetentionPolicy",
    "RollupResult",
    "Store",
    "StoreError",
    "StoreLockedError",
    "TelemetryIngest",
    "apply_retention",
    "export_parquet",
    "import_parquet",
    "rollup",
]
