"""Data lifecycle: 10 s rollups of raw GPU samples, retention, and Parquet export/import.

Raw ``gpu_samples`` (e.g. 100 ms) are kept for days; ``rollup`` folds whole 10 s buckets older
than the raw retention into ``gpu_samples_10s`` and deletes those raw rows, in one transaction.
It is idempotent: a second run finds no raw rows left to fold. Raw rows that arrive late for a
bucket that was already rolled up are merged into it (averages weighted by sample counts). Device
attributes stay in ``devices`` (the rollup's ``gpu_samples_10s_full`` view joins them); retention
drops only ``devices`` rows superseded before the rollup horizon.

``export_parquet`` writes every table as hive-partitioned Parquet
(``<out>/<table>/date=YYYY-MM-DD/node=<node>/part_<uuid>.parquet``; ``date`` is the UTC day of
the table's time column), which is how data from many nodes is combined: ``import_parquet``
merges such a tree into a store, skipping rows whose natural key
(``collector.store.tables.TABLES``) is already present, so re-importing is harmless. An export
from a start time also carries each GPU's ``devices`` row in effect at that start. Exports of the
version-5 shape (``gpu_samples`` with ``kind``/``uuid``/``name``/``k8s_*``) import too: those
columns become ``devices`` rows.

Every export directory also holds ``_phaselens_export.json`` (the manifest: format, the schema
version of the store that wrote it, rows per table). Import refuses, before writing anything, a
directory that is no export (no manifest and no ``<table>/`` folder of Parquet files), one with a
table this store does not know, and one written by a newer schema; rows the store cannot take
(types, constraints) roll the whole import back.

Simulated scenarios (``node = 'sim:<scenario_id>'``) live in virtual time: retention leaves their
rows alone (their timestamps say nothing about their age).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb

from collector.store import gpu_keys, iteration_seconds
from collector.store.devices import DEVICE_ATTRIBUTES, DEVICE_KEY, SPLIT_COLUMNS
from collector.store.errors import ExportFormatError, StoreError
from collector.store.reads import TimeLike, to_epoch_s
from collector.store.schema import LATEST_VERSION, ROLLUP_AVG_MAX_METRICS, SIMULATED_NODE_PREFIX
from collector.store.store import Store
from collector.store.tables import TABLES

BUCKET_S = 10.0
_DAY_S = 86_400.0
_ROLLUP_KEY = ("node", "source", "device", "index", "bucket_start_s")
_ROLLUP_MATCH = " AND ".join(f'{{a}}."{k}" IS NOT DISTINCT FROM {{b}}."{k}"' for k in _ROLLUP_KEY)
_DEVICE_MATCH = " AND ".join(f'{{a}}."{k}" IS NOT DISTINCT FROM {{b}}."{k}"' for k in DEVICE_KEY)
# where a wide (version-5) gpu_samples / gpu_samples_10s export keeps a row's time
_WIDE_TIME = {"gpu_samples": "ts_s", "gpu_samples_10s": "bucket_start_s"}
EXPORT_MANIFEST = "_phaselens_export.json"  # in the root of every export directory
EXPORT_FORMAT = "phaselens-parquet-export"
# rows retention keeps whatever their time: simulated scenarios, in virtual time
_NOT_SIMULATED = f"NOT starts_with(node, '{SIMULATED_NODE_PREFIX}')"
# DuckDB errors that mean the files hold rows the store cannot take (the import is rolled back)
_BAD_ROWS = (
    duckdb.ConversionException,
    duckdb.ConstraintException,
    duckdb.InvalidInputException,
    duckdb.BinderException,
)


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long raw samples and their 10 s rollups are kept, in days."""

    raw_days: float = 7.0
    rollup_days: float = 365.0

    def __post_init__(self) -> None:
        for name in ("raw_days", "rollup_days"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
                raise StoreError(f"RetentionPolicy.{name} must be a positive number of days, got {value!r}")
        if self.rollup_days < self.raw_days:
            raise StoreError(
                f"RetentionPolicy.rollup_days ({self.rollup_days}) must be >= raw_days ({self.raw_days})"
            )


@dataclass(frozen=True, slots=True)
class RollupResult:
    """What one retention pass did."""

    cutoff_s: float  # raw rows before this (a 10 s boundary) were folded and deleted
    buckets_written: int
    raw_rows_deleted: int
    rollup_rows_deleted: int = 0
    device_rows_deleted: int = 0  # devices rows superseded before the rollup horizon


@dataclass(frozen=True, slots=True)
class ExportResult:
    """Rows written per table by ``export_parquet``."""

    out_dir: Path
    rows: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ImportResult:
    """Per table: rows inserted, rows skipped as already present, file columns the table lacks."""

    inserted: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)
    ignored_columns: dict[str, list[str]] = field(default_factory=dict)
    schema_version: int | None = None  # of the store that wrote the export (None: no manifest)


def rollup(store: Store, older_than_s: float, *, now_s: float | None = None) -> RollupResult:
    """Fold raw gpu_samples older than ``older_than_s`` seconds into 10 s rollups, then delete them.

    Only whole buckets are folded: the cutoff is ``now - older_than_s`` rounded down to 10 s.
    """
    if not isinstance(older_than_s, int | float) or isinstance(older_than_s, bool) or older_than_s < 0:
        raise StoreError(f"older_than_s must be a non-negative number of seconds, got {older_than_s!r}")
    now = time.time() if now_s is None else float(now_s)
    cutoff = math.floor((now - older_than_s) / BUCKET_S) * BUCKET_S
    with store.transaction() as con:
        con.execute(f"CREATE OR REPLACE TEMP TABLE _rollup_merged AS {_merge_sql()}", [cutoff])
        buckets = con.execute("SELECT count(*) FROM _rollup_merged").fetchone()[0]
        if buckets:
            match = _ROLLUP_MATCH.format(a="r", b="m")
            con.execute(f"DELETE FROM gpu_samples_10s r USING _rollup_merged m WHERE {match}")
            con.execute("INSERT INTO gpu_samples_10s BY NAME SELECT * FROM _rollup_merged")
        deleted = con.execute(gpu_keys.delete_sql(_NOT_SIMULATED, "ts_s < ?"), [cutoff]).fetchone()[0]
        # An emulated GPU's raw counters go with its raw samples (the rollup keeps host_bound_pct).
        con.execute(f"DELETE FROM emulation_samples WHERE ts_s < ? AND {_NOT_SIMULATED}", [cutoff])
        con.execute("DROP TABLE _rollup_merged")
    return RollupResult(cutoff_s=cutoff, buckets_written=int(buckets), raw_rows_deleted=int(deleted))


def apply_retention(store: Store, policy: RetentionPolicy, *, now_s: float | None = None) -> RollupResult:
    """Roll up raw samples older than ``policy.raw_days``; drop rollups older than ``rollup_days``.

    ``devices`` rows superseded by a later row of the same GPU that starts before the rollup
    horizon describe only data that is gone, and are dropped too.
    """
    now = time.time() if now_s is None else float(now_s)
    result = rollup(store, policy.raw_days * _DAY_S, now_s=now)
    horizon = now - policy.rollup_days * _DAY_S
    with store.transaction() as con:
        expired = con.execute(
            f"DELETE FROM gpu_samples_10s WHERE bucket_start_s < ? AND {_NOT_SIMULATED}", [horizon]
        ).fetchone()[0]
        superseded = con.execute(
            f"""DELETE FROM devices d WHERE since_s < $h AND {_NOT_SIMULATED} AND EXISTS (
                    SELECT 1 FROM devices n
                    WHERE {_DEVICE_MATCH.format(a="n", b="d")} AND n.since_s > d.since_s AND n.since_s <= $h)""",
            {"h": horizon},
        ).fetchone()[0]
    return RollupResult(
        result.cutoff_s, result.buckets_written, result.raw_rows_deleted, int(expired), int(superseded)
    )


def export_parquet(
    store: Store,
    out_dir: str | Path,
    *,
    start: TimeLike | datetime | None = None,
    end: TimeLike | datetime | None = None,
    tables: list[str] | None = None,
) -> ExportResult:
    """Write tables (default: all data tables) as hive-partitioned Parquet by date and node.

    Only rows whose time column lies in ``[start, end)`` are written, plus, for a table of state
    rows (``devices``), each thing's row in effect at ``start``. New files never overwrite earlier
    exports in the same directory (file names carry a uuid); the manifest (``EXPORT_MANIFEST``) then
    counts the rows of all of them. Reads committed data only.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result = ExportResult(out)
    for name in list(TABLES) if tables is None else tables:
        spec = TABLES.get(name)
        if spec is None:
            raise StoreError(f"unknown table {name!r}; tables: {', '.join(sorted(TABLES))}")
        tc = spec.time_column
        rows = _export_rows(name, tc, spec.state_key, start, end)
        with store.reader() as cur:
            count = cur.execute(f"SELECT count(*) FROM ({rows})").fetchone()[0]
            if count:
                cur.execute(
                    f"""COPY (SELECT *, DATE '1970-01-01' + CAST(floor("{tc}" / {_DAY_S}) AS INTEGER) AS date
                              FROM ({rows}))
                        TO {_sql_str(out / name)}
                        (FORMAT PARQUET, PARTITION_BY (date, node), WRITE_PARTITION_COLUMNS true,
                         FILENAME_PATTERN 'part_{{uuid}}', OVERWRITE_OR_IGNORE true)"""
                )
        result.rows[name] = int(count)
    _write_manifest(store, out, result, start, end)
    return result


def import_parquet(store: Store, in_dir: str | Path) -> ImportResult:
    """Merge a tree written by ``export_parquet`` (any node's) into ``store``, in one transaction.

    Rows whose natural key is already in the store, or repeated within the files, are skipped.
    Columns the files have but the table lacks are ignored (and listed); columns the files lack
    are NULL. Device attributes in ``gpu_samples``/``gpu_samples_10s`` files (the version-5 shape)
    become ``devices`` rows, one per run of unchanged attributes, counted under ``devices``.
    """
    root = Path(in_dir)
    try:
        version, present = check_export(root, store.schema_version)
    except OSError as e:
        raise ExportFormatError(f"cannot read the export {root}: {e}") from e
    result = ImportResult(schema_version=version)
    with store.transaction() as con:
        try:
            _import_tables(store, con, root, present, result)
        except _BAD_ROWS as e:
            raise ExportFormatError(
                f"{root}: the Parquet files hold rows the store cannot take (nothing was imported): {e}"
            ) from e
    return result


def check_export(root: Path, store_version: int = LATEST_VERSION) -> tuple[int | None, set[str]]:
    """Check that ``root`` is a Parquet export a store at ``store_version`` can import; return the
    export's schema version (None when it has no manifest) and the tables it holds files of.

    ExportFormatError names what is wrong: not a directory, no export (neither a manifest nor a
    ``<table>/`` folder of Parquet files), a table this store does not know, a newer schema.
    """
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is a file"
        raise ExportFormatError(f"{root} is not a directory of Parquet exports (it {what})")
    version = _manifest_version(root)
    present: set[str] = set()
    unknown: list[str] = []
    for sub in sorted(root.iterdir()):
        if not sub.is_dir() or sub.name.startswith((".", "_")) or not any(sub.rglob("*.parquet")):
            continue
        if sub.name in TABLES:
            present.add(sub.name)
        else:
            unknown.append(sub.name)
    if version is not None and version > store_version:
        raise ExportFormatError(
            f"{root} was exported with schema version {version}, newer than this store's "
            f"(version {store_version}); upgrade phaselens to import it"
        )
    if unknown:
        raise ExportFormatError(
            f"{root} holds table(s) this store does not know: {', '.join(unknown)}; "
            f"tables: {', '.join(sorted(TABLES))}"
        )
    if version is None and not present:
        raise ExportFormatError(
            f"{root} is not a phaselens export: it has no {EXPORT_MANIFEST} and no <table>/ folder of "
            f"Parquet files (write one with `phaselens store export DIR`)"
        )
    return version, present


def _manifest_version(root: Path) -> int | None:
    """The schema version in ``root``'s manifest; None without one; ExportFormatError if unreadable."""
    path = root / EXPORT_MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ExportFormatError(f"{path} is not a readable export manifest: {e}") from e
    if not isinstance(manifest, dict) or manifest.get("format") != EXPORT_FORMAT:
        raise ExportFormatError(
            f"{path} is not a phaselens export manifest (format must be {EXPORT_FORMAT!r})"
        )
    version = manifest.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ExportFormatError(f"{path}: schema_version must be a positive integer, got {version!r}")
    return version


def _write_manifest(
    store: Store, out: Path, result: ExportResult, start: TimeLike | None, end: TimeLike | None
) -> None:
    """Write (or update, for a second export into ``out``) the export's manifest, atomically."""
    path = out / EXPORT_MANIFEST
    version, rows = store.schema_version, dict(result.rows)
    try:
        old: Any = json.loads(path.read_text()) if path.exists() else None
    except (OSError, ValueError):
        old = None  # unreadable: this export's manifest replaces it
    if isinstance(old, dict) and old.get("format") == EXPORT_FORMAT:
        if isinstance(old.get("schema_version"), int):
            version = max(version, old["schema_version"])  # the files of a newer export stay newer
        for name, n in (old.get("rows") or {}).items():
            if isinstance(n, int):
                rows[name] = rows.get(name, 0) + n
    manifest = {
        "format": EXPORT_FORMAT,
        "schema_version": version,
        "exported_at_s": time.time(),
        "start_s": None if start is None else to_epoch_s(start, "start"),
        "end_s": None if end is None else to_epoch_s(end, "end"),
        "rows": rows,
    }
    tmp = out / f".{EXPORT_MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _import_tables(
    store: Store, con: duckdb.DuckDBPyConnection, root: Path, present: set[str], result: ImportResult
) -> None:
    """The inserts of ``import_parquet`` (inside its transaction), table by table."""
    for name, spec in TABLES.items():
        table_dir = root / name
        if name not in present:
            continue
        src = (
            f"read_parquet({_sql_str(table_dir / '**' / '*.parquet')}, "
            "hive_partitioning = false, union_by_name = true)"
        )
        file_cols = [row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()]
        table_cols = [c.name for c in store.columns(name)]
        missing_keys = [k for k in spec.natural_key if k not in file_cols]
        if missing_keys:
            raise ExportFormatError(
                f"{table_dir}: Parquet files lack key column(s) {', '.join(missing_keys)}"
            )
        cols = ", ".join(f'"{c}"' for c in table_cols if c in file_cols)
        keys = ", ".join(f'"{k}"' for k in spec.natural_key)
        match = " AND ".join(f't."{k}" IS NOT DISTINCT FROM s."{k}"' for k in spec.natural_key)
        total = con.execute(f"SELECT count(*) FROM {src}").fetchone()[0]
        select = f"""SELECT {cols} FROM (SELECT DISTINCT ON ({keys}) {cols} FROM {src}) s
                     WHERE NOT EXISTS (SELECT 1 FROM "{name}" t WHERE {match})"""
        if name == "gpu_samples":  # stored keyed (collector/store/gpu_keys.py)
            names = [c for c in table_cols if c in file_cols]
            absent = [c for c in gpu_keys.IDENTITY if c not in file_cols]  # NULL: refused if required
            nulls = "".join(f', NULL AS "{c}"' for c in absent)
            inserted = gpu_keys.insert_select(con, [*names, *absent], f"SELECT *{nulls} FROM ({select})")
        elif name == "iterations":  # and their per-second rollup (collector/store/iteration_seconds.py)
            con.execute(f"CREATE OR REPLACE TEMP TABLE _import_iterations AS {select}")
            inserted = con.execute(
                f'INSERT INTO "{name}" ({cols}) SELECT {cols} FROM _import_iterations'
            ).fetchone()[0]
            iteration_seconds.add(con, "_import_iterations", [c for c in table_cols if c in file_cols])
            con.execute("DROP TABLE _import_iterations")
        else:
            inserted = con.execute(f'INSERT INTO "{name}" ({cols}) {select}').fetchone()[0]
        result.inserted[name] = int(inserted)
        result.duplicates[name] = int(total) - int(inserted)
        split = name in _WIDE_TIME and any(c in file_cols for c in SPLIT_COLUMNS)
        if split:
            added = con.execute(_wide_devices_sql(src, _WIDE_TIME[name], file_cols)).fetchone()[0]
            result.inserted["devices"] = result.inserted.get("devices", 0) + int(added)
        ignored = [
            c for c in file_cols if c not in table_cols and c != "date" and not (split and c in SPLIT_COLUMNS)
        ]
        if ignored:
            result.ignored_columns[name] = ignored


def _export_rows(
    table: str,
    tc: str,
    state_key: tuple[str, ...] | None,
    start: TimeLike | datetime | None,
    end: TimeLike | datetime | None,
) -> str:
    """SELECT of the rows of ``table`` to export: time in ``[start, end)``, plus for state rows the
    newest row before ``start`` of each ``state_key``."""
    lo = None if start is None else to_epoch_s(start, "start")
    hi = None if end is None else to_epoch_s(end, "end")
    where = [f'"{tc}" < {hi!r}'] if hi is not None else []
    if lo is None or state_key is None:
        if lo is not None:
            where.append(f'"{tc}" >= {lo!r}')
        cond = f"WHERE {' AND '.join(where)}" if where else ""
        return f'SELECT * FROM "{table}" {cond}'
    cond = f"WHERE {' AND '.join(where)}" if where else ""
    part = ", ".join(f'"{k}"' for k in state_key)
    return f"""SELECT * EXCLUDE (_newest) FROM (
                   SELECT *, row_number() OVER (PARTITION BY {part}, "{tc}" < {lo!r} ORDER BY "{tc}" DESC)
                             AS _newest
                   FROM "{table}" {cond})
               WHERE "{tc}" >= {lo!r} OR _newest = 1"""


def _wide_devices_sql(src: str, time_column: str, file_cols: list[str]) -> str:
    """INSERT of the ``devices`` rows a wide gpu_samples(_10s) export implies, where not present:
    per GPU, the first row of each run of unchanged attributes."""
    key = ", ".join(f'"{k}"' for k in DEVICE_KEY)
    attrs = ", ".join(f'"{c}"' if c in file_cols else f'NULL AS "{c}"' for c in DEVICE_ATTRIBUTES)
    attr_names = ", ".join(f'"{c}"' for c in DEVICE_ATTRIBUTES)
    return f"""
    INSERT INTO devices ({key}, since_s, {attr_names})
    SELECT {key}, since_s, {attr_names} FROM (
        SELECT *, row({attr_names}) IS DISTINCT FROM
                  lag(row({attr_names})) OVER (PARTITION BY {key} ORDER BY since_s) AS changed
        FROM (SELECT {key}, "{time_column}" AS since_s, {attrs} FROM {src})
    ) s
    WHERE changed AND NOT EXISTS (
        SELECT 1 FROM devices t WHERE {_DEVICE_MATCH.format(a="t", b="s")} AND t.since_s = s.since_s)
    """


def _merge_sql() -> str:
    """SELECT of merged rollup rows: fresh buckets from raw rows (``ts_s < ?``) + existing rows."""
    fresh_metrics = ",\n".join(f"avg({m}) AS avg_{m}, max({m}) AS max_{m}" for m in ROLLUP_AVG_MAX_METRICS)
    merged_metrics = ",\n".join(
        f"sum(avg_{m} * samples) / sum(CASE WHEN avg_{m} IS NOT NULL THEN samples END) AS avg_{m}, "
        f"max(max_{m}) AS max_{m}"
        for m in ROLLUP_AVG_MAX_METRICS
    )
    key = ", ".join(f'"{k}"' for k in _ROLLUP_KEY)
    return f"""
    WITH fresh AS (
        SELECT node, source, device, "index", floor(ts_s / {BUCKET_S}) * {BUCKET_S} AS bucket_start_s,
               bool_or(emulated) AS emulated,
               count(*) AS samples, count_if(lost IS TRUE) AS lost_samples,
               {fresh_metrics},
               min(energy_mj) AS min_energy_mj, max(energy_mj) AS max_energy_mj,
               max(mem_total_bytes) AS max_mem_total_bytes,
               bit_or(clock_event_reasons) AS any_clock_event_reasons,
               min(locked_sm_clock_min_mhz) AS min_locked_sm_clock_min_mhz,
               max(locked_sm_clock_max_mhz) AS max_locked_sm_clock_max_mhz
        FROM gpu_samples WHERE ts_s < ? AND {_NOT_SIMULATED}
        GROUP BY node, source, device, "index", floor(ts_s / {BUCKET_S}) * {BUCKET_S}
    ),
    old AS (SELECT r.* FROM gpu_samples_10s r SEMI JOIN fresh f ON {_ROLLUP_MATCH.format(a="r", b="f")}),
    both_rows AS (SELECT * FROM fresh UNION ALL BY NAME SELECT * FROM old)
    SELECT {key},
           bool_or(emulated) AS emulated,
           sum(samples) AS samples, sum(lost_samples) AS lost_samples,
           {merged_metrics},
           min(min_energy_mj) AS min_energy_mj, max(max_energy_mj) AS max_energy_mj,
           max(max_mem_total_bytes) AS max_mem_total_bytes,
           bit_or(any_clock_event_reasons) AS any_clock_event_reasons,
           min(min_locked_sm_clock_min_mhz) AS min_locked_sm_clock_min_mhz,
           max(max_locked_sm_clock_max_mhz) AS max_locked_sm_clock_max_mhz
    FROM both_rows GROUP BY {key}
    """


def _sql_str(value: str | Path) -> str:
    """A SQL string literal."""
    return "'" + str(value).replace("'", "''") + "'"
