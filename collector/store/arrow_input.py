"""Input rows as Arrow tables with exactly a store table's columns and types.

What the store's appends convert with: the columns read from the file (:func:`load_columns`),
dicts, columns and DataFrames as Arrow (:func:`rows_to_table`, :func:`columns_to_table`), and
:func:`conform`, which casts every column to its type, fills defaults and names what does not fit.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from collector.store import gpu_keys
from collector.store.errors import StoreError
from collector.store.tables import TABLES

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


def one_table(parts: list[pa.Table]) -> pa.Table:
    """Appended tables of one store table as one table of one contiguous chunk."""
    if len(parts) > 1 and any(not p.schema.equals(parts[0].schema) for p in parts):
        # a column dictionary-encoded in one append and not in another: all plain, one schema
        parts = [decoded_table(p) for p in parts]
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts).combine_chunks()


def decoded_table(data: pa.Table) -> pa.Table:
    """``data`` with its dictionary-encoded columns as plain values."""
    if not any(pa.types.is_dictionary(t) for t in data.schema.types):
        return data
    return pa.Table.from_arrays([_decoded(c) for c in data.columns], names=data.column_names)


def load_columns(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, Column]]:
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


def check_names(table: str, names: Sequence[str], cols: Mapping[str, Column]) -> None:
    unknown = [n for n in names if n not in cols]
    if unknown:
        raise StoreError(
            f"{table}: unknown column(s) {', '.join(map(repr, unknown))}; columns: {', '.join(cols)}"
        )
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if list(names).count(n) > 1})
        raise StoreError(f"{table}: duplicate column(s) {', '.join(map(repr, dupes))}")


def rows_to_table(table: str, rows: Sequence[Mapping[str, Any]], cols: Mapping[str, Column]) -> pa.Table:
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise StoreError(f"{table}: row {i} is a {type(row).__name__}, not a dict")
    names = list(dict.fromkeys(chain.from_iterable(rows)))
    check_names(table, names, cols)
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
            values = [json_text(table, name, v) for v in values]
        columns[name] = values
    return columns_to_table(table, columns)


def columns_to_table(table: str, columns: Mapping[str, list[Any]]) -> pa.Table:
    arrays = []
    for name, values in columns.items():
        try:
            arrays.append(pa.array(values))
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            raise StoreError(f"{table}.{name}: values of mixed or unsupported types: {e}") from e
    return pa.Table.from_arrays(arrays, names=list(columns))


def json_text(table: str, name: str, value: Any) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise StoreError(f"{table}.{name}: value is not JSON-serialisable: {e}") from e


def conform(table: str, data: pa.Table, cols: Mapping[str, Column]) -> pa.Table:
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
            [pa.array([json_text(table, col.name, v) for v in arr.to_pylist()], type=pa.string())]
        )
    try:
        return arr.cast(col.arrow_type, safe=True)
    except (pa.ArrowException, ValueError, TypeError) as e:
        raise StoreError(f"{table}.{col.name}: cannot store {arr.type} as {col.duckdb_type}: {e}") from e
