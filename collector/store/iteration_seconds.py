"""``iteration_seconds``: the iterations rolled up per worker, GPU and whole second, kept by the store.

Phase attribution cuts every iteration at the cells of its grid (whole seconds, or multiples of
them) and sums the pieces per GPU and cell; on a fleet's worth of iterations that pass over the raw
rows is most of the summary's time. So the store keeps, with every write of iterations, their pieces
already summed per ``(node, worker, uuid, sec)`` — the seconds ``[sec, sec + 1)`` — and analytics
reads a GPU's whole seconds from here and only the (at most two) part-seconds at the ends of its
sampled time from the raw rows (:func:`analytics.intervals.buckets_sql`).

Columns per second: ``prefill_s``, ``decode_s`` (GPU-busy seconds of prefill and decode
iterations), ``mixed_prefill_s``, ``mixed_decode_s`` (a mixed iteration's busy seconds split by its
prefill share), ``host_s`` (an iteration's host part, before its GPU-busy part) — by the rules
:func:`analytics.intervals.iteration_rows_sql` shares with :func:`rollup_sql` (:func:`busy_len_sql`,
``PSHARE_SQL``) — and, of the
iterations *starting* in the second: ``starts``, ``lagged`` (lag_s > 0), ``negative`` (ending
before they start), ``unrolled`` (longer than ``MAX_ROLLED_S``, or a time not finite or beyond
±1e15 s, then counted in second 0: no pieces here, analytics reads the raw rows), ``min_end_s``,
``max_start_s``. Only iterations with a GPU (``gpu_uuid``) and a positive
length have pieces; every iteration counts in ``starts`` (``uuid`` NULL where it has no GPU).

Rows are partial sums: a write adds rows for its own iterations, so one second may have several
rows (sum them). The table is kept by :meth:`collector.store.Store` writes, the Parquet import and
scenario deletion; iterations written or deleted around the store (plain SQL) leave it behind,
which readers detect by :func:`covers` (the ``starts`` total against the rows) and then read the
raw rows. :func:`rebuild` recomputes it from ``iterations``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import duckdb

TABLE = "iteration_seconds"

#: Iterations longer than this get no per-second pieces (a bad row must not explode the table);
#: they are counted as ``unrolled`` and a reader of their node reads the raw rows instead.
MAX_ROLLED_S = 3600.0

#: Times the rollup cuts into seconds: finite and within BIGINT seconds with room to spare. An
#: iteration with a time outside (a bad row the store still keeps) is counted ``unrolled`` in second 0.
_IN_RANGE = "(isfinite(start_s) AND isfinite(end_s) AND abs(start_s) < 1e15 AND abs(end_s) < 1e15)"
_START_SEC = f"CASE WHEN {_IN_RANGE} THEN floor(start_s)::BIGINT ELSE 0 END"

#: The iterations columns the rollup reads; a source relation lacking one reads it as NULL.
SOURCE_COLUMNS = (
    "node",
    "source",
    "worker",
    "gpu_uuid",
    "start_s",
    "end_s",
    "phase",
    "lag_s",
    "compute_s",
    "modeled_s",
    "prefill_tokens",
    "decode_seqs",
)

DDL = f"""
CREATE TABLE {TABLE} (
    node            VARCHAR NOT NULL,
    worker          VARCHAR NOT NULL,
    uuid            VARCHAR,
    sec             BIGINT  NOT NULL,
    prefill_s       DOUBLE  NOT NULL,
    decode_s        DOUBLE  NOT NULL,
    mixed_prefill_s DOUBLE  NOT NULL,
    mixed_decode_s  DOUBLE  NOT NULL,
    host_s          DOUBLE  NOT NULL,
    starts          BIGINT  NOT NULL,
    lagged          BIGINT  NOT NULL,
    negative        BIGINT  NOT NULL,
    unrolled        BIGINT  NOT NULL,
    min_end_s       DOUBLE,
    max_start_s     DOUBLE
);
"""

_TYPES = {
    "prefill_tokens": "INTEGER",
    "decode_seqs": "INTEGER",
    "lag_s": "DOUBLE",
    "compute_s": "DOUBLE",
    "modeled_s": "DOUBLE",
    "gpu_uuid": "VARCHAR",
}


def busy_len_sql(simulated: str) -> str:
    """SQL of an iteration row's GPU-busy seconds (at its end; the rest of it, first, is host time):
    a simulated row's ``compute_s`` (``simulated``: the SQL condition that the row is simulated; the
    simulator's ``modeled_s − compute_s`` is engine time with the GPU idle), else the emulated
    device's ``modeled_s`` (a step's wall time beyond it is host time), else the whole step (a
    measured engine's host time inside a step is not visible); within [0, the step]. The one
    definition the rollup and the raw reads (:func:`analytics.intervals.iteration_rows_sql`) share."""
    return f"""least(end_s - start_s, greatest(0.0,
               CASE WHEN compute_s IS NOT NULL AND {simulated} THEN compute_s
                    WHEN modeled_s IS NOT NULL THEN modeled_s
                    ELSE end_s - start_s END))"""


#: SQL of an iteration row's prefill share of its work: 1 for prefill, 0 for decode, a mixed one's
#: prefill tokens over prefill tokens plus decode sequences (0.5 when it has neither).
PSHARE_SQL = """CASE phase WHEN 'prefill' THEN 1.0 WHEN 'decode' THEN 0.0
                ELSE coalesce(prefill_tokens::DOUBLE
                              / nullif(coalesce(prefill_tokens, 0) + coalesce(decode_seqs, 0), 0), 0.5)
           END"""


def rollup_sql(src: str, columns: Collection[str] | None = None) -> str:
    """SELECT of the rollup rows of the iterations in relation ``src`` (a table name or a
    parenthesised query); ``columns``: those ``src`` has (None: all of ``SOURCE_COLUMNS``), the
    others read as NULL. GPU-busy seconds as :func:`analytics.intervals.iteration_rows_sql` takes
    them: a simulated row's ``compute_s``, else ``modeled_s``, else the whole iteration, the host
    part first."""
    have = set(SOURCE_COLUMNS if columns is None else columns)
    missing = [c for c in ("node", "worker", "start_s", "end_s", "phase") if c not in have]
    if missing:
        raise ValueError(f"an iterations relation needs column(s) {', '.join(missing)}")
    cols = ", ".join(
        f'"{c}"' if c in have else f'NULL::{_TYPES.get(c, "VARCHAR")} AS "{c}"' for c in SOURCE_COLUMNS
    )
    sim = "trust_label(node, source) = 'simulated'"  # the store's one definition (migration 9)
    return f"""
WITH src AS (
    SELECT node, worker, gpu_uuid AS uuid, start_s, end_s, phase, lag_s,
           {busy_len_sql(sim)} AS busy_len_s, {PSHARE_SQL} AS pshare
    FROM (SELECT {cols} FROM {src})
),
pieces AS (  -- each iteration with a GPU cut at whole seconds: its host part, then its GPU-busy part
    SELECT node, worker, uuid, sec, phase, pshare,
           least(end_s, sec + 1) - greatest(start_s, sec) AS len_s,
           greatest(0.0, least(end_s - busy_len_s, end_s, sec + 1) - greatest(start_s, sec)) AS host_s
    FROM (SELECT *, unnest(range(floor(start_s)::BIGINT, ceil(end_s)::BIGINT)) AS sec
          FROM src WHERE uuid IS NOT NULL AND end_s > start_s AND end_s - start_s <= {MAX_ROLLED_S!r} AND {_IN_RANGE})
),
parts AS (
    SELECT node, worker, uuid, sec,
           sum(CASE WHEN phase = 'prefill' THEN len_s - host_s ELSE 0.0 END) AS prefill_s,
           sum(CASE WHEN phase = 'decode' THEN len_s - host_s ELSE 0.0 END) AS decode_s,
           sum(CASE WHEN phase NOT IN ('prefill', 'decode') THEN pshare * (len_s - host_s) ELSE 0.0 END)
               AS mixed_prefill_s,
           sum(CASE WHEN phase NOT IN ('prefill', 'decode') THEN (1.0 - pshare) * (len_s - host_s) ELSE 0.0 END)
               AS mixed_decode_s,
           sum(host_s) AS host_s,
           0::BIGINT AS starts, 0::BIGINT AS lagged, 0::BIGINT AS negative, 0::BIGINT AS unrolled,
           NULL::DOUBLE AS min_end_s, NULL::DOUBLE AS max_start_s
    FROM pieces GROUP BY node, worker, uuid, sec
    UNION ALL
    SELECT node, worker, uuid, {_START_SEC}, 0.0, 0.0, 0.0, 0.0, 0.0,
           count(*), count(*) FILTER (WHERE lag_s > 0), count(*) FILTER (WHERE end_s < start_s),
           count(*) FILTER (WHERE uuid IS NOT NULL AND (end_s - start_s > {MAX_ROLLED_S!r} OR NOT {_IN_RANGE})),
           min(end_s), max(start_s)
    FROM src GROUP BY node, worker, uuid, {_START_SEC}
)
SELECT node, worker, uuid, sec, sum(prefill_s) AS prefill_s, sum(decode_s) AS decode_s,
       sum(mixed_prefill_s) AS mixed_prefill_s, sum(mixed_decode_s) AS mixed_decode_s, sum(host_s) AS host_s,
       sum(starts)::BIGINT AS starts, sum(lagged)::BIGINT AS lagged, sum(negative)::BIGINT AS negative,
       sum(unrolled)::BIGINT AS unrolled, min(min_end_s) AS min_end_s, max(max_start_s) AS max_start_s
FROM parts GROUP BY node, worker, uuid, sec"""


def add(con: duckdb.DuckDBPyConnection, src: str, columns: Collection[str] | None = None) -> None:
    """Add the rollup rows of the iterations in ``src`` (just written to ``iterations``, in the
    same transaction) to the table."""
    con.execute(_insert_sql(src, columns))


def add_arrow(con: duckdb.DuckDBPyConnection, data: Any) -> None:
    """:func:`add` for an Arrow table of iterations rows (the writer's flush)."""
    _phaselens_iterations = data  # DuckDB finds the table by this local's name (a replacement scan)
    con.execute(_insert_sql("_phaselens_iterations", data.column_names))


def _insert_sql(src: str, columns: Collection[str] | None) -> str:
    return f"INSERT INTO {TABLE} BY NAME {rollup_sql(src, columns)} ORDER BY sec"


def rebuild_sql() -> str:
    """The INSERT of the rollup of every row of ``iterations`` (into an empty table)."""
    return _insert_sql("iterations", None)


def rebuild(con: duckdb.DuckDBPyConnection) -> None:
    """Recompute the table from every row of ``iterations`` (after writes around the store)."""
    con.execute(f"DELETE FROM {TABLE}")
    con.execute(rebuild_sql())


def covers(con: duckdb.DuckDBPyConnection, node_pred: str, params: list[Any]) -> bool:
    """Whether the table holds every iteration of the nodes ``node_pred`` selects (its ``starts``
    total equals their rows) and none too long to roll up: else a reader takes the raw rows."""
    row = con.execute(
        f"""SELECT (SELECT count(*) FROM iterations WHERE {node_pred}),
                   coalesce(sum(starts), 0), coalesce(sum(unrolled), 0)
            FROM {TABLE} WHERE {node_pred}""",
        [*params, *params],
    ).fetchone()
    return row is not None and int(row[0]) == int(row[1]) and int(row[2]) == 0
