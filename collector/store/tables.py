"""What the store knows about each table beyond its columns: time column and natural key.

The time column drives ``Store.range`` and the Parquet ``date`` partition; the natural key is
what identifies "the same row" when exports from several nodes are merged (no duplicates).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from collector.store.errors import StoreError


@dataclass(frozen=True, slots=True)
class TableSpec:
    """A data table: its time column (UTC epoch seconds) and natural key columns."""

    name: str
    time_column: str
    natural_key: tuple[str, ...]
    generated_id: str | None = None  # an id column filled with a fresh uuid when missing/NULL
    defaults: dict[str, Any] = field(default_factory=dict)  # values for columns missing in the input
    # A row holds state from its time on, for the thing these columns name: an export from a start
    # time also carries each thing's row in effect at that start.
    state_key: tuple[str, ...] | None = None
    read_as: str | None = None  # the view ``Store.range`` reads (the table joined with what it refers to)


TABLES: dict[str, TableSpec] = {
    spec.name: spec
    for spec in (
        TableSpec(
            "gpu_samples", "ts_s", ("node", "source", "device", "index", "ts_s"), read_as="gpu_samples_full"
        ),
        TableSpec(
            "gpu_samples_10s",
            "bucket_start_s",
            ("node", "source", "device", "index", "bucket_start_s"),
            read_as="gpu_samples_10s_full",
        ),
        TableSpec(
            "devices",
            "since_s",
            ("node", "source", "device", "index", "since_s"),
            state_key=("node", "source", "device", "index"),
        ),
        TableSpec("host_samples", "ts_s", ("node", "pid", "ts_s")),
        TableSpec("emulation_samples", "ts_s", ("node", "source", "device", "index", "ts_s")),
        TableSpec("ingest_errors", "ts_s", ("node", "source", "ts_s", "kind", "message")),
        TableSpec("telemetry_batches", "received_s", ("node", "source", "seq", "sent_s")),
        # gpu_index: a tensor-parallel worker has one row per rank (GPU) for each iteration
        TableSpec("iterations", "start_s", ("node", "source", "worker", "start_s", "gpu_index")),
        TableSpec("requests", "arrival_s", ("node", "request_id")),
        TableSpec("tokens", "ts_s", ("node", "request_id", "idx")),
        TableSpec("control_events", "ts_s", ("node", "source", "ts_s", "action", "target")),
        TableSpec("telemetry_gaps", "detected_at_s", ("node", "source", "after_seq", "detected_at_s")),
        TableSpec("engine_metrics", "ts_s", ("node", "endpoint", "metric", "labels", "ts_s")),
        TableSpec("calibrations", "ts_s", ("calibration_id",), generated_id="calibration_id"),
        TableSpec("recommendations", "ts_s", ("recommendation_id",), generated_id="recommendation_id"),
        TableSpec(
            "actions", "ts_s", ("action_id",), generated_id="action_id", defaults={"rolled_back": False}
        ),
        TableSpec("reports", "ts_s", ("report_id",), generated_id="report_id"),
        TableSpec("workloads", "ts_s", ("workload_id",), generated_id="workload_id"),
        TableSpec("power_calibrations", "ts_s", ("calibration_id",), generated_id="calibration_id"),
        # one row per simulated scenario; its rows elsewhere have node 'sim:<scenario_id>'
        TableSpec("scenarios", "created_s", ("scenario_id",), defaults={"label": "simulated"}),
    )
}


def table_spec(name: str) -> TableSpec:
    """Return the spec of a data table; StoreError naming the known tables otherwise."""
    try:
        return TABLES[name]
    except KeyError:
        raise StoreError(f"unknown table {name!r}; tables: {', '.join(sorted(TABLES))}") from None
