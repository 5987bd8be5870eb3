"""The window's iterations counted per worker, GPU and hour in one grouped scan.

Three parts of the summary each used to scan every iteration of the window for a few counts: the
attribution's bad-row counts (:func:`analytics.attribution.phase_breakdown`: per GPU uuid, the
iterations overlapping the window), the GPUs each worker ran on per hour (:func:`analytics.cost.token_counts`:
the iterations starting in the window) and the lagged iterations of the latency part
(:func:`analytics.latency.latency_summary`: those starting in the window). :func:`iteration_groups`
scans once, grouped by ``node, worker, gpu_uuid, hour_start_s`` and two flags telling which of the
two selections a row is in; each part sums the few thousand groups it needs. Counts, minima and
maxima: the same numbers as the separate scans.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import pyarrow as pa

from analytics.window import Window

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
