"""The window's iterations counted per worker, GPU and hour in one grouped scan.

Three parts of the summary each used to scan every iteration of the window for a few counts: the
attribution's bad-row counts (:func:`analytics.attribution.phase_breakdown`: per GPU uuid, the
iterations overlapping the window), the GPUs each worker ran on per hour (:func:`analytics.cost.token_counts`:
the iterations starting in the window) and the lagged iterations of the latency part
(:func:`analytics.latency.latency_summary`: those starting in the window). :func:`iteration_groups`
scans once, grouped by ``node, worker, gpu_uuid, hour_start_s`` and two flags telling which of the
two selections a row is in; each part sums the few thousand groups it needs. Counts, minima and
maxima: the same numbers as the separate scans. Where the store's per-second rollup of the
iterations (collector/store/iteration_seconds.py) covers the window's nodes, the window's whole
seconds are counted from it and only the rest from the raw rows (``_ROLLED_SQL``): the same numbers.
"""

from __future__ import annotations

import math
import uuid as uuidlib
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import pyarrow as pa

from analytics.window import Window
from collector.store.iteration_seconds import covers

__all__ = ["iteration_groups", "registered_groups"]

_SQL = """
SELECT node, worker, gpu_uuid, floor(start_s / 3600) * 3600 AS hour_start_s,
       coalesce(start_s >= ?, FALSE) AS starts_in, coalesce(end_s > ?, FALSE) AS overlaps_window,
       count(*) AS n, count(*) FILTER (WHERE lag_s > 0) AS lagged,
       count(*) FILTER (WHERE end_s < start_s) AS negative,
       min(end_s) AS min_end_s, max(start_s) AS max_start_s
FROM iterations
WHERE {node} AND start_s < ? AND (end_s > ? OR start_s >= ?)
GROUP BY ALL
"""


# From the store's per-second rollup (collector/store/iteration_seconds.py): the iterations starting in
# the window's whole seconds [lo, hi) (all of them after its start, so starts_in and, with no
# negative one among them, overlaps_window); the raw rows for the rest — iterations starting before
# lo (those before the window that overlap it) or from hi on, and the seconds holding a negative one.
_ROLLED_SQL = """
SELECT node, worker, gpu_uuid, hour_start_s, starts_in, overlaps_window,
       sum(n)::BIGINT AS n, sum(lagged)::BIGINT AS lagged, sum(negative)::BIGINT AS negative,
       min(min_end_s) AS min_end_s, max(max_start_s) AS max_start_s
FROM (
    SELECT node, worker, uuid AS gpu_uuid, floor(sec / 3600) * 3600 AS hour_start_s,
           TRUE AS starts_in, TRUE AS overlaps_window, starts AS n, lagged, negative, min_end_s, max_start_s
    FROM iteration_seconds
    WHERE {node} AND starts > 0 AND sec >= ? AND sec < ? AND NOT ({neg_sec})
    UNION ALL
    SELECT node, worker, gpu_uuid, floor(start_s / 3600) * 3600,
           coalesce(start_s >= ?, FALSE), coalesce(end_s > ?, FALSE),
           1, coalesce(lag_s > 0, FALSE)::INTEGER, (end_s < start_s)::INTEGER, end_s, start_s
    FROM iterations
    WHERE {node} AND start_s < ? AND (end_s > ? OR start_s >= ?)
      AND (start_s < ? OR start_s >= ? OR {neg_start})
)
GROUP BY ALL
"""

#: More seconds than this holding a negative iteration: the groups are counted from the raw rows.
MAX_NEGATIVE_SECONDS = 64


def iteration_groups(con: duckdb.DuckDBPyConnection, window: Window) -> pa.Table:
    """The window's iterations per ``node, worker, gpu_uuid, hour_start_s`` (the hour of their
    start), ``starts_in`` (start_s >= the window's start: with the common condition, the iterations
    starting in the window) and ``overlaps_window`` (end_s > the window's start: those overlapping it), all
    of them starting before the window's end: ``n`` rows, ``lagged`` (lag_s > 0), ``negative``
    (ending before they start), ``min_end_s``, ``max_start_s``. An Arrow table (its column types
    stay those of the store when registered again)."""
    pred, params = window.node_sql("node")
    s, e = window.start_s, window.end_s
    _finish_pending(con)  # the relation API refuses to run beside a half-fetched result
    lo, hi = math.floor(s) + 1, math.floor(e)
    if lo < hi and covers(con, pred, params):
        neg = [
            int(r[0])
            for r in con.execute(
                f"SELECT DISTINCT sec FROM iteration_seconds WHERE {pred} AND negative > 0 AND sec >= ? AND sec < ?",
                [*params, lo, hi],
            ).fetchall()
        ]
        if len(neg) <= MAX_NEGATIVE_SECONDS:
            listed = ", ".join(map(str, neg))
            sql = _ROLLED_SQL.format(
                node=pred,
                neg_sec=f"sec IN ({listed})" if neg else "FALSE",
                neg_start=f"floor(start_s)::BIGINT IN ({listed})" if neg else "FALSE",
            )
            return con.sql(sql, params=[*params, lo, hi, s, s, *params, e, s, s, lo, hi]).to_arrow_table()
    return con.sql(_SQL.format(node=pred), params=[s, s, *params, e, s, s]).to_arrow_table()


@contextmanager
def registered_groups(
    con: duckdb.DuckDBPyConnection, window: Window, groups: pa.Table | None = None
) -> Iterator[str]:
    """``groups`` (else :func:`iteration_groups` of ``window``, computed here) registered on ``con``
    under a fresh name (yielded) for a part's SQL; unregistered on exit."""
    table = groups if groups is not None else iteration_groups(con, window)
    name = f"pl_iteration_groups_{uuidlib.uuid4().hex[:12]}"
    _finish_pending(con)
    con.register(name, table)
    try:
        yield name
    finally:
        _finish_pending(con)
        con.unregister(name)


def _finish_pending(con: duckdb.DuckDBPyConnection) -> None:
    """Close a result left half-fetched on ``con`` (a caller's ``fetchone``): DuckDB refuses to
    register or unregister a relation while one is open. A new statement, fetched whole, replaces it."""
    con.execute("SELECT 1").fetchall()
