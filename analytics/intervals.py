"""The rows phase attribution aggregates: GPU sample intervals, or grid buckets of them.

Two tables with the same columns (see :func:`analytics.attribution.gpu_intervals`):

* **sample intervals** (``bucket_s=0``): ``(previous ts_s, ts_s]`` of two consecutive samples of a
  GPU, the first sample of the window only opening the first; the state seconds are differences of
  cumulative state-time functions read at both ends by ``ASOF`` joins. Exact, but its window
  functions sort every sample and every iteration: for inspection and small windows.
* **grid buckets** (``bucket_s`` > 0, the default for the breakdowns): one row per GPU and
  ``[kΔ, (k+1)Δ)`` cell holding samples; a bucket reaches from its cell's start to the next bucket's
  (so buckets tile the GPU's time); the energy counter is read at bucket boundaries by linear
  interpolation between the two samples around them (exact at the first and last sample);
  iterations and request spans are cut at cell boundaries by arithmetic. Every step is a hash
  aggregate or a join against the small bucket table: fast on a fleet's worth of samples.

**Sample gaps.** Two consecutive samples of a GPU further apart than its gap threshold
(:func:`gap_threshold_sql`: ``max(GAP_MIN_S, GAP_PERIODS × its mean sampling period in the
window)``) leave the time between them *unsampled*: a state of its own (``unsampled_s``), never
idle. A sample interval across a gap is unsampled as a whole; a bucket before a gap ends at its last
sample, the bucket after it starts at the last sample before the gap and holds the gap as
``unsampled_s``; iterations and in-flight request time inside a gap are not counted (cells wholly
inside it belong to no bucket; the parts of its two edge cells inside it are taken off exactly).
The energy counter's rise across a gap (integrated power where there is no counter) is the row's
``energy_unsampled_j``: measured energy, attributed to the unsampled state.

The rules shared by both (what part of an iteration is GPU-busy, when a request is on a worker,
the gap threshold) are written once, below. Formulas and sources: docs/analytics/attribution.md.
"""

from __future__ import annotations

import itertools
import math
import uuid as uuidlib
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analytics.window import Window
from collector.store import iteration_seconds

#: Bucket widths the automatic choice rounds up to (s).
NICE_BUCKETS_S: tuple[float, ...] = (
    1.0,
    2.0,
    5.0,
    10.0,
    15.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    900.0,
    1800.0,
    3600.0,
)


#: A GPU's consecutive samples further apart than this many of its mean sampling periods in the
#: window, and at least ``GAP_MIN_S`` apart, leave the time between them unsampled (a collector
#: restart, a lost exporter).
GAP_PERIODS = 5.0
GAP_MIN_S = 5.0


def gap_threshold_sql(first_s: str, last_s: str, samples: str) -> str:
    """SQL of a GPU's gap threshold (s) from its first and last sample time in the window and its
    count of samples there: ``greatest(GAP_MIN_S, GAP_PERIODS × (last − first) / (samples − 1))``
    — the one definition the sample intervals and the buckets share."""
    return f"greatest({GAP_MIN_S!r}, {GAP_PERIODS!r} * (({last_s}) - ({first_s})) / greatest(({samples}) - 1, 1))"


def gap_subcells(bucket_s: float) -> int:
    """How many sub-cells a bucket cell of ``bucket_s`` seconds is cut into to find gaps: cells of at
    most ``GAP_MIN_S`` (two samples of one such cell are closer than any gap, so a gap always lies
    between consecutive non-empty sub-cells, exactly from the last sample of one to the first of
    the next)."""
    return max(1, math.ceil(bucket_s / GAP_MIN_S - 1e-9))


#: At most this many distinct edge seconds become constant filters on the raw iterations read at
#: GPUs' span ends (more: the raw rows are joined to the ends without them).
MAX_EDGE_FILTERS = 64

#: SM activity is shifted by this before its power sums are taken (less cancellation in moments).
SM_SHIFT_PCT = 50.0


def _power_sums(x: str, *, aggregate: bool) -> str:
    """``sm_n`` and ``sm_s1``..``sm_s4``: the count and the sums of the 1st–4th powers of
    ``x − SM_SHIFT_PCT`` (over a bucket's samples, or of one sample), from which the moments of SM
    activity over any group of rows follow exactly."""
    v = f"(({x}) - {SM_SHIFT_PCT})"
    if aggregate:
        return f"count({x}) AS sm_n, " + ", ".join(f"sum(pow({v}, {p})) AS sm_s{p}" for p in range(1, 5))
    return f"CASE WHEN ({x}) IS NULL THEN 0 ELSE 1 END AS sm_n, " + ", ".join(
        f"pow({v}, {p}) AS sm_s{p}" for p in range(1, 5)
    )


def iteration_rows_sql(pred: str, simulated: bool) -> str:
    """The window's iterations (parameters: ``pred``'s, then start_s, end_s; ``simulated``: the window
    is a simulated scenario's, whose rows are all simulated) with ``uuid`` (the GPU),
    ``busy_len_s`` (GPU-busy seconds, at the end of the iteration) and ``pshare`` (prefill share of a
    mixed iteration's work). GPU-busy seconds: the simulator's ``compute_s`` (its ``modeled_s −
    compute_s`` is engine host time with the GPU idle, at the start); else the emulated device's
    ``modeled_s`` (the step's wall time beyond it is host time); else the whole step (a measured
    engine: its host time inside a step is not visible)."""
    # trust_label(node, source) = 'simulated', knowing the window's nodes; tested after compute_s
    sim = "TRUE" if simulated else "source = 'simulated'"
    return f"""
    SELECT node, gpu_uuid AS uuid, worker, start_s, end_s, phase, lag_s,
           {iteration_seconds.busy_len_sql(sim)} AS busy_len_s, {iteration_seconds.PSHARE_SQL} AS pshare
    FROM iterations
    WHERE {pred} AND gpu_uuid IS NOT NULL AND end_s > start_s AND end_s > ? AND start_s < ?"""


def request_spans_sql(pred: str) -> str:
    """``(node, worker, a_s, b_s)``: when a request was on a worker (parameters: ``pred``'s twice).
    On its prefill (or only) worker from arrival until it finished, or, handed off to a decode
    worker, until its KV transfer started; on that decode worker from the transfer's end (else its
    first token) until it finished. A request that never finished counts until the last time known
    of it (first token, prefill end, else arrival)."""
    return f"""
    SELECT node, prefill_worker AS worker, arrival_s AS a_s,
           CASE WHEN decode_worker IS NULL OR decode_worker = prefill_worker
                THEN coalesce(finish_s, first_token_s, prefill_end_s, arrival_s)
                ELSE coalesce(kv_transfer_start_s, prefill_end_s, first_token_s, finish_s, arrival_s) END AS b_s
    FROM requests WHERE {pred} AND prefill_worker IS NOT NULL
    UNION ALL
    SELECT node, decode_worker, coalesce(kv_transfer_end_s, first_token_s, prefill_end_s, arrival_s),
           coalesce(finish_s, first_token_s, prefill_end_s, arrival_s)
    FROM requests WHERE {pred} AND decode_worker IS NOT NULL
      AND decode_worker IS DISTINCT FROM prefill_worker"""


def request_islands(con: duckdb.DuckDBPyConnection, window: Window) -> pa.Table:
    """``(node, worker, a_s, b_s)``: the islands of "some request in flight" per worker — the union
    of the window's request spans (:func:`request_spans_sql`; spans that touch or overlap merge),
    one row per island. Computed in numpy on the fetched spans (a sort and a running maximum per
    worker): the same islands as the gaps-and-islands window functions in SQL, several times cheaper
    than two window passes over every request span. The end points are the spans' own values."""
    pred, par = window.node_sql("node")
    with warnings.catch_warnings():  # "an extra copy of the rows": cheap next to the query
        warnings.filterwarnings("ignore", message="Arrow output on a DB-API result")
        spans = con.execute(
            f"SELECT node, worker, a_s, b_s FROM ({request_spans_sql(pred)}) WHERE b_s > a_s AND b_s > ? AND a_s < ?",
            [*par, *par, window.start_s, window.end_s],
        ).to_arrow_table()
    if spans.num_rows == 0:
        return pa.table(
            {"node": pa.array([], pa.string()), "worker": pa.array([], pa.string()),
             "a_s": pa.array([], pa.float64()), "b_s": pa.array([], pa.float64())}
        )  # fmt: skip
    nodes = pc.dictionary_encode(spans["node"]).combine_chunks()
    workers = pc.dictionary_encode(spans["worker"]).combine_chunks()
    n_workers = len(workers.dictionary)
    gid = nodes.indices.to_numpy(zero_copy_only=False).astype(np.int64) * n_workers
    gid += workers.indices.to_numpy(zero_copy_only=False)
    a = spans["a_s"].to_numpy()
    b = spans["b_s"].to_numpy()
    order = span_order(gid, a, b)
    gid, a, b = gid[order], a[order], b[order]
    # segment bounds: each worker's spans, by (a_s, b_s)
    bounds = np.flatnonzero(gid[1:] != gid[:-1]) + 1
    seg = np.concatenate(([0], bounds, [len(gid)]))
    # the latest end among the worker's earlier spans; a span starting after it opens an island
    prev_b = np.empty_like(b)
    for lo, hi in itertools.pairwise(seg):
        np.maximum.accumulate(b[lo:hi], out=prev_b[lo:hi])
    opens = np.empty(len(gid), dtype=bool)
    opens[0] = True
    np.greater(a[1:], prev_b[:-1], out=opens[1:])
    opens[seg[:-1]] = True
    starts = np.flatnonzero(opens)
    island_gid = gid[starts]
    return pa.table(
        {
            "node": nodes.dictionary.take(pa.array(island_gid // n_workers)),
            "worker": workers.dictionary.take(pa.array(island_gid % n_workers)),
            "a_s": pa.array(a[starts]),
            "b_s": pa.array(np.maximum.reduceat(b, starts)),
        }
    )


def span_order(gid: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The permutation sorting spans ``[a, b)`` by group (``gid``, integers >= 0: a worker), then
    ``a``, then ``b`` (ties: row order):
    ``np.lexsort((b, a, gid))``, as two stable sorts where no two spans starting together are out of
    order by ``b`` (else lexsort itself). The spans come nearly in order of ``a`` (requests are
    stored as they arrive), which the stable sort of floats runs through in about linear time, and
    the worker ids are few (a radix sort where they fit in 16 bits)."""
    order = np.argsort(a, kind="stable")
    a_o, b_o = a[order], b[order]
    if np.any((a_o[1:] == a_o[:-1]) & (b_o[1:] < b_o[:-1])):
        return np.lexsort((b, a, gid))
    g = gid[order]
    if len(g) and g.max() < 2**16:
        g = g.astype(np.uint16)
    return order[np.argsort(g, kind="stable")]


@contextmanager
def registered_islands(con: duckdb.DuckDBPyConnection, window: Window) -> Iterator[str]:
    """:func:`request_islands` registered on ``con`` under a fresh name (yielded) for the SQL of
    :func:`intervals_sql` / :func:`buckets_sql`; unregistered on exit."""
    name = f"pl_islands_{uuidlib.uuid4().hex[:12]}"
    con.register(name, request_islands(con, window))
    try:
        yield name
    finally:
        con.unregister(name)


def intervals_sql(window: Window, islands: str) -> tuple[str, list[Any]]:
    """SQL (and its parameters) yielding one row per sample interval of the window's GPUs;
    ``islands``: the relation of the window's :func:`request_islands` (see
    :func:`registered_islands`). An interval longer than its GPU's gap threshold
    (:func:`gap_threshold_sql`) is unsampled as a whole: ``unsampled_s`` = its length, its other
    states 0, ``energy_unsampled_j`` = its energy, ``sample_gaps`` = 1."""
    s_pred, s_par = window.node_sql("s.node")
    i_pred, i_par = window.node_sql("node")
    w = [window.start_s, window.end_s]
    # 0 for an interval across a sample gap (all of it unsampled), else 1
    sampled = "(CASE WHEN o.ts_s - o.t0_s > o.gap_threshold_s THEN 0.0 ELSE 1.0 END)"
    energy = """CASE WHEN o.parent_uuid IS NOT NULL THEN NULL
            WHEN o.energy_mj IS NOT NULL AND o.e0_mj IS NOT NULL AND o.energy_mj >= o.e0_mj
                THEN (o.energy_mj - o.e0_mj) / 1000.0
            WHEN o.power_w IS NOT NULL
                THEN (o.power_w + coalesce(o.p0_w, o.power_w)) / 2.0 * (o.ts_s - o.t0_s) END"""
    sql = f"""
WITH
samp AS (  -- the window's samples with the device attributes (owner worker/role) in effect then
    SELECT s.node, s.source, s.device, s."index", s.ts_s, s.emulated,
           s.sm_active_pct, s.gpu_util_pct, s.dram_active_pct, s.power_w, s.energy_mj, s.host_bound_pct,
           s.power_limit_w,
           d.uuid, d.parent_uuid, d.mig_instance_id, d.name, d.worker, d.role
    FROM gpu_samples s ASOF LEFT JOIN devices d
      ON s.node = d.node AND s.source = d.source AND s.device = d.device
     AND s."index" IS NOT DISTINCT FROM d."index" AND s.ts_s >= d.since_s
    WHERE {s_pred} AND s.ts_s >= ? AND s.ts_s < ? AND d.kind IS DISTINCT FROM 'cpu'  -- a CPU is no GPU
),
it AS (  -- iterations of the window with their GPU-busy seconds
    SELECT *, max(end_s) OVER (PARTITION BY node, uuid ORDER BY start_s, end_s
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end_s
    FROM ({iteration_rows_sql(i_pred, window.simulated)})
),
seg AS (  -- iterations clipped so that they do not overlap: [a_s, end_s], host part first
    SELECT *, greatest(0.0, h_end_s - a_s) AS hl_s, greatest(0.0, end_s - greatest(a_s, h_end_s)) AS bl_s
    FROM (SELECT *, greatest(start_s, coalesce(prev_end_s, start_s)) AS a_s,
                 end_s - busy_len_s AS h_end_s
          FROM it)
    WHERE a_s < end_s
),
segc AS (  -- cumulative state seconds before each segment, per GPU uuid
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
    WINDOW c AS (PARTITION BY node, uuid ORDER BY a_s ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
),
isl AS (SELECT * FROM {islands}),  -- islands of "some request in flight" per worker
islc AS (
    SELECT node, worker, a_s, b_s - a_s AS len_s,
           coalesce(sum(b_s - a_s) OVER (PARTITION BY node, worker ORDER BY a_s
                                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0.0) AS c_in
    FROM isl
),
owner_worker AS (  -- a GPU without a devices worker: the worker whose iterations carry its uuid
    SELECT node, gpu_uuid AS uuid, min(worker) AS worker
    FROM iterations WHERE {i_pred} AND gpu_uuid IS NOT NULL AND end_s > ? AND start_s < ?
    GROUP BY ALL
),
ordered AS (
    SELECT s.* EXCLUDE (worker), coalesce(s.worker, ow.worker) AS worker,
           lag(s.ts_s) OVER g AS t0_s, lag(s.energy_mj) OVER g AS e0_mj, lag(s.power_w) OVER g AS p0_w,
           lag(s.uuid) OVER g AS uuid0, lag(coalesce(s.worker, ow.worker)) OVER g AS worker0,
           {gap_threshold_sql("min(s.ts_s) OVER a", "max(s.ts_s) OVER a", "count(*) OVER a")} AS gap_threshold_s
    FROM samp s LEFT JOIN owner_worker ow ON s.node = ow.node AND s.uuid = ow.uuid
    WINDOW g AS (PARTITION BY s.node, s.source, s.device, s."index" ORDER BY s.ts_s),
           a AS (PARTITION BY s.node, s.source, s.device, s."index")
),
pts AS (  -- where the cumulative functions are read: each sample's ts_s, and the interval's start
          -- again under the new uuid/worker where the owner changed between the two samples
    SELECT node, source, device, "index", ts_s AS t_s, 0 AS extra, uuid, worker FROM ordered
    UNION ALL
    SELECT node, source, device, "index", t0_s, 1, uuid, worker FROM ordered
    WHERE t0_s IS NOT NULL AND (uuid IS DISTINCT FROM uuid0 OR worker IS DISTINCT FROM worker0)
),
ptc AS (
    SELECT p.*,
           c.c_host + least(greatest(p.t_s - c.a_s, 0.0), c.hl_s) AS host_c,
           least(greatest(p.t_s - c.a_s - c.hl_s, 0.0), c.bl_s) AS busy_part,
           c.c_p, c.c_d, c.c_mp, c.c_md, c.f_p, c.f_d, c.f_mp, c.f_md
    FROM pts p ASOF LEFT JOIN segc c ON p.node = c.node AND p.uuid = c.uuid AND p.t_s >= c.a_s
),
ptv AS (
    SELECT p.node, p.source, p.device, p."index", p.t_s, p.extra,
           coalesce(p.host_c, 0.0) AS host_c,
           coalesce(p.c_p + p.f_p * p.busy_part, 0.0) AS p_c,
           coalesce(p.c_d + p.f_d * p.busy_part, 0.0) AS d_c,
           coalesce(p.c_mp + p.f_mp * p.busy_part, 0.0) AS mp_c,
           coalesce(p.c_md + p.f_md * p.busy_part, 0.0) AS md_c,
           coalesce(i.c_in + least(greatest(p.t_s - i.a_s, 0.0), i.len_s), 0.0) AS in_c
    FROM ptc p ASOF LEFT JOIN islc i ON p.node = i.node AND p.worker = i.worker AND p.t_s >= i.a_s
),
deltas AS (
    SELECT *, lag(host_c) OVER g AS host_0, lag(p_c) OVER g AS p_0, lag(d_c) OVER g AS d_0,
           lag(mp_c) OVER g AS mp_0, lag(md_c) OVER g AS md_0, lag(in_c) OVER g AS in_0
    FROM ptv
    WINDOW g AS (PARTITION BY node, source, device, "index" ORDER BY t_s, extra DESC)
),
attributed AS (  -- GPUs whose state is known: an owner worker, or iterations carrying their uuid
    SELECT DISTINCT node, source, device, "index" FROM ordered WHERE worker IS NOT NULL
)
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
       NULL::BIGINT AS k, {_power_sums("coalesce(o.sm_active_pct, o.gpu_util_pct)", aggregate=False)},
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
"""
    params = [*s_par, *w, *i_par, *w, *i_par, *w]
    return sql, params


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


def _clipped(D: str, where: str) -> str:
    """The window's iterations (``it``) clipped to their GPU's sampled time (``span``); host part
    ``[a_s, h_s]``, then GPU-busy ``[h_s, b_s]``; ``j0``, ``j1``: the cells of the two ends."""
    return f"""
    SELECT *, floor(a_s / {D})::BIGINT AS j0, floor(b_s / {D})::BIGINT AS j1 FROM (
        SELECT sp.g, it.worker, it.phase, it.pshare, greatest(it.start_s, sp.s0) AS a_s,
               least(it.end_s, sp.s1) AS b_s, it.end_s - it.busy_len_s AS h_s
        FROM it JOIN span sp ON it.node = sp.node AND it.uuid = sp.uuid
        WHERE it.end_s > sp.s0 AND it.start_s < sp.s1 AND {where})"""


def _raw_iteration_side(D: str, mixed: str, *, long_iterations: bool) -> tuple[str, str]:
    """The CTEs ``itagg`` (per GPU ``g`` and cell ``j``: ``p_s, d_s, mp_s, md_s, h_s``) and ``ow``
    (a GPU's owner worker from its iterations) of :func:`buckets_sql`, from the raw iterations."""
    long_pieces = (
        "\n          UNION ALL\n          SELECT g, j, mix, pshare * (len_s - host_s), (1.0 - pshare) * (len_s - host_s),"
        " host_s FROM itlong"
        if long_iterations
        else ""
    )
    side = f"""itc AS NOT MATERIALIZED ({_clipped(D, "TRUE")}),
ag AS (  -- per GPU, cell j0 and mixed or not, in one pass: the seconds of every iteration in its first
         -- cell and, of those crossing one cell boundary, in the next (longer ones: itlong)
    SELECT g, j0, mix,
           sum(pshare * (len1 - host1)) AS pb1, sum((1.0 - pshare) * (len1 - host1)) AS db1, sum(host1) AS h1,
           sum(pshare * (len2 - host2)) AS pb2, sum((1.0 - pshare) * (len2 - host2)) AS db2, sum(host2) AS h2
    FROM (SELECT g, j0, pshare, {mixed} AS mix,
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
    GROUP BY g, j0, mix
),
itlong AS (  -- the later pieces of iterations crossing two or more cell boundaries
    SELECT g, j, {mixed} AS mix, pshare,
           greatest(0.0, least(b_s, (j + 1) * {D}) - greatest(a_s, j * {D})) AS len_s,
           greatest(0.0, least(h_s, b_s, (j + 1) * {D}) - greatest(a_s, j * {D})) AS host_s
    FROM (SELECT *, unnest(range(j0 + 1, j1 + 1)) AS j
          FROM ({_clipped(D, f"floor(it.start_s / {D}) + 1 < floor(it.end_s / {D})")}) WHERE j1 >= j0 + 2)
),
itagg AS (  -- per GPU and cell: prefill, decode, mixed (prefill and decode work) and host seconds
    SELECT g, j,
           coalesce(sum(pb) FILTER (WHERE NOT mix), 0.0) AS p_s, coalesce(sum(db) FILTER (WHERE NOT mix), 0.0) AS d_s,
           coalesce(sum(pb) FILTER (WHERE mix), 0.0) AS mp_s, coalesce(sum(db) FILTER (WHERE mix), 0.0) AS md_s,
           sum(h) AS h_s
    FROM (SELECT g, j0 AS j, mix, pb1 AS pb, db1 AS db, h1 AS h FROM ag
          UNION ALL
          SELECT g, j0 + 1, mix, pb2, db2, h2 FROM ag WHERE pb2 <> 0.0 OR db2 <> 0.0 OR h2 <> 0.0{long_pieces})
    GROUP BY g, j
),
"""
    return (
        side,
        """ow AS (SELECT g, min(worker) AS worker FROM itc WHERE g IN (SELECT g FROM nodw) GROUP BY g),
""",
    )


def _rolled_iteration_side(
    D: str, mixed: str, r_pred: str, edge_seconds: Sequence[int] | None
) -> tuple[str, str]:
    """:func:`_raw_iteration_side`'s ``itagg`` and ``ow`` from the store's ``iteration_seconds``
    for each GPU's whole seconds (``[sec, sec + 1)`` inside its sampled time ``[s0, s1]``) and from
    the raw iterations for the rest: the part-seconds ``edges`` at the two ends (parameters: the
    rollup's node predicate ``r_pred``'s, then the window's first whole second and its end)."""
    if edge_seconds is not None and len(edge_seconds) <= MAX_EDGE_FILTERS:
        near = " OR ".join(
            f"(it.start_s < {float(j + 1)!r} AND it.end_s > {float(j)!r})" for j in sorted(edge_seconds)
        )
        edge_filter = f"({near})" if near else "FALSE"
    else:
        edge_filter = "TRUE"
    side = f"""edges AS (  -- each GPU's part-seconds: [lo, hi) at the ends of its sampled time in second j
    SELECT g, node, uuid, j, greatest(s0, j) AS lo, least(s1, j + 1) AS hi
    FROM (SELECT *, unnest(list_distinct([floor(s0)::BIGINT, floor(s1)::BIGINT])) AS j FROM span)
    WHERE NOT (j >= s0 AND j + 1 <= s1) AND least(s1, j + 1) > greatest(s0, j)
),
ite AS (  -- the raw iterations' pieces in those part-seconds
    SELECT e.g, floor(e.j / {D})::BIGINT AS j, it.worker, {mixed} AS mix, it.pshare,
           least(it.end_s, e.hi) - greatest(it.start_s, e.lo) AS len_s,
           greatest(0.0, least(it.end_s - it.busy_len_s, it.end_s, e.hi) - greatest(it.start_s, e.lo)) AS host_s
    FROM it JOIN edges e ON it.node = e.node AND it.uuid = e.uuid AND it.end_s > e.lo AND it.start_s < e.hi
    WHERE {edge_filter}
),
itr AS (  -- the whole seconds, from the rollup
    SELECT sp.g, floor(r.sec / {D})::BIGINT AS j, r.worker, r.prefill_s, r.decode_s, r.mixed_prefill_s,
           r.mixed_decode_s, r.host_s
    FROM iteration_seconds r JOIN span sp ON r.node = sp.node AND r.uuid = sp.uuid
    WHERE {r_pred} AND r.sec >= ? AND r.sec < ? AND r.sec >= sp.s0 AND r.sec + 1 <= sp.s1
),
itagg AS (  -- per GPU and cell: prefill, decode, mixed (prefill and decode work) and host seconds
    SELECT g, j, sum(p) AS p_s, sum(d) AS d_s, sum(mp) AS mp_s, sum(md) AS md_s, sum(h) AS h_s
    FROM (SELECT g, j, prefill_s AS p, decode_s AS d, mixed_prefill_s AS mp, mixed_decode_s AS md, host_s AS h
          FROM itr
          UNION ALL
          SELECT g, j, CASE WHEN mix THEN 0.0 ELSE pshare * (len_s - host_s) END,
                 CASE WHEN mix THEN 0.0 ELSE (1.0 - pshare) * (len_s - host_s) END,
                 CASE WHEN mix THEN pshare * (len_s - host_s) ELSE 0.0 END,
                 CASE WHEN mix THEN (1.0 - pshare) * (len_s - host_s) ELSE 0.0 END, host_s
          FROM ite)
    GROUP BY g, j
),
"""
    owner = """ow AS (  -- the least worker whose iterations ran on the GPU in its sampled time
    SELECT g, min(worker) AS worker
    FROM (SELECT g, worker FROM itr WHERE prefill_s + decode_s + mixed_prefill_s + mixed_decode_s + host_s > 0
          UNION ALL
          SELECT g, worker FROM ite)
    WHERE g IN (SELECT g FROM nodw) GROUP BY g
),
"""
    return side, owner


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
    the columns of :func:`intervals_sql` (plus ``samples`` and ``excess_s``: iteration seconds beyond
    the bucket's sampled time, scaled away — overlapping iterations or clock skew); ``islands`` as
    there. Sample gaps are found on sub-cells
    of at most ``GAP_MIN_S`` (:func:`gap_subcells`) in the same grouped scan of the samples; a
    bucket holds the gaps that end in it as ``unsampled_s`` (see the module docstring).
    ``long_iterations=False`` leaves out the pieces of iterations crossing two or more cell
    boundaries: right only when none is longer than half a bucket (:func:`has_long_iterations`),
    and the iterations are then scanned once.

    ``rollup=True`` reads each GPU's whole seconds of iterations from the store's
    ``iteration_seconds`` (collector/store/iteration_seconds.py) and the raw iterations only in the
    part-seconds at the two ends of its sampled time: right only when that table covers the
    window's nodes (:func:`collector.store.iteration_seconds.covers`) and ``bucket_s`` is a whole
    number of seconds (:func:`use_rollup`). ``edge_seconds``: the seconds that hold a GPU's first or
    last sample (:func:`edge_seconds`), letting the raw read skip the rest of the rows; None: every
    row is joined to the ends."""
    if not (math.isfinite(bucket_s) and bucket_s > 0):
        raise ValueError(f"bucket_s must be a positive number of seconds, got {bucket_s!r}")
    if rollup and bucket_s != math.floor(bucket_s):
        raise ValueError(f"the iteration rollup needs a whole number of seconds per bucket, got {bucket_s!r}")
    D = repr(float(bucket_s))
    s_pred, s_par = window.node_sql("node")
    i_pred, i_par = window.node_sql("node")
    d_pred, d_par = window.node_sql("node")
    r_pred, r_par = window.node_sql("r.node")
    w = [window.start_s, window.end_s]
    mixed = "phase NOT IN ('prefill', 'decode')"

    m = gap_subcells(float(bucket_s))
    nb_window = """SELECT *, lag(l_ts) OVER g AS pl_ts, lag(l_e) OVER g AS pl_e, lag(n_e = samples) OVER g AS p_ok,
           lead(k) OVER g AS nk, lead(f_ts) OVER g AS nf_ts, lead(f_e) OVER g AS nf_e,
           lead(n_e = samples) OVER g AS n_ok, lead(lead_gap_s) OVER g AS n_gap_s
    FROM sbd WINDOW g AS (PARTITION BY node, source, device, "index" ORDER BY k)"""
    if m == 1:  # a cell is a sub-cell: its neighbours come from sg's window pass
        j, group_j, group_k, nb_body = "NULL", "", "", "SELECT * FROM sbd"
        gap_rows = "sbd WHERE lead_gap_s > 0"  # (sg is then read once: not materialised)
        cell_window = (
            ",\n                 lag(n_e = n) OVER w AS p_ok, lead(k) OVER w AS nk, lead(f_ts) OVER w AS nf_ts,"
            "\n                 lead(f_e) OVER w AS nf_e, lead(n_e = n) OVER w AS n_ok"
        )
        cell_neighbours = (
            ",\n           pl_ts, pl_e, p_ok, nk, nf_ts, nf_e, n_ok,"
            "\n           CASE WHEN nf_ts - l_ts > thr THEN nf_ts - l_ts ELSE 0.0 END AS n_gap_s"
        )
    else:
        j, group_j = f"floor(ts_s / {float(bucket_s) / m!r})::BIGINT", ", j"
        group_k = '\n    GROUP BY node, source, device, "index", k'
        nb_body, cell_window, cell_neighbours = nb_window, "", ""
        gap_rows = "sg WHERE gap_s > 0"  # every gap, also those inside a cell
    cell_cols = ",\n           ".join(f"{(agg if m > 1 else one)} AS {name}" for name, agg, one in _CELL_COLS)
    if rollup:
        iteration_side, owner = _rolled_iteration_side(D, mixed, r_pred, edge_seconds)
    else:
        iteration_side, owner = _raw_iteration_side(D, mixed, long_iterations=long_iterations)
    sql = f"""
WITH
sub AS (  -- per GPU × sub-cell (of at most GAP_MIN_S, inside cell k): sums, edge samples
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
          FROM {keyed_samples_sql(s_pred)} AND ts_s >= ? AND ts_s < ?)
    GROUP BY gpu_key, k{group_j}) x
    JOIN gpu_keys gk USING (gpu_key)  -- the GPU's identity joined to its cells, not to every sample
),
sg AS (  -- each sub-cell with the sample gap before it (0: none), its counter rise and integrated power
    SELECT *, CASE WHEN f_ts - pl_ts > thr THEN f_ts - pl_ts ELSE 0.0 END AS gap_s,
           CASE WHEN f_ts - pl_ts > thr AND f_e >= pl_e THEN (f_e - pl_e) / 1000.0 END AS gap_e_j,
           CASE WHEN f_ts - pl_ts > thr
                THEN coalesce((pl_w + p_sum / nullif(p_n, 0)) / 2.0, pl_w, p_sum / nullif(p_n, 0)) * (f_ts - pl_ts)
           END AS gap_pw_j
    FROM (SELECT *, lag(l_ts) OVER w AS pl_ts, lag(l_e) OVER w AS pl_e, lag(p_sum / nullif(p_n, 0)) OVER w AS pl_w,
                 {gap_threshold_sql("min(f_ts) OVER a", "max(l_ts) OVER a", "sum(n) OVER a")} AS thr{cell_window}
          FROM sub
          WINDOW w AS (PARTITION BY node, source, device, "index" ORDER BY f_ts),
                 a AS (PARTITION BY node, source, device, "index"))
),
sb AS (  -- per GPU × cell: edge samples, counter checks, mean activities, sample gaps
    SELECT node, source, device, "index", k, {cell_cols}{cell_neighbours}
    FROM sg{group_k}
),
dv AS (  -- devices rows with the time they hold until (the GPU's next row)
    SELECT *, lead(since_s, 1, 'infinity'::DOUBLE)
                  OVER (PARTITION BY node, source, device, "index" ORDER BY since_s) AS until_s
    FROM devices WHERE {d_pred}
),
sbd AS (  -- the device attributes (owner worker/role) in effect at the bucket's first sample
    SELECT b.*, d.uuid, d.parent_uuid, d.mig_instance_id, d.name, d.worker AS dev_worker, d.role
    FROM sb b LEFT JOIN dv d
      ON b.node = d.node AND b.source = d.source AND b.device = d.device
     AND b."index" IS NOT DISTINCT FROM d."index" AND b.f_ts >= d.since_s AND b.f_ts < d.until_s
    WHERE d.kind IS DISTINCT FROM 'cpu'  -- a CPU device is no GPU
),
nb AS (  -- each bucket with its neighbours' edge samples (one window pass, in sg where a cell is a sub-cell)
    {nb_body}
),
cov AS (  -- a bucket reaches from its cell's start (the first sample, for the first bucket; the last
          -- sample before the gap, for one after a gap) to the next bucket's (its last sample before a gap)
    SELECT *, CASE WHEN pl_ts IS NULL THEN f_ts WHEN lead_gap_s > 0 THEN pl_ts ELSE k * {D} END AS t0_s,
              CASE WHEN nk IS NULL OR n_gap_s > 0 THEN l_ts ELSE nk * {D} END AS t1_s,
              CASE WHEN n_gap_s > 0 THEN k + 1 ELSE coalesce(nk, k + 1) END AS k_end
    FROM nb
),
en AS (  -- the counter at the bucket's two ends, interpolated between the samples around them
    SELECT *,
           n_e = samples AND coalesce(p_ok, true) AND coalesce(n_ok, true) AS has_counter,
           CASE WHEN pl_ts IS NULL THEN f_e::DOUBLE
                WHEN f_e >= pl_e THEN pl_e + (f_e - pl_e) * (t0_s - pl_ts) / (f_ts - pl_ts) END AS e0,
           CASE WHEN nk IS NULL THEN l_e::DOUBLE
                WHEN nf_e >= l_e THEN l_e + (nf_e - l_e) * (t1_s - l_ts) / (nf_ts - l_ts) END AS e1
    FROM cov
),
it AS NOT MATERIALIZED ({iteration_rows_sql(i_pred, window.simulated)}),
span AS (  -- each GPU's sampled time; g: an integer id of the GPU, the iterations side's group key
    SELECT *, (row_number() OVER ())::INTEGER AS g
    FROM (SELECT node, uuid, min(f_ts) AS s0, max(l_ts) AS s1 FROM sbd WHERE uuid IS NOT NULL GROUP BY ALL)
),
gpart AS (  -- each sample gap's part [lo, hi] in its two edge cells k (the cells wholly inside it are in
            -- no bucket: the work there is not counted; the parts here are taken off their buckets)
    SELECT node, source, device, "index", k, greatest(gs, k * {D}) AS lo, least(ge, (k + 1) * {D}) AS hi
    FROM (SELECT node, source, device, "index", pl_ts AS gs, f_ts AS ge,
                 unnest(list_distinct([floor(pl_ts / {D})::BIGINT, k])) AS k
          FROM {gap_rows})
),
gpi AS (  -- with the GPU (uuid, and g) of the bucket holding the cell
    SELECT e.*, sp.g, b.uuid
    FROM gpart e
    JOIN sbd b ON e.node = b.node AND e.source = b.source AND e.device = b.device
     AND e."index" IS NOT DISTINCT FROM b."index" AND e.k = b.k
    JOIN span sp ON b.node = sp.node AND b.uuid = sp.uuid
),
{iteration_side}nodw AS (  -- GPUs with a bucket whose devices row names no worker
    SELECT DISTINCT sp.g FROM en e JOIN span sp ON e.node = sp.node AND e.uuid = sp.uuid WHERE e.dev_worker IS NULL
),
{owner}bk AS (
    SELECT e.*, sp.g, coalesce(e.dev_worker, ow.worker) AS worker
    FROM en e LEFT JOIN span sp ON e.node = sp.node AND e.uuid = sp.uuid LEFT JOIN ow ON sp.g = ow.g
),
bku AS (SELECT g, k, k_end FROM bk WHERE g IS NOT NULL),
itj AS (  -- a cell's iteration seconds go to the bucket holding the cell (a bucket absorbs empty cells,
          -- not those of a sample gap: [k_end, next k) is in no bucket)
    SELECT ia.*, b.k FROM itagg ia JOIN bku b ON ia.g = b.g AND ia.j = b.k
    UNION ALL
    SELECT ia.*, b.k
    FROM (SELECT * FROM itagg ia WHERE NOT EXISTS
              (SELECT 1 FROM bku b WHERE ia.g = b.g AND ia.j = b.k)) ia
    ASOF JOIN bku b ON ia.g = b.g AND ia.j >= b.k
    WHERE ia.j < b.k_end  -- after the GPU's last sample: in no bucket
),
itgap AS (  -- (taken off) the iteration seconds inside the sample gaps' parts of their edge cells
    SELECT g, k,
           -sum(CASE WHEN phase = 'prefill' THEN busy_s ELSE 0.0 END) AS p_s,
           -sum(CASE WHEN phase = 'decode' THEN busy_s ELSE 0.0 END) AS d_s,
           -sum(CASE WHEN {mixed} THEN pshare * busy_s ELSE 0.0 END) AS mp_s,
           -sum(CASE WHEN {mixed} THEN (1.0 - pshare) * busy_s ELSE 0.0 END) AS md_s,
           -sum(host_s) AS h_s
    FROM (SELECT c.g, c.k, it.phase, it.pshare,
                 greatest(0.0, least(it.end_s - it.busy_len_s, it.end_s, c.hi) - greatest(it.start_s, c.lo)) AS host_s,
                 greatest(0.0, least(it.end_s, c.hi) - greatest(it.start_s, c.lo, it.end_s - it.busy_len_s)) AS busy_s
          FROM it JOIN gpi c ON it.node = c.node AND it.uuid = c.uuid AND it.end_s > c.lo AND it.start_s < c.hi)
    GROUP BY g, k
),
ingap AS (  -- in-flight time inside the sample gaps' parts of their edge cells, per bucket holding the cell
    SELECT c.g, c.k, sum(greatest(0.0, least(i.b_s, c.hi) - greatest(i.a_s, c.lo))) AS in_gap_s
    FROM (SELECT e.*, b.g, b.worker
          FROM gpart e
          JOIN bk b ON e.node = b.node AND e.source = b.source AND e.device = b.device
           AND e."index" IS NOT DISTINCT FROM b."index" AND e.k = b.k
          WHERE b.worker IS NOT NULL) c
    JOIN {islands} i ON c.node = i.node AND c.worker = i.worker AND i.b_s > c.lo AND i.a_s < c.hi
    GROUP BY c.g, c.k
),
itb AS (  -- per GPU bucket: iteration seconds (less those inside its sample gaps), and the in-flight
          -- seconds inside its sample gaps
    SELECT g, k, sum(p_s) AS p_s, sum(d_s) AS d_s, sum(mp_s) AS mp_s, sum(md_s) AS md_s, sum(h_s) AS h_s,
           sum(in_gap_s) AS in_gap_s
    FROM (SELECT g, k, p_s, d_s, mp_s, md_s, h_s, 0.0 AS in_gap_s FROM itj
          UNION ALL
          SELECT g, k, p_s, d_s, mp_s, md_s, h_s, 0.0 FROM itgap
          UNION ALL
          SELECT g, k, 0.0, 0.0, 0.0, 0.0, 0.0, in_gap_s FROM ingap)
    GROUP BY g, k
),
isl AS (SELECT * FROM {islands}),  -- islands of "some request in flight" per worker
inagg AS (
    SELECT node, worker, j, sum(greatest(0.0, least(b_s, (j + 1) * {D}) - greatest(a_s, j * {D}))) AS in_s
    FROM (SELECT *, unnest(range(floor(a_s / {D})::BIGINT, floor(b_s / {D})::BIGINT + 1)) AS j FROM isl)
    GROUP BY node, worker, j
),
wk AS (  -- the buckets of a worker (all of a TP replica's GPUs share them)
    SELECT node, worker, k, max(k_end) AS k_end FROM bk WHERE worker IS NOT NULL
    GROUP BY node, worker, k
),
inb AS (
    SELECT node, worker, k, sum(in_s) AS in_s FROM (
        SELECT ia.*, w.k FROM inagg ia JOIN wk w ON ia.node = w.node AND ia.worker = w.worker AND ia.j = w.k
        UNION ALL
        SELECT ia.*, w.k
        FROM (SELECT * FROM inagg ia WHERE NOT EXISTS
                  (SELECT 1 FROM wk w WHERE ia.node = w.node AND ia.worker = w.worker AND ia.j = w.k)) ia
        ASOF JOIN wk w ON ia.node = w.node AND ia.worker = w.worker AND ia.j >= w.k
        WHERE ia.j < w.k_end)
    GROUP BY node, worker, k
),
attributed AS (SELECT DISTINCT node, source, device, "index" FROM bk WHERE worker IS NOT NULL),
st AS (
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
    WHERE b.t1_s > b.t0_s
),
sc AS (
    SELECT *, CASE WHEN raw_cov_s > sampled_s THEN sampled_s / raw_cov_s ELSE 1.0 END AS f,
              least(raw_cov_s, sampled_s) AS cov_s,
              parent_uuid IS NULL AND has_counter AND e_range = l_e - f_e AND e0 IS NOT NULL
                  AND e1 IS NOT NULL AS counter_ok
    FROM st
)
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
FROM sc"""
    params = [
        *s_par,
        *w,
        *d_par,
        *i_par,
        *w,
        *((*r_par, math.floor(window.start_s), window.end_s) if rollup else ()),
    ]
    return sql, params


#: The automatic bucket width keeps the bucket table near this many rows (GPU × bucket).
TARGET_BUCKETS = 250_000


def keyed_samples_sql(identity_pred: str) -> str:
    """``gpu_samples``' stored rows (``gpu_sample_rows``: ``gpu_key``, ``ts_s``, the metrics;
    collector/store/gpu_keys.py) of the GPUs whose identity (node, source, device, index, emulated)
    meets ``identity_pred``, as ``FROM`` text ending in a ``WHERE`` to add to with ``AND``. Grouping
    these by ``gpu_key`` and joining ``gpu_keys`` to the groups spares joining the identity to
    every sample (what the ``gpu_samples`` view does)."""
    return f"gpu_sample_rows WHERE gpu_key IN (SELECT gpu_key FROM gpu_keys WHERE {identity_pred})"


def choose_bucket_s(con: duckdb.DuckDBPyConnection, window: Window) -> float:
    """The bucket width for ``window``: the smallest of ``NICE_BUCKETS_S`` that is at least 1 s,
    twice the median sampling period of its GPUs (so that most cells hold a sample), and the sampled
    GPU-seconds / ``TARGET_BUCKETS`` (so that a fleet's hour stays a few hundred thousand rows)."""
    pred, par = window.node_sql("node")
    row = con.execute(
        f"""SELECT median(p), sum(span) FROM (
                SELECT (max(ts_s) - min(ts_s)) / (count(*) - 1) AS p, max(ts_s) - min(ts_s) AS span
                FROM {keyed_samples_sql(pred)} AND ts_s >= ? AND ts_s < ?
                GROUP BY gpu_key HAVING count(*) > 1)""",
        [*par, window.start_s, window.end_s],
    ).fetchone()
    period = float(row[0]) if row and row[0] is not None else 1.0
    gpu_s = float(row[1]) if row and row[1] is not None else 0.0
    want = max(1.0, 2.0 * period, gpu_s / TARGET_BUCKETS)
    return next((b for b in NICE_BUCKETS_S if b >= want), NICE_BUCKETS_S[-1])


def has_long_iterations(con: duckdb.DuckDBPyConnection, window: Window, bucket_s: float) -> bool:
    """Whether any iteration of ``window`` on a GPU is longer than half of ``bucket_s`` (one that may
    cross two or more cell boundaries: :func:`buckets_sql` then needs its ``long_iterations``
    pieces). One scan of two columns: cheaper than the pieces' second pass over the iterations."""
    pred, par = window.node_sql("node")
    row = con.execute(
        f"""SELECT 1 FROM iterations
            WHERE end_s - start_s > ? AND end_s > ? AND start_s < ? AND gpu_uuid IS NOT NULL AND {pred}
            LIMIT 1""",
        [bucket_s / 2.0, window.start_s, window.end_s, *par],
    ).fetchone()
    return row is not None


def use_rollup(con: duckdb.DuckDBPyConnection, window: Window, bucket_s: float) -> bool:
    """Whether :func:`buckets_sql` may read the store's iteration rollup for ``window``: the bucket is
    a whole number of seconds and the rollup holds every iteration of the window's nodes."""
    if bucket_s <= 0 or bucket_s != math.floor(bucket_s):
        return False
    try:
        pred, par = window.node_sql("node")
        return iteration_seconds.covers(con, pred, par)
    except duckdb.CatalogException:  # a file from before the rollup, opened read-only
        return False


def edge_seconds(con: duckdb.DuckDBPyConnection, window: Window) -> list[int]:
    """The distinct whole seconds holding a GPU's first or last sample in ``window`` (the only
    seconds where :func:`buckets_sql` reads raw iterations with the rollup). One grouped scan of the
    keyed samples."""
    pred, par = window.node_sql("node")
    rows = con.execute(
        f"""SELECT DISTINCT unnest([floor(a)::BIGINT, floor(b)::BIGINT]) FROM (
                SELECT min(ts_s) AS a, max(ts_s) AS b FROM {keyed_samples_sql(pred)} AND ts_s >= ? AND ts_s < ?
                GROUP BY gpu_key)""",
        [*par, window.start_s, window.end_s],
    ).fetchall()
    return sorted(int(r[0]) for r in rows)


class IntervalTable:
    """The window's intervals (``bucket_s=0``) or grid buckets (``bucket_s`` > 0; None: chosen by
    :func:`choose_bucket_s`) materialised once in a connection-local TEMP table — never in the
    store — for the analyses that read them; use as a context manager."""

    def __init__(self, con: duckdb.DuckDBPyConnection, window: Window, bucket_s: float | None = None) -> None:
        self.con = con
        self.window = window
        self.bucket_s = choose_bucket_s(con, window) if bucket_s is None else float(bucket_s)
        if not math.isfinite(self.bucket_s) or self.bucket_s < 0:
            raise ValueError(f"bucket_s must be 0 (sample intervals) or a positive width, got {bucket_s!r}")
        self.name = f"pl_intervals_{uuidlib.uuid4().hex[:12]}"

    @property
    def exact(self) -> bool:
        """True for sample intervals, False for grid buckets."""
        return self.bucket_s == 0

    def __enter__(self) -> IntervalTable:
        with registered_islands(self.con, self.window) as islands:
            sql, params = intervals_sql(self.window, islands) if self.exact else self._buckets_sql(islands)
            self.con.execute(f"CREATE TEMP TABLE {self.name} AS {sql}", params)
        return self

    def _buckets_sql(self, islands: str) -> tuple[str, list[Any]]:
        con, window, bucket_s = self.con, self.window, self.bucket_s
        if use_rollup(con, window, bucket_s):
            return buckets_sql(window, bucket_s, islands, rollup=True, edge_seconds=edge_seconds(con, window))
        return buckets_sql(
            window, bucket_s, islands, long_iterations=has_long_iterations(con, window, bucket_s)
        )

    def __exit__(self, *exc: object) -> None:
        self.con.execute(f"DROP TABLE IF EXISTS {self.name}")
