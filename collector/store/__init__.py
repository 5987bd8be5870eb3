"""The collector's DuckDB store (single writer): schema migrations, batched appends, retention.

Public API: :class:`Store` (``Store.open``), :class:`StoreError`, :class:`StoreLockedError`, :class:`FlushError`,
:class:`TelemetryIngest`, the functions in :mod:`collector.store.retention` and, for simulated
scenarios, :mod:`collector.store.scenarios`.
"""

from collector.store.arrow_input import Column
from collector.store.errors import ExportFormatError, FlushError, StoreError, StoreLockedError
from collector.store.retention import (
    EXPORT_MANIFEST,
    ExportResult,
    ImportResult,
    RetentionPolicy,
    RollupResult,
    apply_retention,
    check_export,
    export_parquet,
    import_parquet,
    rollup,
)
from collector.store.scenarios import SIMULATED, delete_scenario, list_scenarios, scenario_node
from collector.store.schema import LATEST_VERSION, MIGRATIONS, Migration
from collector.store.store import ROW_GROUP_ROWS, WRITER_BUFFER_ROWS, Store
from collector.store.telemetry_writes import TelemetryIngest

__all__ = [
    "EXPORT_MANIFEST",
    "LATEST_VERSION",
    "MIGRATIONS",
    "ROW_GROUP_ROWS",
    "SIMULATED",
    "WRITER_BUFFER_ROWS",
    "Column",
    "ExportFormatError",
    "ExportResult",
    "FlushError",
    "ImportResult",
    "Migration",
    "RetentionPolicy",
    "RollupResult",
    "Store",
    "StoreError",
    "StoreLockedError",
    "TelemetryIngest",
    "apply_retention",
    "check_export",
    "delete_scenario",
    "export_parquet",
    "import_parquet",
    "list_scenarios",
    "rollup",
    "scenario_node",
]
