"""The grid buckets of a window as named queries (``bucket_s`` > 0 of analytics/intervals.py): one
row per GPU × ``[kΔ, (k+1)Δ)`` cell holding samples, every step a hash aggregate or a join against
the small bucket table. :func:`bucket_ctes` lists the queries in order, each from a function of its
own here (the iteration side from analytics/bucket_iterations.py); :func:`buckets_sql` is the
statement. Sample gaps, the counter at bucket ends and the scaling: docs/analytics/attribution.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from analytics.bucket_iterations import MIXED, raw_iteration_side, rolled_iteration_side
from analytics.interval_queries import islands
from analytics.interval_rules import (
    SM_SHIFT_PCT,
    gap_subcells,
    gap_threshold_sql,
    iteration_rows_sql,
    keyed_samples_sql,
)
from analytics.query import Cte, Query, with_ctes
from analytics.window import Window

# A cell's columns from its sub-cells (``sg``): (name, roll-up over sub-cells, the one sub-cell's value)
_CELL_COLS: tuple[tuple[str, str, str], ...] = (
    ("samples", "sum(n)", "n"),
    ("f_ts", "min(f_ts)", "f_ts"),
    ("l_ts", "max(l_ts)", "l_ts"),
    ("f_e", "arg_min(f_e, f_ts)", "f_e"),
    ("l_e", "arg_max(l_e, l_ts)", "l_e"),
    ("e_range", "max(max_e) - min(min_e)", "max_e - min_e"),
    ("n_e", "sum(n_e)", "n_e"),
    ("power_w", "sum(p_sum) / nullif(sum(p_n), 0)", "p_sum / nullif(p_n, 0)"),
    ("power_limit_w", "max(power_limit_w)", "power_limit_w"),
    ("sm_active_pct", "sum(sm_sum) / nullif(sum(n_sm_any), 0)", "sm_sum / nullif(n_sm_any, 0)"),
    ("n_sm", "sum(n_sm)", "n_sm"),
    ("n_sm_any", "sum(n_sm_any)", "n_sm_any"),
    ("gpu_util_pct", "sum(u_sum) / nullif(sum(u_n), 0)", "u_sum / nullif(u_n, 0)"),
    ("dram_active_pct", "sum(dr_sum) / nullif(sum(dr_n), 0)", "dr_sum / nullif(dr_n, 0)"),
    ("emulated", "bool_or(emulated)", "emulated"),
    ("host_bound", "coalesce(max(hb_max) > 0, false)", "coalesce(hb_max > 0, false)"),
    *((f"sm_{c}", f"sum(sm_{c})", f"sm_{c}") for c in ("n", "s1", "s2", "s3", "s4")),
    # the sample gaps ending in the cell: their seconds, count, longest; the one before its first sample
    ("unsampled_s", "sum(gap_s)", "gap_s"),
    ("sample_gaps", "count(*) FILTER (WHERE gap_s > 0)", "(gap_s > 0)::INTEGER"),
    ("longest_gap_s", "max(gap_s) FILTER (WHERE gap_s > 0)", "CASE WHEN gap_s > 0 THEN gap_s END"),
    ("lead_gap_s", "arg_min(gap_s, f_ts)", "gap_s"),
    ("gap_e_j", "sum(gap_e_j)", "gap_e_j"),
    ("gap_pw_j", "sum(gap_pw_j)", "gap_pw_j"),
    ("gap_threshold_s", "any_value(thr)", "thr"),
)


@dataclass(frozen=True, slots=True)
class Grid:
    """The bucket grid: ``D``, the width as SQL text; ``m``, sub-cells per cell (:func:`gap_subcells`)."""

    bucket_s: float

    @property
    def D(self) -> str:
        return repr(float(self.bucket_s))

    @property
    def m(self) -> int:
        return gap_subcells(float(self.bucket_s))


def sub_cells(window: Window, grid: Grid) -> Query:
    """``sub``: per GPU × sub-cell (of at most ``GAP_MIN_S``, inside cell ``k``; ``j`` NULL where a
    cell is one sub-cell): the sample count, first and last sample time and counter, sums and counts
    of the metrics, the SM power sums; the GPU's identity joined to its cells, not to every sample."""
    D = grid.D
    pred, par = window.node_sql("node")
    j, group_j = (
        ("NULL", "") if grid.m == 1 else (f"floor(ts_s / {float(grid.bucket_s) / grid.m!r})::BIGINT", ", j")
    )
    return Query(
        f"""
    SELECT gk.node, gk.source, gk.device, gk."index", x.* EXCLUDE (gpu_key), gk.emulated
    FROM (SELECT gpu_key, k,
           count(*) AS n, min(ts_s) AS f_ts, max(ts_s) AS l_ts,
           arg_min(energy_mj, ts_s) AS f_e, arg_max(energy_mj, ts_s) AS l_e,
           min(energy_mj) AS min_e, max(energy_mj) AS max_e, count(energy_mj) AS n_e,
           sum(power_w) AS p_sum, count(power_w) AS p_n, max(power_limit_w) AS power_limit_w,
           sum(sm_any) AS sm_sum, count(sm_active_pct) AS n_sm, count(sm_any) AS n_sm_any,
           sum(gpu_util_pct) AS u_sum, count(gpu_util_pct) AS u_n,
           sum(dram_active_pct) AS dr_sum, count(dram_active_pct) AS dr_n,
           max(host_bound_pct) AS hb_max,
           count(v) AS sm_n, sum(v) AS sm_s1, sum(v * v) AS sm_s2, sum(v * v * v) AS sm_s3,
           sum((v * v) * (v * v)) AS sm_s4
    FROM (SELECT *, floor(ts_s / {D})::BIGINT AS k, {j} AS j, coalesce(sm_active_pct, gpu_util_pct) AS sm_any,
                 coalesce(sm_active_pct, gpu_util_pct) - {SM_SHIFT_PCT} AS v
          FROM {keyed_samples_sql(pred)} AND ts_s >= ? AND ts_s < ?)
    GROUP BY gpu_key, k{group_j}) x
    JOIN gpu_keys gk USING (gpu_key)  -- the GPU's identity joined to its cells, not to every sample""",
        (*par, window.start_s, window.end_s),
    )


def sub_cell_gaps(grid: Grid) -> Query:
    """``sg``: each sub-cell (``sub``) with the sample gap before it (``gap_s``, 0: none; ``thr``
    its GPU's gap threshold), the counter's rise across it and its integrated power; where a cell is
    one sub-cell, also the neighbours' edge samples (this window pass serves ``nb``)."""
    cell_window = (
        ""
        if grid.m > 1
        else (
            ",\n                 lag(n_e = n) OVER w AS p_ok, lead(k) OVER w AS nk, lead(f_ts) OVER w AS nf_ts,"
            "\n                 lead(f_e) OVER w AS nf_e, lead(n_e = n) OVER w AS n_ok"
        )
    )
    threshold = gap_threshold_sql("min(f_ts) OVER a", "max(l_ts) OVER a", "sum(n) OVER a")
    return Query(f"""
    SELECT *, CASE WHEN f_ts - pl_ts > thr THEN f_ts - pl_ts ELSE 0.0 END AS gap_s,
           CASE WHEN f_ts - pl_ts > thr AND f_e >= pl_e THEN (f_e - pl_e) / 1000.0 END AS gap_e_j,
           CASE WHEN f_ts - pl_ts > thr
                THEN coalesce((pl_w + p_sum / nullif(p_n, 0)) / 2.0, pl_w, p_sum / nullif(p_n, 0)) * (f_ts - pl_ts)
           END AS gap_pw_j
    FROM (SELECT *, lag(l_ts) OVER w AS pl_ts, lag(l_e) OVER w AS pl_e, lag(p_sum / nullif(p_n, 0)) OVER w AS pl_w,
                 {threshold} AS thr{cell_window}
          FROM sub
          WINDOW w AS (PARTITION BY node, source, device, "index" ORDER BY f_ts),
                 a AS (PARTITION BY node, source, device, "index"))""")


def cells(grid: Grid) -> Query:
    """``sb``: per GPU × cell ``k``: edge samples, counter checks, mean activities, the sample gaps
    ending in it (``_CELL_COLS``, rolled up from ``sg``)."""
    one = grid.m == 1
    cell_cols = ",\n           ".join(
        f"{(one_value if one else agg)} AS {name}" for name, agg, one_value in _CELL_COLS
    )
    neighbours = (
        (
            ",\n           pl_ts, pl_e, p_ok, nk, nf_ts, nf_e, n_ok,"
            "\n           CASE WHEN nf_ts - l_ts > thr THEN nf_ts - l_ts ELSE 0.0 END AS n_gap_s"
        )
        if one
        else ""
    )
    group_k = "" if one else '\n    GROUP BY node, source, device, "index", k'
    return Query(f"""
    SELECT node, source, device, "index", k, {cell_cols}{neighbours}
    FROM sg{group_k}""")


def device_periods(window: Window) -> Query:
    """``dv``: the window's nodes' devices rows with the time each holds until (the GPU's next row)."""
    pred, par = window.node_sql("node")
    return Query(
        f"""
    SELECT *, lead(since_s, 1, 'infinity'::DOUBLE)
                  OVER (PARTITION BY node, source, device, "index" ORDER BY since_s) AS until_s
    FROM devices WHERE {pred}""",
        tuple(par),
    )


def cell_devices() -> Query:
    """``sbd``: each cell (``sb``) with the device attributes (uuid, owner worker as ``dev_worker``,
    role) in effect at its first sample; CPU devices left out."""
    return Query("""
    SELECT b.*, d.uuid, d.parent_uuid, d.mig_instance_id, d.name, d.worker AS dev_worker, d.role
    FROM sb b LEFT JOIN dv d
      ON b.node = d.node AND b.source = d.source AND b.device = d.device
     AND b."index" IS NOT DISTINCT FROM d."index" AND b.f_ts >= d.since_s AND b.f_ts < d.until_s
    WHERE d.kind IS DISTINCT FROM 'cpu'  -- a CPU device is no GPU""")


def neighbours(grid: Grid) -> Query:
    """``nb``: each bucket (``sbd``) with its neighbours' edge samples: one window pass here, or,
    where a cell is one sub-cell, the columns ``sg``'s pass gave it."""
    if grid.m == 1:
        return Query("""
    SELECT * FROM sbd""")
    return Query("""
    SELECT *, lag(l_ts) OVER g AS pl_ts, lag(l_e) OVER g AS pl_e, lag(n_e = samples) OVER g AS p_ok,
           lead(k) OVER g AS nk, lead(f_ts) OVER g AS nf_ts, lead(f_e) OVER g AS nf_e,
           lead(n_e = samples) OVER g AS n_ok, lead(lead_gap_s) OVER g AS n_gap_s
    FROM sbd WINDOW g AS (PARTITION BY node, source, device, "index" ORDER BY k)""")


def coverage(grid: Grid) -> Query:
    """``cov``: the time a bucket (``nb``) reaches, ``[t0_s, t1_s)``: from its cell's start (the first
    sample, for the first bucket; the last sample before the gap, for one after a gap) to the next
    bucket's (its last sample before a gap); ``k_end``: the cell after its last."""
    D = grid.D
    return Query(f"""
    SELECT *, CASE WHEN pl_ts IS NULL THEN f_ts WHEN lead_gap_s > 0 THEN pl_ts ELSE k * {D} END AS t0_s,
              CASE WHEN nk IS NULL OR n_gap_s > 0 THEN l_ts ELSE nk * {D} END AS t1_s,
              CASE WHEN n_gap_s > 0 THEN k + 1 ELSE coalesce(nk, k + 1) END AS k_end
    FROM nb""")


def counter_ends() -> Query:
    """``en``: the energy counter at a bucket's two ends (``e0``, ``e1``), interpolated between the
    samples around them; ``has_counter``: every sample of it and its neighbours has one."""
    return Query("""
    SELECT *,
           n_e = samples AND coalesce(p_ok, true) AND coalesce(n_ok, true) AS has_counter,
           CASE WHEN pl_ts IS NULL THEN f_e::DOUBLE
                WHEN f_e >= pl_e THEN pl_e + (f_e - pl_e) * (t0_s - pl_ts) / (f_ts - pl_ts) END AS e0,
           CASE WHEN nk IS NULL THEN l_e::DOUBLE
                WHEN nf_e >= l_e THEN l_e + (nf_e - l_e) * (t1_s - l_ts) / (nf_ts - l_ts) END AS e1
    FROM cov""")


def window_iterations(window: Window) -> Query:
    """``it``: the window's iterations (:func:`iteration_rows_sql`)."""
    pred, par = window.node_sql("node")
    return Query(iteration_rows_sql(pred, window.simulated), (*par, window.start_s, window.end_s))


def gpu_spans() -> Query:
    """``span``: each GPU's sampled time ``[s0, s1]``; ``g``, an integer id of the GPU (the
    iterations side's group key)."""
    return Query("""
    SELECT *, (row_number() OVER ())::INTEGER AS g
    FROM (SELECT node, uuid, min(f_ts) AS s0, max(l_ts) AS s1 FROM sbd WHERE uuid IS NOT NULL GROUP BY ALL)""")


def gap_parts(grid: Grid) -> Query:
    """``gpart``: each sample gap's part ``[lo, hi]`` in its two edge cells ``k`` (the cells wholly
    inside it are in no bucket: the work there is not counted; the parts here are taken off their
    buckets)."""
    D = grid.D
    gap_rows = (
        "sbd WHERE lead_gap_s > 0" if grid.m == 1 else "sg WHERE gap_s > 0"
    )  # every gap, also inside a cell
    return Query(f"""
    SELECT node, source, device, "index", k, greatest(gs, k * {D}) AS lo, least(ge, (k + 1) * {D}) AS hi
    FROM (SELECT node, source, device, "index", pl_ts AS gs, f_ts AS ge,
                 unnest(list_distinct([floor(pl_ts / {D})::BIGINT, k])) AS k
          FROM {gap_rows})""")


def gap_part_gpus() -> Query:
    """``gpi``: each gap part (``gpart``) with the GPU (uuid, and ``g``) of the bucket holding the cell."""
    return Query("""
    SELECT e.*, sp.g, b.uuid
    FROM gpart e
    JOIN sbd b ON e.node = b.node AND e.source = b.source AND e.device = b.device
     AND e."index" IS NOT DISTINCT FROM b."index" AND e.k = b.k
    JOIN span sp ON b.node = sp.node AND b.uuid = sp.uuid""")


def unowned_gpus() -> Query:
    """``nodw``: the GPUs (``g``) with a bucket whose devices row names no worker."""
    return Query("""
    SELECT DISTINCT sp.g FROM en e JOIN span sp ON e.node = sp.node AND e.uuid = sp.uuid WHERE e.dev_worker IS NULL""")


def bucket_workers() -> Query:
    """``bk``: each bucket (``en``) with its GPU's ``g`` and its worker (the devices row's, else the
    owner ``ow`` from the iterations)."""
    return Query("""
    SELECT e.*, sp.g, coalesce(e.dev_worker, ow.worker) AS worker
    FROM en e LEFT JOIN span sp ON e.node = sp.node AND e.uuid = sp.uuid LEFT JOIN ow ON sp.g = ow.g""")


def bucket_keys() -> Query:
    """``bku``: ``(g, k, k_end)`` of the buckets of GPUs with a uuid."""
    return Query("SELECT g, k, k_end FROM bk WHERE g IS NOT NULL")


def cell_iterations() -> Query:
    """``itj``: a cell's iteration seconds (``itagg``) with the bucket ``k`` holding the cell (a bucket
    absorbs empty cells, not those of a sample gap: ``[k_end, next k)`` is in no bucket, nor what is
    after the GPU's last sample)."""
    return Query("""
    SELECT ia.*, b.k FROM itagg ia JOIN bku b ON ia.g = b.g AND ia.j = b.k
    UNION ALL
    SELECT ia.*, b.k
    FROM (SELECT * FROM itagg ia WHERE NOT EXISTS
              (SELECT 1 FROM bku b WHERE ia.g = b.g AND ia.j = b.k)) ia
    ASOF JOIN bku b ON ia.g = b.g AND ia.j >= b.k
    WHERE ia.j < b.k_end  -- after the GPU's last sample: in no bucket""")


def gap_iterations() -> Query:
    """``itgap``: (negated, to be taken off) the iteration seconds inside the sample gaps' parts of
    their edge cells (``gpi``), per GPU and bucket."""
    return Query(f"""
    SELECT g, k,
           -sum(CASE WHEN phase = 'prefill' THEN busy_s ELSE 0.0 END) AS p_s,
           -sum(CASE WHEN phase = 'decode' THEN busy_s ELSE 0.0 END) AS d_s,
           -sum(CASE WHEN {MIXED} THEN pshare * busy_s ELSE 0.0 END) AS mp_s,
           -sum(CASE WHEN {MIXED} THEN (1.0 - pshare) * busy_s ELSE 0.0 END) AS md_s,
           -sum(host_s) AS h_s
    FROM (SELECT c.g, c.k, it.phase, it.pshare,
                 greatest(0.0, least(it.end_s - it.busy_len_s, it.end_s, c.hi) - greatest(it.start_s, c.lo)) AS host_s,
                 greatest(0.0, least(it.end_s, c.hi) - greatest(it.start_s, c.lo, it.end_s - it.busy_len_s)) AS busy_s
          FROM it JOIN gpi c ON it.node = c.node AND it.uuid = c.uuid AND it.end_s > c.lo AND it.start_s < c.hi)
    GROUP BY g, k""")


def gap_in_flight(islands: str) -> Query:
    """``ingap``: the in-flight time (the ``islands`` relation) inside the sample gaps' parts of their
    edge cells, per bucket holding the cell."""
    return Query(f"""
    SELECT c.g, c.k, sum(greatest(0.0, least(i.b_s, c.hi) - greatest(i.a_s, c.lo))) AS in_gap_s
    FROM (SELECT e.*, b.g, b.worker
          FROM gpart e
          JOIN bk b ON e.node = b.node AND e.source = b.source AND e.device = b.device
           AND e."index" IS NOT DISTINCT FROM b."index" AND e.k = b.k
          WHERE b.worker IS NOT NULL) c
    JOIN {islands} i ON c.node = i.node AND c.worker = i.worker AND i.b_s > c.lo AND i.a_s < c.hi
    GROUP BY c.g, c.k""")


def bucket_iterations() -> Query:
    """``itb``: per GPU bucket: iteration seconds (``itj`` less ``itgap``), and the in-flight seconds
    inside its sample gaps (``ingap``)."""
    return Query("""
    SELECT g, k, sum(p_s) AS p_s, sum(d_s) AS d_s, sum(mp_s) AS mp_s, sum(md_s) AS md_s, sum(h_s) AS h_s,
           sum(in_gap_s) AS in_gap_s
    FROM (SELECT g, k, p_s, d_s, mp_s, md_s, h_s, 0.0 AS in_gap_s FROM itj
          UNION ALL
          SELECT g, k, p_s, d_s, mp_s, md_s, h_s, 0.0 FROM itgap
          UNION ALL
          SELECT g, k, 0.0, 0.0, 0.0, 0.0, 0.0, in_gap_s FROM ingap)
    GROUP BY g, k""")


def cell_in_flight(grid: Grid) -> Query:
    """``inagg``: per worker and cell ``j``, the seconds some request was in flight (``isl``)."""
    D = grid.D
    return Query(f"""
    SELECT node, worker, j, sum(greatest(0.0, least(b_s, (j + 1) * {D}) - greatest(a_s, j * {D}))) AS in_s
    FROM (SELECT *, unnest(range(floor(a_s / {D})::BIGINT, floor(b_s / {D})::BIGINT + 1)) AS j FROM isl)
    GROUP BY node, worker, j""")


def worker_buckets() -> Query:
    """``wk``: the buckets of a worker (all of a TP replica's GPUs share them)."""
    return Query("""
    SELECT node, worker, k, max(k_end) AS k_end FROM bk WHERE worker IS NOT NULL
    GROUP BY node, worker, k""")


def bucket_in_flight() -> Query:
    """``inb``: per worker bucket, the in-flight seconds of its cells (``inagg``; empty cells go to
    the bucket before them, as in ``itj``)."""
    return Query("""
    SELECT node, worker, k, sum(in_s) AS in_s FROM (
        SELECT ia.*, w.k FROM inagg ia JOIN wk w ON ia.node = w.node AND ia.worker = w.worker AND ia.j = w.k
        UNION ALL
        SELECT ia.*, w.k
        FROM (SELECT * FROM inagg ia WHERE NOT EXISTS
                  (SELECT 1 FROM wk w WHERE ia.node = w.node AND ia.worker = w.worker AND ia.j = w.k)) ia
        ASOF JOIN wk w ON ia.node = w.node AND ia.worker = w.worker AND ia.j >= w.k
        WHERE ia.j < w.k_end)
    GROUP BY node, worker, k""")


def attributed_gpus() -> Query:
    """``attributed``: the GPUs with a bucket whose worker is known."""
    return Query("""SELECT DISTINCT node, source, device, "index" FROM bk WHERE worker IS NOT NULL""")


def bucket_states() -> Query:
    """``st``: each bucket (``bk``) with its sampled seconds, its iteration and in-flight seconds
    (``itb``, ``inb``) and ``raw_cov_s``, the iteration seconds before scaling."""
    return Query("""
    SELECT b.*, a.node IS NOT NULL AS attributed, b.t1_s - b.t0_s AS interval_s,
           b.t1_s - b.t0_s - b.unsampled_s AS sampled_s,
           coalesce(i.p_s, 0.0) AS p_s, coalesce(i.d_s, 0.0) AS d_s, coalesce(i.mp_s, 0.0) AS mp_s,
           coalesce(i.md_s, 0.0) AS md_s, coalesce(i.h_s, 0.0) AS h_s,
           greatest(0.0, coalesce(r.in_s, 0.0) - coalesce(i.in_gap_s, 0.0)) AS in_s,
           coalesce(i.p_s + i.d_s + i.mp_s + i.md_s + i.h_s, 0.0) AS raw_cov_s
    FROM bk b
    LEFT JOIN itb i ON b.g = i.g AND b.k = i.k
    LEFT JOIN inb r ON b.node = r.node AND b.worker = r.worker AND b.k = r.k
    LEFT JOIN attributed a
      ON b.node = a.node AND b.source = a.source AND b.device = a.device
     AND b."index" IS NOT DISTINCT FROM a."index"
    WHERE b.t1_s > b.t0_s""")


def scaled_states() -> Query:
    """``sc``: each bucket (``st``) with ``f``, the factor scaling its iteration seconds into its
    sampled time, ``cov_s`` the seconds they cover, and ``counter_ok`` (its energy is the counter's)."""
    return Query("""
    SELECT *, CASE WHEN raw_cov_s > sampled_s THEN sampled_s / raw_cov_s ELSE 1.0 END AS f,
              least(raw_cov_s, sampled_s) AS cov_s,
              parent_uuid IS NULL AND has_counter AND e_range = l_e - f_e AND e0 IS NOT NULL
                  AND e1 IS NOT NULL AS counter_ok
    FROM st""")


def buckets_select(grid: Grid) -> Query:
    """The statement's result: one row per GPU bucket with the columns of the sample intervals
    (:func:`analytics.interval_queries.intervals_select`), plus ``samples`` and ``excess_s``."""
    D = grid.D
    return Query(f"""
SELECT node, source, device, "index", uuid, parent_uuid, mig_instance_id, name, worker, role,
       t0_s, t1_s, interval_s, floor(k * {D} / 3600.0) * 3600.0 AS hour_s, attributed,
       CASE WHEN attributed THEN f * p_s END AS prefill_s,
       CASE WHEN attributed THEN f * d_s END AS decode_s,
       CASE WHEN attributed THEN f * mp_s END AS mixed_prefill_s,
       CASE WHEN attributed THEN f * md_s END AS mixed_decode_s,
       CASE WHEN attributed THEN f * h_s END AS host_s,
       CASE WHEN attributed THEN least(greatest(in_s - cov_s, 0.0), sampled_s - cov_s) END AS gap_s,
       CASE WHEN attributed THEN sampled_s - cov_s - least(greatest(in_s - cov_s, 0.0), sampled_s - cov_s)
       END AS idle_s,
       unsampled_s,
       sm_active_pct,
       CASE WHEN n_sm = samples THEN 'sm_active' WHEN n_sm_any > 0 THEN 'gpu_util' END AS sm_source,
       gpu_util_pct, dram_active_pct, power_w,
       CASE WHEN parent_uuid IS NOT NULL THEN NULL
            WHEN counter_ok THEN (e1 - e0) / 1000.0
            WHEN power_w IS NOT NULL THEN power_w * sampled_s + coalesce(gap_pw_j, power_w * unsampled_s)
       END AS energy_j,
       CASE WHEN parent_uuid IS NOT NULL THEN NULL
            WHEN unsampled_s = 0 THEN 0.0
            WHEN counter_ok THEN least(coalesce(gap_e_j, 0.0), (e1 - e0) / 1000.0)
            WHEN power_w IS NOT NULL THEN coalesce(gap_pw_j, power_w * unsampled_s)
       END AS energy_unsampled_j,
       CASE WHEN parent_uuid IS NOT NULL THEN 'mig-parent'
            WHEN counter_ok THEN 'counter'
            WHEN power_w IS NOT NULL AND has_counter THEN 'integrated-reset'
            WHEN power_w IS NOT NULL THEN 'integrated-no-counter' END AS energy_source,
       trust_label(node, source, emulated) AS trust, host_bound, samples,
       CASE WHEN attributed THEN greatest(raw_cov_s - sampled_s, 0.0) ELSE 0.0 END AS excess_s,
       k, sm_n, sm_s1, sm_s2, sm_s3, sm_s4, sample_gaps, longest_gap_s, gap_threshold_s, power_limit_w
FROM sc""")


def bucket_ctes(
    window: Window,
    bucket_s: float,
    islands_relation: str,
    *,
    long_iterations: bool = True,
    rollup: bool = False,
    edge_seconds: Sequence[int] | None = None,
) -> list[Cte]:
    """The named queries of :func:`buckets_sql`, in order (arguments as there)."""
    if not (math.isfinite(bucket_s) and bucket_s > 0):
        raise ValueError(f"bucket_s must be a positive number of seconds, got {bucket_s!r}")
    if rollup and bucket_s != math.floor(bucket_s):
        raise ValueError(f"the iteration rollup needs a whole number of seconds per bucket, got {bucket_s!r}")
    grid = Grid(float(bucket_s))
    if rollup:
        iteration_side, owner = rolled_iteration_side(window, grid.D, edge_seconds)
    else:
        iteration_side, owner = raw_iteration_side(grid.D, long_iterations=long_iterations)
    return [
        Cte("sub", sub_cells(window, grid)),
        Cte("sg", sub_cell_gaps(grid)),
        Cte("sb", cells(grid)),
        Cte("dv", device_periods(window)),
        Cte("sbd", cell_devices()),
        Cte("nb", neighbours(grid)),
        Cte("cov", coverage(grid)),
        Cte("en", counter_ends()),
        Cte("it", window_iterations(window), inline=True),
        Cte("span", gpu_spans()),
        Cte("gpart", gap_parts(grid)),
        Cte("gpi", gap_part_gpus()),
        *iteration_side,
        Cte("nodw", unowned_gpus()),
        owner,
        Cte("bk", bucket_workers()),
        Cte("bku", bucket_keys()),
        Cte("itj", cell_iterations()),
        Cte("itgap", gap_iterations()),
        Cte("ingap", gap_in_flight(islands_relation)),
        Cte("itb", bucket_iterations()),
        Cte("isl", islands(islands_relation)),
        Cte("inagg", cell_in_flight(grid)),
        Cte("wk", worker_buckets()),
        Cte("inb", bucket_in_flight()),
        Cte("attributed", attributed_gpus()),
        Cte("st", bucket_states()),
        Cte("sc", scaled_states()),
    ]


def buckets_sql(
    window: Window,
    bucket_s: float,
    islands: str,
    *,
    long_iterations: bool = True,
    rollup: bool = False,
    edge_seconds: Sequence[int] | None = None,
) -> tuple[str, list[Any]]:
    """SQL (and its parameters) yielding one row per GPU × grid bucket of ``bucket_s`` seconds, with
    the columns of :func:`analytics.interval_queries.intervals_sql` (plus ``samples`` and
    ``excess_s``: iteration seconds beyond the bucket's sampled time, scaled away — overlapping
    iterations or clock skew); ``islands`` as there. Sample gaps are found on sub-cells of at most
    ``GAP_MIN_S`` (:func:`gap_subcells`) in the same grouped scan of the samples; a bucket holds the
    gaps that end in it as ``unsampled_s`` (see analytics/intervals.py's docstring).
    ``long_iterations=False`` leaves out the pieces of iterations crossing two or more cell
    boundaries: right only when none is longer than half a bucket
    (:func:`analytics.intervals.has_long_iterations`), and the iterations are then scanned once.

    ``rollup=True`` reads each GPU's whole seconds of iterations from the store's
    ``iteration_seconds`` (collector/store/iteration_seconds.py) and the raw iterations only in the
    part-seconds at the two ends of its sampled time: right only when that table covers the
    window's nodes (:func:`collector.store.iteration_seconds.covers`) and ``bucket_s`` is a whole
    number of seconds (:func:`analytics.intervals.use_rollup`). ``edge_seconds``: the seconds that
    hold a GPU's first or last sample (:func:`analytics.intervals.edge_seconds`), letting the raw
    read skip the rest of the rows; None: every row is joined to the ends."""
    ctes = bucket_ctes(
        window, bucket_s, islands, long_iterations=long_iterations, rollup=rollup, edge_seconds=edge_seconds
    )
    return with_ctes(ctes, buckets_select(Grid(float(bucket_s))))
