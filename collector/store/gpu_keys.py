"""``gpu_samples`` stored keyed: one INTEGER ``gpu_key`` per GPU in place of its identity columns.

A sample's identity (``node, source, device, index, emulated``) is the same for every sample of a
GPU, so the rows live in ``gpu_sample_rows`` (``gpu_key``, ``ts_s``, the metrics) and ``gpu_keys``
holds each identity once. ``gpu_samples`` is a view joining the two back into the table's old
shape: every reader keeps its SQL. DuckDB then stores and compresses five columns fewer per
sample (three of them strings), which takes about a third off its CPU per appended row
(docs/BENCHMARKS.md, "ingest"). Keys are assigned by the writer, never reused or changed, so a
key known once stays valid for the life of the file.

Writes go through this module: :class:`GpuKeys` keys an Arrow table of samples (the writer's
path: the identity columns arrive dictionary-encoded, so the work is per distinct GPU, not per
row), :func:`insert_select` keys the rows of a SQL query (Parquet import), and
:func:`delete_sql` deletes by identity (retention, scenarios).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

ROWS_TABLE = "gpu_sample_rows"
KEYS_TABLE = "gpu_keys"
KEY_COLUMN = "gpu_key"
#: A sample's identity: the columns of ``gpu_samples`` that ``gpu_keys`` holds once per GPU.
IDENTITY = ("node", "source", "device", "index", "emulated")

_IDENT_SQL = ", ".join(f'"{c}"' for c in IDENTITY)
_MATCH = " AND ".join(f'x."{c}" IS NOT DISTINCT FROM k."{c}"' for c in IDENTITY)

Identity = tuple[Any, ...]


class GpuKeys:
    """The ``gpu_keys`` of one store: identity → key, for the keys committed to the file.

    Thread-safe (the writer's background flush and its own thread both key samples). A key is
    added to the cache only once the transaction that wrote it has committed (:meth:`commit`).
    """

    __slots__ = ("_keys", "_lock")

    def __init__(self) -> None:
        self._keys: dict[Identity, int] = {}
        self._lock = threading.Lock()

    def load(self, con: duckdb.DuckDBPyConnection) -> None:
        """(Re)read every key from the file."""
        rows = con.execute(f"SELECT {KEY_COLUMN}, {_IDENT_SQL} FROM {KEYS_TABLE}").fetchall()
        with self._lock:
            self._keys = {tuple(r[1:]): int(r[0]) for r in rows}

    def commit(self, added: dict[Identity, int]) -> None:
        """Record keys written by a transaction that has committed."""
        if added:
            with self._lock:
                self._keys.update(added)

    def key_rows(
        self, con: duckdb.DuckDBPyConnection, data: pa.Table
    ) -> tuple[pa.Table, dict[Identity, int]]:
        """``data`` (gpu_samples columns, identity included) as ``gpu_sample_rows`` columns: the
        identity replaced by ``gpu_key``. GPUs without a key get one, inserted into ``gpu_keys``
        on ``con`` (inside the caller's transaction); returns them for :meth:`commit`."""
        codes, identities = _identity_codes(data)
        with self._lock:
            known = [self._keys.get(i) for i in identities]
        added: dict[Identity, int] = {}
        if any(k is None for k in known):
            self.load(con)  # a Parquet import may have added keys since
            with self._lock:
                known = [self._keys.get(i) for i in identities]
                next_key = max(self._keys.values(), default=-1) + 1  # every key the file has
            for j, ident in enumerate(identities):
                if known[j] is None:
                    known[j] = added[ident] = next_key
                    next_key += 1
        if added:
            _phaselens_new_keys = pa.table(  # found by DuckDB by this local's name
                {
                    KEY_COLUMN: pa.array(list(added.values()), pa.int32()),
                    **{c: [ident[i] for ident in added] for i, c in enumerate(IDENTITY)},
                }
            )
            con.execute(
                f"INSERT INTO {KEYS_TABLE} BY NAME SELECT {KEY_COLUMN}, {_IDENT_SQL} FROM _phaselens_new_keys"
            ).fetchall()
        keys = np.asarray(known, dtype=np.int32)[codes]
        rows = data.drop_columns(list(IDENTITY))
        return rows.add_column(0, KEY_COLUMN, pa.array(keys)), added


def _identity_codes(data: pa.Table) -> tuple[np.ndarray, list[Identity]]:
    """Per row of ``data``, the index of its identity in the returned list of distinct identities.
    Works on the dictionary codes of the identity columns (the writer's are encoded already)."""
    composite = np.zeros(data.num_rows, dtype=np.int64)
    dictionaries: list[list[Any]] = []
    for name in IDENTITY:
        col = data.column(name).combine_chunks()
        if not pa.types.is_dictionary(col.type):
            col = pc.dictionary_encode(col)
        values = col.dictionary.to_pylist()
        null = len(values)  # a NULL (e.g. no index) gets the code after the dictionary's values
        idx = col.indices.fill_null(null).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        values.append(None)
        composite = composite * len(values) + idx
        dictionaries.append(values)
    codes, uniques = pd.factorize(composite, sort=False)
    identities: list[Identity] = []
    for u in uniques.tolist():
        parts: list[Any] = []
        for values in reversed(dictionaries):
            u, i = divmod(u, len(values))
            parts.append(values[i])
        identities.append(tuple(reversed(parts)))
    return codes, identities


def insert_select(con: duckdb.DuckDBPyConnection, columns: Sequence[str], select_sql: str) -> int:
    """Insert the rows of ``select_sql`` (gpu_samples ``columns``, identity included) into
    ``gpu_samples`` on ``con`` (inside the caller's transaction): new identities into ``gpu_keys``,
    then the keyed rows; return the rows inserted. The writer's key cache learns the new keys
    when it next meets one it does not know."""
    metrics = [c for c in columns if c not in IDENTITY]
    con.execute(f"CREATE OR REPLACE TEMP VIEW _phaselens_keyed_input AS {select_sql}")
    con.execute(
        f"""INSERT INTO {KEYS_TABLE} ({KEY_COLUMN}, {_IDENT_SQL})
            SELECT (SELECT coalesce(max({KEY_COLUMN}), -1) FROM {KEYS_TABLE})
                   + (row_number() OVER (ORDER BY {_IDENT_SQL}))::INTEGER, *
            FROM (SELECT DISTINCT {_IDENT_SQL} FROM _phaselens_keyed_input
                  EXCEPT SELECT {_IDENT_SQL} FROM {KEYS_TABLE})"""
    ).fetchall()
    inserted = con.execute(
        f"""INSERT INTO {ROWS_TABLE} ({KEY_COLUMN}, {", ".join(f'"{c}"' for c in metrics)})
            SELECT k.{KEY_COLUMN}, {", ".join(f'x."{c}"' for c in metrics)}
            FROM _phaselens_keyed_input x JOIN {KEYS_TABLE} k ON {_MATCH}"""
    ).fetchall()[0][0]
    con.execute("DROP VIEW _phaselens_keyed_input")
    return int(inserted)


def delete_sql(identity_condition: str, row_condition: str | None = None) -> str:
    """DELETE of the ``gpu_samples`` rows whose identity meets ``identity_condition`` (SQL over
    the identity columns) and ``row_condition`` (SQL over ``ts_s`` and the metrics), if given."""
    rows = f" AND ({row_condition})" if row_condition else ""
    return (
        f"DELETE FROM {ROWS_TABLE} WHERE {KEY_COLUMN} IN "
        f"(SELECT {KEY_COLUMN} FROM {KEYS_TABLE} WHERE {identity_condition}){rows}"
    )
