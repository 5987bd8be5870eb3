"""The iteration side of the grid buckets (analytics/bucket_queries.py) as named queries: per GPU
``g`` and cell ``j``, the prefill, decode, mixed and host seconds (``itagg``), and a GPU's owner
worker from its iterations (``ow``); from the raw iterations, or from the store's per-second
rollup (collector/store/iteration_seconds.py) with the raw rows at the ends of each GPU's sampled
time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from analytics.interval_rules import MAX_EDGE_FILTERS
from analytics.query import Cte, Query
from analytics.window import Window

#: An iteration of mixed prefill and decode work.
MIXED = "phase NOT IN ('prefill', 'decode')"


def clipped_iterations(D: str, where: str) -> Query:
    """The window's iterations (``it``) meeting ``where``, clipped to their GPU's sampled time
    (``span``); host part ``[a_s, h_s]``, then GPU-busy ``[h_s, b_s]``; ``j0``, ``j1``: the cells of
    the two ends."""
    return Query(f"""
    SELECT *, floor(a_s / {D})::BIGINT AS j0, floor(b_s / {D})::BIGINT AS j1 FROM (
        SELECT sp.g, it.worker, it.phase, it.pshare, greatest(it.start_s, sp.s0) AS a_s,
               least(it.end_s, sp.s1) AS b_s, it.end_s - it.busy_len_s AS h_s
        FROM it JOIN span sp ON it.node = sp.node AND it.uuid = sp.uuid
        WHERE it.end_s > sp.s0 AND it.start_s < sp.s1 AND {where})""")


def first_two_cells(D: str) -> Query:
    """``ag``: per GPU, cell ``j0`` and mixed or not, in one pass over ``itc``: the seconds of every
    iteration in its first cell (``pb1, db1, h1``) and, of those crossing one cell boundary, in the
    next (``pb2, db2, h2``; longer ones: ``itlong``)."""
    return Query(f"""
    SELECT g, j0, mix,
           sum(pshare * (len1 - host1)) AS pb1, sum((1.0 - pshare) * (len1 - host1)) AS db1, sum(host1) AS h1,
           sum(pshare * (len2 - host2)) AS pb2, sum((1.0 - pshare) * (len2 - host2)) AS db2, sum(host2) AS h2
    FROM (SELECT g, j0, pshare, {MIXED} AS mix,
                 CASE WHEN j1 = j0 THEN b_s - a_s
                      ELSE greatest(0.0, least(b_s, (j0 + 1) * {D}) - greatest(a_s, j0 * {D})) END AS len1,
                 CASE WHEN j1 = j0 THEN greatest(0.0, least(h_s, b_s) - a_s)
                      ELSE greatest(0.0, least(h_s, b_s, (j0 + 1) * {D}) - greatest(a_s, j0 * {D})) END AS host1,
                 CASE WHEN j1 = j0 + 1
                      THEN greatest(0.0, least(b_s, (j0 + 2) * {D}) - greatest(a_s, (j0 + 1) * {D})) ELSE 0.0 END AS len2,
                 CASE WHEN j1 = j0 + 1
                      THEN greatest(0.0, least(h_s, b_s, (j0 + 2) * {D}) - greatest(a_s, (j0 + 1) * {D})) ELSE 0.0
                 END AS host2
          FROM itc)
    GROUP BY g, j0, mix""")


def long_iteration_pieces(D: str) -> Query:
    """``itlong``: the later pieces (cell ``j``, ``len_s``, ``host_s``) of iterations crossing two
    or more cell boundaries."""
    long_only = clipped_iterations(D, f"floor(it.start_s / {D}) + 1 < floor(it.end_s / {D})").sql
    return Query(f"""
    SELECT g, j, {MIXED} AS mix, pshare,
           greatest(0.0, least(b_s, (j + 1) * {D}) - greatest(a_s, j * {D})) AS len_s,
           greatest(0.0, least(h_s, b_s, (j + 1) * {D}) - greatest(a_s, j * {D})) AS host_s
    FROM (SELECT *, unnest(range(j0 + 1, j1 + 1)) AS j
          FROM ({long_only}) WHERE j1 >= j0 + 2)""")


def raw_cell_states(*, long_iterations: bool) -> Query:
    """``itagg`` from the raw iterations: per GPU and cell, prefill, decode, mixed (prefill and
    decode work) and host seconds, from ``ag`` (and ``itlong`` with ``long_iterations``)."""
    long_pieces = (
        "\n          UNION ALL\n          SELECT g, j, mix, pshare * (len_s - host_s), (1.0 - pshare) * (len_s - host_s),"
        " host_s FROM itlong"
        if long_iterations
        else ""
    )
    return Query(f"""
    SELECT g, j,
           coalesce(sum(pb) FILTER (WHERE NOT mix), 0.0) AS p_s, coalesce(sum(db) FILTER (WHERE NOT mix), 0.0) AS d_s,
           coalesce(sum(pb) FILTER (WHERE mix), 0.0) AS mp_s, coalesce(sum(db) FILTER (WHERE mix), 0.0) AS md_s,
           sum(h) AS h_s
    FROM (SELECT g, j0 AS j, mix, pb1 AS pb, db1 AS db, h1 AS h FROM ag
          UNION ALL
          SELECT g, j0 + 1, mix, pb2, db2, h2 FROM ag WHERE pb2 <> 0.0 OR db2 <> 0.0 OR h2 <> 0.0{long_pieces})
    GROUP BY g, j""")


def raw_owners() -> Query:
    """``ow`` from the raw iterations: the least worker of each GPU in ``nodw`` (no devices worker)."""
    return Query("SELECT g, min(worker) AS worker FROM itc WHERE g IN (SELECT g FROM nodw) GROUP BY g")


def raw_iteration_side(D: str, *, long_iterations: bool) -> tuple[list[Cte], Cte]:
    """``itagg`` (with what it reads) and ``ow`` from the raw iterations; ``long_iterations=False``
    leaves out the pieces of iterations crossing two or more cell boundaries."""
    return (
        [
            Cte("itc", clipped_iterations(D, "TRUE"), inline=True),
            Cte("ag", first_two_cells(D)),
            Cte("itlong", long_iteration_pieces(D)),
            Cte("itagg", raw_cell_states(long_iterations=long_iterations)),
        ],
        Cte("ow", raw_owners()),
    )


def edge_part_seconds() -> Query:
    """``edges``: each GPU's part-seconds ``[lo, hi)`` at the ends of its sampled time (``span``),
    in second ``j``."""
    return Query("""
    SELECT g, node, uuid, j, greatest(s0, j) AS lo, least(s1, j + 1) AS hi
    FROM (SELECT *, unnest(list_distinct([floor(s0)::BIGINT, floor(s1)::BIGINT])) AS j FROM span)
    WHERE NOT (j >= s0 AND j + 1 <= s1) AND least(s1, j + 1) > greatest(s0, j)""")


def edge_iterations(D: str, edge_seconds: Sequence[int] | None) -> Query:
    """``ite``: the raw iterations' pieces in those part-seconds (``edges``), with cell ``j``;
    ``edge_seconds`` (at most ``MAX_EDGE_FILTERS``) become constant filters on the raw rows."""
    if edge_seconds is not None and len(edge_seconds) <= MAX_EDGE_FILTERS:
        near = " OR ".join(
            f"(it.start_s < {float(j + 1)!r} AND it.end_s > {float(j)!r})" for j in sorted(edge_seconds)
        )
        edge_filter = f"({near})" if near else "FALSE"
    else:
        edge_filter = "TRUE"
    return Query(f"""
    SELECT e.g, floor(e.j / {D})::BIGINT AS j, it.worker, {MIXED} AS mix, it.pshare,
           least(it.end_s, e.hi) - greatest(it.start_s, e.lo) AS len_s,
           greatest(0.0, least(it.end_s - it.busy_len_s, it.end_s, e.hi) - greatest(it.start_s, e.lo)) AS host_s
    FROM it JOIN edges e ON it.node = e.node AND it.uuid = e.uuid AND it.end_s > e.lo AND it.start_s < e.hi
    WHERE {edge_filter}""")


def rolled_seconds(window: Window, D: str) -> Query:
    """``itr``: the whole seconds of each GPU's sampled time from the store's rollup, with cell ``j``."""
    pred, par = window.node_sql("r.node")
    return Query(
        f"""
    SELECT sp.g, floor(r.sec / {D})::BIGINT AS j, r.worker, r.prefill_s, r.decode_s, r.mixed_prefill_s,
           r.mixed_decode_s, r.host_s
    FROM iteration_seconds r JOIN span sp ON r.node = sp.node AND r.uuid = sp.uuid
    WHERE {pred} AND r.sec >= ? AND r.sec < ? AND r.sec >= sp.s0 AND r.sec + 1 <= sp.s1""",
        (*par, math.floor(window.start_s), window.end_s),
    )


def rolled_cell_states() -> Query:
    """``itagg`` from the rollup (``itr``) and the edge pieces (``ite``): per GPU and cell, prefill,
    decode, mixed (prefill and decode work) and host seconds."""
    return Query("""
    SELECT g, j, sum(p) AS p_s, sum(d) AS d_s, sum(mp) AS mp_s, sum(md) AS md_s, sum(h) AS h_s
    FROM (SELECT g, j, prefill_s AS p, decode_s AS d, mixed_prefill_s AS mp, mixed_decode_s AS md, host_s AS h
          FROM itr
          UNION ALL
          SELECT g, j, CASE WHEN mix THEN 0.0 ELSE pshare * (len_s - host_s) END,
                 CASE WHEN mix THEN 0.0 ELSE (1.0 - pshare) * (len_s - host_s) END,
                 CASE WHEN mix THEN pshare * (len_s - host_s) ELSE 0.0 END,
                 CASE WHEN mix THEN (1.0 - pshare) * (len_s - host_s) ELSE 0.0 END, host_s
          FROM ite)
    GROUP BY g, j""")


def rolled_owners() -> Query:
    """``ow`` from the rollup and the edge pieces: the least worker whose iterations ran on the GPU
    in its sampled time, for each GPU in ``nodw``."""
    return Query("""
    SELECT g, min(worker) AS worker
    FROM (SELECT g, worker FROM itr WHERE prefill_s + decode_s + mixed_prefill_s + mixed_decode_s + host_s > 0
          UNION ALL
          SELECT g, worker FROM ite)
    WHERE g IN (SELECT g FROM nodw) GROUP BY g""")


def rolled_iteration_side(
    window: Window,
    D: str,
    edge_seconds: Sequence[int] | None,
) -> tuple[list[Cte], Cte]:
    """:func:`raw_iteration_side`'s ``itagg`` and ``ow`` from the store's ``iteration_seconds`` for
    each GPU's whole seconds (``[sec, sec + 1)`` inside its sampled time ``[s0, s1]``) and from the
    raw iterations for the rest: the part-seconds ``edges`` at the two ends."""
    return (
        [
            Cte("edges", edge_part_seconds()),
            Cte("ite", edge_iterations(D, edge_seconds)),
            Cte("itr", rolled_seconds(window, D)),
            Cte("itagg", rolled_cell_states()),
        ],
        Cte("ow", rolled_owners()),
    )
