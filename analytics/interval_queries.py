"""The sample intervals of a window as named queries (``bucket_s=0`` of analytics/intervals.py):
one row per ``(previous ts_s, ts_s]`` of two consecutive samples of a GPU, the state seconds read
from cumulative state-time functions at both ends by ``ASOF`` joins. :func:`interval_ctes` lists
them in order; :func:`intervals_sql` is the statement. Formulas: docs/analytics/attribution.md.
"""

from __future__ import annotations

from typing import Any

from analytics.interval_rules import gap_threshold_sql, iteration_rows_sql, power_sums_sql
from analytics.query import Cte, Query, with_ctes
from analytics.window import Window

# 0 for an interval across a sample gap (all of it unsampled), else 1
_SAMPLED = "(CASE WHEN o.ts_s - o.t0_s > o.gap_threshold_s THEN 0.0 ELSE 1.0 END)"
_ENERGY = """CASE WHEN o.parent_uuid IS NOT NULL THEN NULL
            WHEN o.energy_mj IS NOT NULL AND o.e0_mj IS NOT NULL AND o.energy_mj >= o.e0_mj
                THEN (o.energy_mj - o.e0_mj) / 1000.0
            WHEN o.power_w IS NOT NULL
                THEN (o.power_w + coalesce(o.p0_w, o.power_w)) / 2.0 * (o.ts_s - o.t0_s) END"""


def window_samples(window: Window) -> Query:
    """``samp``: the window's samples with the device attributes (owner worker/role) in effect then;
    CPU devices left out."""
    pred, par = window.node_sql("s.node")
    return Query(
        f"""
    SELECT s.node, s.source, s.device, s."index", s.ts_s, s.emulated,
           s.sm_active_pct, s.gpu_util_pct, s.dram_active_pct, s.power_w, s.energy_mj, s.host_bound_pct,
           s.power_limit_w,
           d.uuid, d.parent_uuid, d.mig_instance_id, d.name, d.worker, d.role
    FROM gpu_samples s ASOF LEFT JOIN devices d
      ON s.node = d.node AND s.source = d.source AND s.device = d.device
     AND s."index" IS NOT DISTINCT FROM d."index" AND s.ts_s >= d.since_s
    WHERE {pred} AND s.ts_s >= ? AND s.ts_s < ? AND d.kind IS DISTINCT FROM 'cpu'  -- a CPU is no GPU""",
        (*par, window.start_s, window.end_s),
    )


def window_iterations(window: Window) -> Query:
    """``it``: the window's iterations with their GPU-busy seconds and ``prev_end_s``, the latest end
    of the GPU's earlier iterations."""
    pred, par = window.node_sql("node")
    return Query(
        f"""
    SELECT *, max(end_s) OVER (PARTITION BY node, uuid ORDER BY start_s, end_s
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end_s
    FROM ({iteration_rows_sql(pred, window.simulated)})""",
        (*par, window.start_s, window.end_s),
    )


def iteration_segments() -> Query:
    """``seg``: iterations (``it``) clipped so that they do not overlap: ``[a_s, end_s]``, host part
    (``hl_s``) first, then GPU-busy (``bl_s``)."""
    return Query("""
    SELECT *, greatest(0.0, h_end_s - a_s) AS hl_s, greatest(0.0, end_s - greatest(a_s, h_end_s)) AS bl_s
    FROM (SELECT *, greatest(start_s, coalesce(prev_end_s, start_s)) AS a_s,
                 end_s - busy_len_s AS h_end_s
          FROM it)
    WHERE a_s < end_s""")


def cumulative_states() -> Query:
    """``segc``: per segment (``seg``), the cumulative state seconds of its GPU uuid before it
    (``c_host, c_p, c_d, c_mp, c_md``) and the shares of its busy part (``f_p, f_d, f_mp, f_md``)."""
    return Query("""
    SELECT node, uuid, a_s, hl_s, bl_s,
           CASE phase WHEN 'prefill' THEN 1.0 ELSE 0.0 END AS f_p,
           CASE phase WHEN 'decode' THEN 1.0 ELSE 0.0 END AS f_d,
           CASE WHEN phase NOT IN ('prefill', 'decode') THEN pshare ELSE 0.0 END AS f_mp,
           CASE WHEN phase NOT IN ('prefill', 'decode') THEN 1.0 - pshare ELSE 0.0 END AS f_md,
           coalesce(sum(hl_s) OVER c, 0.0) AS c_host,
           coalesce(sum(CASE phase WHEN 'prefill' THEN bl_s ELSE 0.0 END) OVER c, 0.0) AS c_p,
           coalesce(sum(CASE phase WHEN 'decode' THEN bl_s ELSE 0.0 END) OVER c, 0.0) AS c_d,
           coalesce(sum(CASE WHEN phase NOT IN ('prefill', 'decode') THEN pshare * bl_s ELSE 0.0 END)
                    OVER c, 0.0) AS c_mp,
           coalesce(sum(CASE WHEN phase NOT IN ('prefill', 'decode') THEN (1.0 - pshare) * bl_s ELSE 0.0 END)
                    OVER c, 0.0) AS c_md
    FROM seg
    WINDOW c AS (PARTITION BY node, uuid ORDER BY a_s ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)""")


def islands(relation: str) -> Query:
    """``isl``: the islands of "some request in flight" per worker (the registered ``relation``)."""
    return Query(f"SELECT * FROM {relation}")


def cumulative_in_flight() -> Query:
    """``islc``: each island (``isl``) with its length and the in-flight seconds of its worker
    before it (``c_in``)."""
    return Query("""
    SELECT node, worker, a_s, b_s - a_s AS len_s,
           coalesce(sum(b_s - a_s) OVER (PARTITION BY node, worker ORDER BY a_s
                                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0.0) AS c_in
    FROM isl""")


def owner_workers(window: Window) -> Query:
    """``owner_worker``: for a GPU without a devices worker, the (least) worker whose iterations
    carry its uuid."""
    pred, par = window.node_sql("node")
    return Query(
        f"""
    SELECT node, gpu_uuid AS uuid, min(worker) AS worker
    FROM iterations WHERE {pred} AND gpu_uuid IS NOT NULL AND end_s > ? AND start_s < ?
    GROUP BY ALL""",
        (*par, window.start_s, window.end_s),
    )


def ordered_samples() -> Query:
    """``ordered``: each sample (``samp``) with its worker, the previous sample's time, counter,
    power, uuid and worker, and its GPU's gap threshold (:func:`gap_threshold_sql`)."""
    threshold = gap_threshold_sql("min(s.ts_s) OVER a", "max(s.ts_s) OVER a", "count(*) OVER a")
    return Query(f"""
    SELECT s.* EXCLUDE (worker), coalesce(s.worker, ow.worker) AS worker,
           lag(s.ts_s) OVER g AS t0_s, lag(s.energy_mj) OVER g AS e0_mj, lag(s.power_w) OVER g AS p0_w,
           lag(s.uuid) OVER g AS uuid0, lag(coalesce(s.worker, ow.worker)) OVER g AS worker0,
           {threshold} AS gap_threshold_s
    FROM samp s LEFT JOIN owner_worker ow ON s.node = ow.node AND s.uuid = ow.uuid
    WINDOW g AS (PARTITION BY s.node, s.source, s.device, s."index" ORDER BY s.ts_s),
           a AS (PARTITION BY s.node, s.source, s.device, s."index")""")


def read_points() -> Query:
    """``pts``: where the cumulative functions are read: each sample's ts_s (``extra`` 0), and the
    interval's start again (``extra`` 1) under the new uuid/worker where the owner changed between
    the two samples."""
    return Query("""
    SELECT node, source, device, "index", ts_s AS t_s, 0 AS extra, uuid, worker FROM ordered
    UNION ALL
    SELECT node, source, device, "index", t0_s, 1, uuid, worker FROM ordered
    WHERE t0_s IS NOT NULL AND (uuid IS DISTINCT FROM uuid0 OR worker IS DISTINCT FROM worker0)""")


def points_in_segments() -> Query:
    """``ptc``: each read point (``pts``) with the segment (``segc``) it falls in or after: the
    host seconds up to it, the part of the segment's busy time before it, the cumulative states."""
    return Query("""
    SELECT p.*,
           c.c_host + least(greatest(p.t_s - c.a_s, 0.0), c.hl_s) AS host_c,
           least(greatest(p.t_s - c.a_s - c.hl_s, 0.0), c.bl_s) AS busy_part,
           c.c_p, c.c_d, c.c_mp, c.c_md, c.f_p, c.f_d, c.f_mp, c.f_md
    FROM pts p ASOF LEFT JOIN segc c ON p.node = c.node AND p.uuid = c.uuid AND p.t_s >= c.a_s""")


def point_values() -> Query:
    """``ptv``: the cumulative state functions at each read point: host, prefill, decode, mixed
    prefill and decode, and in-flight seconds (``*_c``)."""
    return Query("""
    SELECT p.node, p.source, p.device, p."index", p.t_s, p.extra,
           coalesce(p.host_c, 0.0) AS host_c,
           coalesce(p.c_p + p.f_p * p.busy_part, 0.0) AS p_c,
           coalesce(p.c_d + p.f_d * p.busy_part, 0.0) AS d_c,
           coalesce(p.c_mp + p.f_mp * p.busy_part, 0.0) AS mp_c,
           coalesce(p.c_md + p.f_md * p.busy_part, 0.0) AS md_c,
           coalesce(i.c_in + least(greatest(p.t_s - i.a_s, 0.0), i.len_s), 0.0) AS in_c
    FROM ptc p ASOF LEFT JOIN islc i ON p.node = i.node AND p.worker = i.worker AND p.t_s >= i.a_s""")


def point_deltas() -> Query:
    """``deltas``: each read point's values with those of the point before it (``*_0``)."""
    return Query("""
    SELECT *, lag(host_c) OVER g AS host_0, lag(p_c) OVER g AS p_0, lag(d_c) OVER g AS d_0,
           lag(mp_c) OVER g AS mp_0, lag(md_c) OVER g AS md_0, lag(in_c) OVER g AS in_0
    FROM ptv
    WINDOW g AS (PARTITION BY node, source, device, "index" ORDER BY t_s, extra DESC)""")


def attributed_gpus() -> Query:
    """``attributed``: the GPUs whose state is known: an owner worker, or iterations carrying their
    uuid."""
    return Query("""
    SELECT DISTINCT node, source, device, "index" FROM ordered WHERE worker IS NOT NULL""")


def intervals_select() -> Query:
    """The statement's result: one row per sample interval, with the columns
    :func:`analytics.attribution.gpu_intervals` documents. An interval longer than its GPU's gap
    threshold is unsampled as a whole: ``unsampled_s`` = its length, its other states 0,
    ``energy_unsampled_j`` = its energy, ``sample_gaps`` = 1."""
    sampled, energy = _SAMPLED, _ENERGY
    return Query(f"""
SELECT o.node, o.source, o.device, o."index", o.uuid, o.parent_uuid, o.mig_instance_id, o.name,
       o.worker, o.role, o.t0_s, o.ts_s AS t1_s, o.ts_s - o.t0_s AS interval_s,
       floor(o.ts_s / 3600.0) * 3600.0 AS hour_s,
       a.node IS NOT NULL AS attributed,
       CASE WHEN a.node IS NOT NULL THEN (d.p_c - d.p_0) * {sampled} END AS prefill_s,
       CASE WHEN a.node IS NOT NULL THEN (d.d_c - d.d_0) * {sampled} END AS decode_s,
       CASE WHEN a.node IS NOT NULL THEN (d.mp_c - d.mp_0) * {sampled} END AS mixed_prefill_s,
       CASE WHEN a.node IS NOT NULL THEN (d.md_c - d.md_0) * {sampled} END AS mixed_decode_s,
       CASE WHEN a.node IS NOT NULL THEN (d.host_c - d.host_0) * {sampled} END AS host_s,
       CASE WHEN a.node IS NOT NULL THEN least(greatest(d.in_c - d.in_0 - busy, 0.0),
                                              greatest(o.ts_s - o.t0_s - busy, 0.0)) * {sampled} END AS gap_s,
       CASE WHEN a.node IS NOT NULL THEN (greatest(o.ts_s - o.t0_s - busy, 0.0)
                 - least(greatest(d.in_c - d.in_0 - busy, 0.0), greatest(o.ts_s - o.t0_s - busy, 0.0))) * {sampled}
       END AS idle_s,
       (o.ts_s - o.t0_s) * (1.0 - {sampled}) AS unsampled_s,
       coalesce(o.sm_active_pct, o.gpu_util_pct) AS sm_active_pct,
       CASE WHEN o.sm_active_pct IS NOT NULL THEN 'sm_active'
            WHEN o.gpu_util_pct IS NOT NULL THEN 'gpu_util' END AS sm_source,
       o.gpu_util_pct, o.dram_active_pct, o.power_w,
       {energy} AS energy_j,
       {energy} * (1.0 - {sampled}) AS energy_unsampled_j,
       CASE WHEN o.parent_uuid IS NOT NULL THEN 'mig-parent'
            WHEN o.energy_mj IS NOT NULL AND o.e0_mj IS NOT NULL AND o.energy_mj >= o.e0_mj THEN 'counter'
            WHEN o.power_w IS NOT NULL AND o.energy_mj IS NOT NULL AND o.e0_mj IS NOT NULL
                THEN 'integrated-reset'
            WHEN o.power_w IS NOT NULL THEN 'integrated-no-counter' END AS energy_source,
       trust_label(o.node, o.source, o.emulated) AS trust,
       coalesce(o.host_bound_pct > 0, false) AS host_bound, 1 AS samples, 0.0 AS excess_s,
       NULL::BIGINT AS k, {power_sums_sql("coalesce(o.sm_active_pct, o.gpu_util_pct)", aggregate=False)},
       (1 - {sampled})::INTEGER AS sample_gaps,
       CASE WHEN {sampled} = 0.0 THEN o.ts_s - o.t0_s END AS longest_gap_s,
       o.gap_threshold_s, o.power_limit_w
FROM ordered o
JOIN (SELECT *, (p_c - p_0) + (d_c - d_0) + (mp_c - mp_0) + (md_c - md_0) + (host_c - host_0) AS busy
      FROM deltas WHERE extra = 0) d
  ON o.node = d.node AND o.source = d.source AND o.device = d.device
 AND o."index" IS NOT DISTINCT FROM d."index" AND o.ts_s = d.t_s
LEFT JOIN attributed a
  ON o.node = a.node AND o.source = a.source AND o.device = a.device AND o."index" IS NOT DISTINCT FROM a."index"
WHERE o.t0_s IS NOT NULL AND o.ts_s > o.t0_s
""")


def interval_ctes(window: Window, islands_relation: str) -> list[Cte]:
    """The named queries of :func:`intervals_sql`, in order (``islands_relation``: the window's
    registered :func:`analytics.intervals.request_islands`)."""
    return [
        Cte("samp", window_samples(window)),
        Cte("it", window_iterations(window)),
        Cte("seg", iteration_segments()),
        Cte("segc", cumulative_states()),
        Cte("isl", islands(islands_relation)),
        Cte("islc", cumulative_in_flight()),
        Cte("owner_worker", owner_workers(window)),
        Cte("ordered", ordered_samples()),
        Cte("pts", read_points()),
        Cte("ptc", points_in_segments()),
        Cte("ptv", point_values()),
        Cte("deltas", point_deltas()),
        Cte("attributed", attributed_gpus()),
    ]


def intervals_sql(window: Window, islands: str) -> tuple[str, list[Any]]:
    """SQL (and its parameters) yielding one row per sample interval of the window's GPUs;
    ``islands``: the relation of the window's :func:`analytics.intervals.request_islands` (see
    :func:`analytics.intervals.registered_islands`). An interval longer than its GPU's gap threshold
    (:func:`gap_threshold_sql`) is unsampled as a whole: ``unsampled_s`` = its length, its other
    states 0, ``energy_unsampled_j`` = its energy, ``sample_gaps`` = 1."""
    return with_ctes(interval_ctes(window, islands), intervals_select())
