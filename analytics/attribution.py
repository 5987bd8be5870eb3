"""Phase attribution: where every GPU sample interval's time and energy went.

For every sample interval of a GPU — ``(previous ts_s, ts_s]`` of two consecutive ``gpu_samples`` rows
of one ``(node, source, device, index)``; the first sample of the window only opens the first
interval — the seconds the GPU spent in

* ``prefill_s`` / ``decode_s``: GPU-busy time of prefill-only / decode-only iterations,
* ``mixed_prefill_s`` / ``mixed_decode_s``: GPU-busy time of mixed iterations, split by their work
  (prefill tokens vs decode sequences: each is one row of the forward pass's matmuls),
* ``host_s``: engine host time inside an iteration with the GPU idle (simulated: the iteration's
  ``modeled_s − compute_s``, at its start; emulated: the step's wall time beyond ``modeled_s``),
* ``gap_s``: between iterations while the owning worker had a request in flight (host-bound),
* ``idle_s``: no work at all,

summing to ``interval_s``; and the interval's energy (the energy counter's rise; integrated power,
flagged ``estimated``, where the counter is missing or went backwards). A per-GPU power model
(non-negative least squares of interval energy on the state seconds) apportions each interval's
measured energy to its states, so the attributed energy sums to the measured energy exactly.

Everything runs as set-based SQL in DuckDB: the state seconds of an interval are differences of
cumulative state-time functions evaluated at the interval's two ends by ``ASOF`` joins (no
interval × iteration product), and the per-GPU / pool / hour tables are SQL aggregates; only
aggregates reach Python. Formulas and their sources: docs/analytics/attribution.md.
"""

from __future__ import annotations

import math
import uuid as uuidlib
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import duckdb
import numpy as np
import pandas as pd

from analytics.trust import ESTIMATED, HOST_BOUND, Trust
from analytics.window import Window

# Fine states of an interval (seconds), in report order; they sum to interval_s on attributed GPUs.
STATES: tuple[str, ...] = (
    "prefill_s",
    "decode_s",
    "mixed_prefill_s",
    "mixed_decode_s",
    "host_s",
    "gap_s",
    "idle_s",
)
# The power model's regressors: each fine state maps to one coefficient (W).
MODEL_TERMS: tuple[str, ...] = ("prefill", "decode", "host_bound", "idle")
_TERM_OF: dict[str, str] = {
    "prefill_s": "prefill",
    "mixed_prefill_s": "prefill",
    "decode_s": "decode",
    "mixed_decode_s": "decode",
    "host_s": "host_bound",
    "gap_s": "host_bound",
    "idle_s": "idle",
}
_GPU_KEY = ("node", "source", "device", "index")


# -- the per-interval query ------------------------------------------------------------------------


def _intervals_sql(window: Window) -> tuple[str, list[Any]]:
    """SQL (and its parameters) yielding one row per sample interval of the window's GPUs."""
    s_pred, s_par = window.node_sql("s.node")
    i_pred, i_par = window.node_sql("node")
    r_pred, r_par = window.node_sql("node")
    w = [window.start_s, window.end_s]
    sql = f"""
WITH
samp AS (  -- the window's samples with the device attributes (owner worker/role) in effect then
    SELECT s.node, s.source, s.device, s."index", s.ts_s, s.emulated,
           s.sm_active_pct, s.gpu_util_pct, s.dram_active_pct, s.power_w, s.energy_mj, s.host_bound_pct,
           d.uuid, d.parent_uuid, d.mig_instance_id, d.name, d.worker, d.role
    FROM gpu_samples s ASOF LEFT JOIN devices d
      ON s.node = d.node AND s.source = d.source AND s.device = d.device
     AND s."index" IS NOT DISTINCT FROM d."index" AND s.ts_s >= d.since_s
    WHERE {s_pred} AND s.ts_s >= ? AND s.ts_s < ?
),
it AS (  -- iterations of the window with their GPU-busy seconds (rule: docs/analytics/attribution.md)
    SELECT node, gpu_uuid AS uuid, worker, start_s, end_s, phase, lag_s,
           end_s - start_s AS dur_s,
           least(end_s - start_s, greatest(0.0,
               CASE WHEN trust_label(node, source) = 'simulated' AND compute_s IS NOT NULL THEN compute_s
                    WHEN modeled_s IS NOT NULL THEN modeled_s
                    ELSE end_s - start_s END)) AS busy_len_s,
           CASE phase WHEN 'prefill' THEN 1.0 WHEN 'decode' THEN 0.0
                ELSE coalesce(prefill_tokens::DOUBLE
                              / nullif(coalesce(prefill_tokens, 0) + coalesce(decode_seqs, 0), 0), 0.5)
           END AS pshare,
           max(end_s) OVER (PARTITION BY node, gpu_uuid ORDER BY start_s, end_s
                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end_s
    FROM iterations
    WHERE {i_pred} AND gpu_uuid IS NOT NULL AND end_s > start_s AND end_s > ? AND start_s < ?
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
rspan AS (  -- a request's time on each worker it used (rule: docs/analytics/attribution.md)
    SELECT node, prefill_worker AS worker, arrival_s AS a_s,
           CASE WHEN decode_worker IS NULL OR decode_worker = prefill_worker
                THEN coalesce(finish_s, first_token_s, prefill_end_s, arrival_s)
                ELSE coalesce(kv_transfer_start_s, prefill_end_s, first_token_s, finish_s, arrival_s) END AS b_s
    FROM requests WHERE {r_pred} AND prefill_worker IS NOT NULL
    UNION ALL
    SELECT node, decode_worker, coalesce(kv_transfer_end_s, first_token_s, prefill_end_s, arrival_s),
           coalesce(finish_s, first_token_s, prefill_end_s, arrival_s)
    FROM requests WHERE {r_pred} AND decode_worker IS NOT NULL
      AND decode_worker IS DISTINCT FROM prefill_worker
),
rs AS (
    SELECT *, max(b_s) OVER (PARTITION BY node, worker ORDER BY a_s, b_s
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_b_s
    FROM rspan WHERE b_s > a_s AND b_s > ? AND a_s < ?
),
isl AS (  -- islands of "some request in flight" per worker (union of the spans)
    SELECT node, worker, min(a_s) AS a_s, max(b_s) AS b_s
    FROM (SELECT *, sum(CASE WHEN prev_b_s IS NULL OR a_s > prev_b_s THEN 1 ELSE 0 END)
                        OVER (PARTITION BY node, worker ORDER BY a_s, b_s) AS island FROM rs)
    GROUP BY node, worker, island
),
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
           lag(s.uuid) OVER g AS uuid0, lag(coalesce(s.worker, ow.worker)) OVER g AS worker0
    FROM samp s LEFT JOIN owner_worker ow ON s.node = ow.node AND s.uuid = ow.uuid
    WINDOW g AS (PARTITION BY s.node, s.source, s.device, s."index" ORDER BY s.ts_s)
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
       CASE WHEN a.node IS NOT NULL THEN d.p_c - d.p_0 END AS prefill_s,
       CASE WHEN a.node IS NOT NULL THEN d.d_c - d.d_0 END AS decode_s,
       CASE WHEN a.node IS NOT NULL THEN d.mp_c - d.mp_0 END AS mixed_prefill_s,
       CASE WHEN a.node IS NOT NULL THEN d.md_c - d.md_0 END AS mixed_decode_s,
       CASE WHEN a.node IS NOT NULL THEN d.host_c - d.host_0 END AS host_s,
       CASE WHEN a.node IS NOT NULL THEN least(greatest(d.in_c - d.in_0 - busy, 0.0),
                                              greatest(o.ts_s - o.t0_s - busy, 0.0)) END AS gap_s,
       CASE WHEN a.node IS NOT NULL THEN greatest(o.ts_s - o.t0_s - busy, 0.0)
                 - least(greatest(d.in_c - d.in_0 - busy, 0.0), greatest(o.ts_s - o.t0_s - busy, 0.0))
       END AS idle_s,
       coalesce(o.sm_active_pct, o.gpu_util_pct) AS sm_active_pct,
       CASE WHEN o.sm_active_pct IS NOT NULL THEN 'sm_active'
            WHEN o.gpu_util_pct IS NOT NULL THEN 'gpu_util' END AS sm_source,
       o.gpu_util_pct, o.dram_active_pct, o.power_w,
       CASE WHEN o.parent_uuid IS NOT NULL THEN NULL
            WHEN o.energy_mj IS NOT NULL AND o.e0_mj IS NOT NULL AND o.energy_mj >= o.e0_mj
                THEN (o.energy_mj - o.e0_mj) / 1000.0
            WHEN o.power_w IS NOT NULL
                THEN (o.power_w + coalesce(o.p0_w, o.power_w)) / 2.0 * (o.ts_s - o.t0_s) END AS energy_j,
       CASE WHEN o.parent_uuid IS NOT NULL THEN 'mig-parent'
            WHEN o.energy_mj IS NOT NULL AND o.e0_mj IS NOT NULL AND o.energy_mj >= o.e0_mj THEN 'counter'
            WHEN o.power_w IS NOT NULL AND o.energy_mj IS NOT NULL AND o.e0_mj IS NOT NULL
                THEN 'integrated-reset'
            WHEN o.power_w IS NOT NULL THEN 'integrated-no-counter' END AS energy_source,
       trust_label(o.node, o.source, o.emulated) AS trust,
       coalesce(o.host_bound_pct > 0, false) AS host_bound
FROM ordered o
JOIN (SELECT *, (p_c - p_0) + (d_c - d_0) + (mp_c - mp_0) + (md_c - md_0) + (host_c - host_0) AS busy
      FROM deltas WHERE extra = 0) d
  ON o.node = d.node AND o.source = d.source AND o.device = d.device
 AND o."index" IS NOT DISTINCT FROM d."index" AND o.ts_s = d.t_s
LEFT JOIN attributed a
  ON o.node = a.node AND o.source = a.source AND o.device = a.device AND o."index" IS NOT DISTINCT FROM a."index"
WHERE o.t0_s IS NOT NULL AND o.ts_s > o.t0_s
"""
    params = [*s_par, *w, *i_par, *w, *r_par, *r_par, *w, *i_par, *w]
    return sql, params


def gpu_intervals(con: duckdb.DuckDBPyConnection, window: Window) -> pd.DataFrame:
    """One row per GPU sample interval of ``window``: the GPU (node, source, device, index, uuid,
    parent_uuid, mig_instance_id, name, worker, role), ``t0_s``/``t1_s``/``interval_s``/``hour_s``,
    ``attributed`` (whether the GPU's work is known), the state seconds ``prefill_s``, ``decode_s``,
    ``mixed_prefill_s``, ``mixed_decode_s``, ``host_s``, ``gap_s``, ``idle_s`` (NULL where not
    attributed), ``sm_active_pct`` (utilization % where the source has no SM activity:
    ``sm_source`` says which), ``gpu_util_pct``, ``dram_active_pct``, ``power_w``, ``energy_j`` and
    ``energy_source`` (``counter``, ``integrated-reset``, ``integrated-no-counter``, ``mig-parent``:
    a MIG instance, whose energy is its physical GPU's), ``trust`` and ``host_bound``.

    Per-interval rows are for inspection and small windows; the tables of :func:`phase_breakdown`
    are aggregated in SQL and do not go through this DataFrame."""
    sql, params = _intervals_sql(window)
    return con.execute(sql + ' ORDER BY o.node, o.source, o.device, o."index", o.ts_s', params).df()


# -- the power model ------------------------------------------------------------------------------


@dataclass(slots=True)
class PowerFit:
    """Non-negative least squares fit of interval energy (J) on the state seconds of one GPU:
    ``energy_j ≈ Σ coef_w[term] × seconds[term]`` over ``MODEL_TERMS``."""

    coef_w: dict[str, float | None]
    r2: float | None
    intervals: int
    rmse_j: float | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "coef_w": dict(self.coef_w),
            "r2": self.r2,
            "intervals": self.intervals,
            "rmse_j": self.rmse_j,
            "notes": list(self.notes),
        }


def nnls_gram(gram: np.ndarray, xty: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares from the normal equations: the minimiser of
    ``b'Gb − 2b'X'y`` over ``b ≥ 0``, found by trying every support (the NNLS optimum is the
    unconstrained least-squares solution on its support, Lawson & Hanson 1974); for the handful of
    terms here that is at most 2^k small solves."""
    k = len(xty)
    best = np.zeros(k)
    best_obj = 0.0
    for r in range(1, k + 1):
        for support in combinations(range(k), r):
            idx = list(support)
            g = gram[np.ix_(idx, idx)]
            sol, *_ = np.linalg.lstsq(g, xty[idx], rcond=None)
            if np.any(sol < -1e-12):
                continue
            b = np.zeros(k)
            b[idx] = np.clip(sol, 0.0, None)
            obj = float(b @ gram @ b - 2.0 * b @ xty)
            if obj < best_obj - 1e-12 * max(1.0, abs(best_obj)):
                best, best_obj = b, obj
    return best


def _fit(stats: dict[str, float], terms: tuple[str, ...]) -> PowerFit:
    """The power fit of one GPU from its SQL aggregates (sums of products of the regressors)."""
    n = int(stats["n"])
    notes: list[str] = []
    if n == 0:
        return PowerFit({t: None for t in terms}, None, 0, None, ["no interval with a known energy"])
    k = len(terms)
    gram = np.array([[stats[f"x{i}x{j}" if i <= j else f"x{j}x{i}"] for j in range(k)] for i in range(k)])
    xty = np.array([stats[f"x{i}y"] for i in range(k)])
    present = [i for i in range(k) if gram[i, i] > 1e-12]
    b = np.zeros(k)
    if present:
        b[present] = nnls_gram(gram[np.ix_(present, present)], xty[present])
    coef: dict[str, float | None] = {}
    for i, t in enumerate(terms):
        if i in present:
            coef[t] = float(b[i])
        else:
            coef[t] = None
            notes.append(f"no {t} time in the window: its power is not fitted")
    yy, sy = stats["yy"], stats["sy"]
    sse = max(0.0, yy - 2.0 * float(b @ xty) + float(b @ gram @ b))
    sst = yy - sy * sy / n
    r2 = 1.0 - sse / sst if sst > 1e-12 and n > 1 else None
    if r2 is None:
        notes.append("R² undefined: interval energies do not vary")
    return PowerFit(coef, r2, n, math.sqrt(sse / n), notes)


# -- the breakdown --------------------------------------------------------------------------------


@dataclass(slots=True)
class PhaseBreakdown:
    """Where the window's GPU time and energy went.

    ``per_gpu``: one row per GPU (node, source, device, index, uuid, name, role, worker); ``per_pool``:
    one row per role (pool); ``per_hour``: one row per hour and role. Each has ``interval_s`` (GPU
    seconds covered by sample intervals), the state seconds (``STATES``), their fractions
    (``frac_<state>``, summing to 1 on attributed time), ``energy_j`` (measured),
    ``energy_<state>_j`` (apportioned by the power model; they sum to ``energy_j``),
    ``energy_estimated_j`` (of ``energy_j``, integrated from power) and ``unattributed_s`` /
    ``energy_unattributed_j`` (GPUs with no serving telemetry). ``fits``: the power model per GPU
    (keyed ``node|source|device|index``). ``missing``: what could not be computed, and why.
    ``raw``: the GPU × role × hour sums all tables come from (with the idle-split sums that
    :func:`analytics.bimodal.idle_split` reads); not part of ``to_dict``."""

    window: Window
    per_gpu: pd.DataFrame
    per_pool: pd.DataFrame
    per_hour: pd.DataFrame
    fits: dict[str, PowerFit]
    trust: Trust
    missing: list[str] = field(default_factory=list)
    raw: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": self.window.describe(),
            "per_gpu": _records(self.per_gpu),
            "per_pool": _records(self.per_pool),
            "per_hour": _records(self.per_hour),
            "fits": {k: v.to_dict() for k, v in self.fits.items()},
            "trust": self.trust.to_dict(),
            "missing": list(self.missing),
        }


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for rec in df.to_dict(orient="records"):
        out.append({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in rec.items()})
    return out


def gpu_key(node: str, source: str, device: str, index: int | None) -> str:
    """The key of a GPU in ``PhaseBreakdown.fits``: ``node|source|device|index``."""
    return f"{node}|{source}|{device}|{'' if index is None or pd.isna(index) else int(index)}"


class IntervalTable:
    """The window's intervals materialised once in a connection-local TEMP table (never the store),
    for the analyses that read them more than once; use as a context manager."""

    def __init__(self, con: duckdb.DuckDBPyConnection, window: Window) -> None:
        self.con = con
        self.window = window
        self.name = f"pl_intervals_{uuidlib.uuid4().hex[:12]}"

    def __enter__(self) -> IntervalTable:
        sql, params = _intervals_sql(self.window)
        self.con.execute(f"CREATE TEMP TABLE {self.name} AS {sql}", params)
        return self

    def __exit__(self, *exc: object) -> None:
        self.con.execute(f"DROP TABLE IF EXISTS {self.name}")


def _fit_stats_sql(table: str) -> str:
    """Per GPU: the count, Σy, Σy² and the sums of products of the regressors (x_i x_j, x_i y) of
    the intervals with a known energy on attributed time — all the least-squares fit needs."""
    xs = [
        "coalesce(prefill_s, 0) + coalesce(mixed_prefill_s, 0)",
        "coalesce(decode_s, 0) + coalesce(mixed_decode_s, 0)",
        "coalesce(host_s, 0) + coalesce(gap_s, 0)",
        "coalesce(idle_s, 0)",
    ]
    ok = "FILTER (WHERE attributed AND energy_j IS NOT NULL)"
    parts = []
    for i in range(len(xs)):
        for j in range(i, len(xs)):
            parts.append(f"sum(({xs[i]}) * ({xs[j]})) {ok} AS x{i}x{j}")
        parts.append(f"sum(({xs[i]}) * energy_j) {ok} AS x{i}y")
    return f"""
SELECT node, source, device, "index", count(*) {ok} AS n, sum(energy_j * energy_j) {ok} AS yy,
       sum(energy_j) {ok} AS sy, bool_or(attributed) AS attributed, {", ".join(parts)}
FROM {table}
GROUP BY ALL
"""


def _fits(con: duckdb.DuckDBPyConnection, table: str) -> dict[str, PowerFit]:
    df = con.execute(_fit_stats_sql(table)).df()
    fits: dict[str, PowerFit] = {}
    for rec in df.to_dict(orient="records"):
        if not rec["attributed"]:
            continue  # no states to fit on: its energy is reported as unattributed
        stats = {
            k: float(v) if v is not None and not pd.isna(v) else 0.0
            for k, v in rec.items()
            if k not in (*_GPU_KEY, "attributed")
        }
        fits[gpu_key(rec["node"], rec["source"], rec["device"], rec["index"])] = _fit(stats, MODEL_TERMS)
    return fits


def _coef_frame(fits: dict[str, PowerFit]) -> pd.DataFrame:
    rows = []
    for key, fit in fits.items():
        rows.append({"gkey": key, **{f"w_{t}": (fit.coef_w[t] or 0.0) for t in MODEL_TERMS}})
    cols = ["gkey", *[f"w_{t}" for t in MODEL_TERMS]]
    return pd.DataFrame(rows, columns=cols).astype({c: "float64" for c in cols[1:]})


# GPU-time categories (idle split): they partition attributed time, as the states do.
CATEGORIES: tuple[str, ...] = (
    "productive_prefill",
    "stranded_bandwidth",
    "productive_decode",
    "stranded_compute",
    "host_bound",
    "idle",
)


def _aggregate_sql(table: str) -> str:
    """Per GPU × role × hour sums: state seconds, the apportioned energy of every state, the
    GPU-time categories (time and energy) and the sums behind the utilization − SM activity gap."""
    weights = " + ".join(f"w_{_TERM_OF[s]} * coalesce({s}, 0)" for s in STATES)
    e_cols = ", ".join(
        f"CASE WHEN attributed AND energy_j IS NOT NULL THEN energy_j * "
        f"CASE WHEN wsum > 0 THEN w_{_TERM_OF[s]} * coalesce({s}, 0) / wsum "
        f"ELSE coalesce({s}, 0) / interval_s END END AS e_{s[:-2]}"
        for s in STATES
    )
    e_parts = ", ".join(f"sum(e_{s[:-2]}) AS energy_{s[:-2]}_j" for s in STATES)
    s_parts = ", ".join(f"sum({s}) AS {s}" for s in STATES)
    return f"""
WITH iv AS (
    SELECT i.*, c.* EXCLUDE (gkey), coalesce({weights}, 0.0) AS wsum,
           coalesce(i.prefill_s, 0) + coalesce(i.mixed_prefill_s, 0) AS p_s,
           coalesce(i.decode_s, 0) + coalesce(i.mixed_decode_s, 0) AS d_s
    FROM (SELECT *, node || '|' || source || '|' || device || '|' || coalesce("index"::VARCHAR, '') AS gkey
          FROM {table}) i
    LEFT JOIN pl_coef c ON i.gkey = c.gkey
),
ev AS (  -- per interval: apportioned state energies; SM / DRAM activity during GPU-busy time
    SELECT *, {e_cols},
           CASE WHEN p_s + d_s > 0 AND sm_active_pct IS NOT NULL THEN least(1.0, sm_active_pct / 100.0 * interval_s / (p_s + d_s)) END AS sm_busy,
           CASE WHEN p_s + d_s > 0 AND dram_active_pct IS NOT NULL THEN least(1.0, dram_active_pct / 100.0 * interval_s / (p_s + d_s)) END AS dram_busy
    FROM iv
),
cv AS (
    SELECT *, coalesce(e_prefill, 0) + coalesce(e_mixed_prefill, 0) AS ep_j,
           coalesce(e_decode, 0) + coalesce(e_mixed_decode, 0) AS ed_j
    FROM ev
)
SELECT node, source, device, "index", any_value(uuid) AS uuid, any_value(name) AS name,
       coalesce(role, 'unknown') AS role, any_value(worker) AS worker, hour_s,
       count(*) AS intervals, sum(interval_s) AS interval_s,
       sum(CASE WHEN attributed THEN interval_s ELSE 0 END) AS attributed_s,
       sum(CASE WHEN NOT attributed THEN interval_s ELSE 0 END) AS unattributed_s,
       {s_parts},
       sum(energy_j) AS energy_j,
       sum(CASE WHEN energy_source LIKE 'integrated%' THEN energy_j ELSE 0 END) AS energy_estimated_j,
       sum(CASE WHEN NOT attributed THEN energy_j ELSE 0 END) AS energy_unattributed_j,
       {e_parts},
       sum(p_s * coalesce(dram_busy, 1.0)) FILTER (WHERE attributed) AS productive_prefill_s,
       sum(p_s * (1.0 - dram_busy)) FILTER (WHERE attributed) AS stranded_bandwidth_s,
       sum(d_s * coalesce(sm_busy, 1.0)) FILTER (WHERE attributed) AS productive_decode_s,
       sum(d_s * (1.0 - sm_busy)) FILTER (WHERE attributed) AS stranded_compute_s,
       sum(coalesce(host_s, 0) + coalesce(gap_s, 0)) FILTER (WHERE attributed) AS host_bound_s,
       sum(ep_j * coalesce(dram_busy, 1.0)) FILTER (WHERE attributed) AS energy_productive_prefill_j,
       sum(ep_j * (1.0 - dram_busy)) FILTER (WHERE attributed) AS energy_stranded_bandwidth_j,
       sum(ed_j * coalesce(sm_busy, 1.0)) FILTER (WHERE attributed) AS energy_productive_decode_j,
       sum(ed_j * (1.0 - sm_busy)) FILTER (WHERE attributed) AS energy_stranded_compute_j,
       sum(coalesce(e_host, 0) + coalesce(e_gap, 0)) FILTER (WHERE attributed) AS energy_host_bound_j,
       sum(CASE WHEN sm_busy IS NULL THEN d_s ELSE 0 END) FILTER (WHERE attributed) AS decode_activity_unknown_s,
       sum(CASE WHEN dram_busy IS NULL THEN p_s ELSE 0 END) FILTER (WHERE attributed) AS prefill_activity_unknown_s,
       sum(interval_s) FILTER (WHERE sm_source = 'sm_active' AND gpu_util_pct IS NOT NULL) AS both_s,
       sum(gpu_util_pct * interval_s) FILTER (WHERE sm_source = 'sm_active' AND gpu_util_pct IS NOT NULL) AS util_pct_s,
       sum(sm_active_pct * interval_s) FILTER (WHERE sm_source = 'sm_active' AND gpu_util_pct IS NOT NULL) AS sm_pct_s,
       count(*) FILTER (WHERE energy_j IS NULL AND energy_source IS DISTINCT FROM 'mig-parent') AS no_energy_intervals,
       count(*) FILTER (WHERE energy_source = 'integrated-reset') AS counter_resets,
       count(*) FILTER (WHERE energy_source = 'integrated-no-counter') AS no_counter_intervals,
       count(*) FILTER (WHERE energy_source = 'mig-parent') AS mig_instance_intervals,
       count(*) FILTER (WHERE sm_source = 'gpu_util') AS util_fallback_intervals,
       count(*) FILTER (WHERE host_bound) AS host_bound_intervals,
       list(DISTINCT trust) AS trusts
FROM cv
GROUP BY node, source, device, "index", coalesce(role, 'unknown'), hour_s
"""


_SUM_COLS = (
    "intervals",
    "interval_s",
    "attributed_s",
    "unattributed_s",
    *STATES,
    "energy_j",
    "energy_estimated_j",
    "energy_unattributed_j",
    *[f"energy_{s[:-2]}_j" for s in STATES],
)
# sums kept for the idle split (IdleSplit), not shown in the breakdown's tables
CATEGORY_SUM_COLS = (
    *[f"{c}_s" for c in CATEGORIES if c != "idle"],
    *[f"energy_{c}_j" for c in CATEGORIES if c != "idle"],
    "decode_activity_unknown_s",
    "prefill_activity_unknown_s",
    "both_s",
    "util_pct_s",
    "sm_pct_s",
)


def _finish(df: pd.DataFrame) -> pd.DataFrame:
    """Add the state fractions (of attributed seconds; NaN where nothing is attributed)."""
    df = df.copy()
    denom = df["attributed_s"].where(df["attributed_s"] > 0)
    for s in STATES:
        df[f"frac_{s[:-2]}"] = df[s] / denom
    return df


def _lagged_iterations(con: duckdb.DuckDBPyConnection, window: Window) -> int:
    pred, par = window.node_sql("node")
    row = con.execute(
        f"SELECT count(*) FROM iterations WHERE {pred} AND lag_s > 0 AND end_s > ? AND start_s < ?",
        [*par, window.start_s, window.end_s],
    ).fetchone()
    return int(row[0]) if row else 0


def _iteration_issues(con: duckdb.DuckDBPyConnection, window: Window) -> dict[str, int]:
    """Counts of bad iteration rows: overlapping ones on one GPU, ones outside their GPU's samples
    (clock skew between the engine and the sampler), ones with no GPU uuid."""
    i_pred, i_par = window.node_sql("i.node")
    s_pred, s_par = window.node_sql("s.node")
    w = [window.start_s, window.end_s]
    row = con.execute(
        f"""
WITH it AS (
    SELECT i.*, max(end_s) OVER (PARTITION BY node, gpu_uuid ORDER BY start_s, end_s
                                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end_s
    FROM iterations i WHERE {i_pred} AND i.end_s > ? AND i.start_s < ?
),
span AS (
    SELECT s.node, d.uuid, min(s.ts_s) AS t0, max(s.ts_s) AS t1
    FROM gpu_samples s ASOF JOIN devices d
      ON s.node = d.node AND s.source = d.source AND s.device = d.device
     AND s."index" IS NOT DISTINCT FROM d."index" AND s.ts_s >= d.since_s
    WHERE {s_pred} AND s.ts_s >= ? AND s.ts_s < ? AND d.uuid IS NOT NULL
    GROUP BY ALL
)
SELECT count(*) FILTER (WHERE it.prev_end_s > it.start_s + 1e-9 AND it.gpu_uuid IS NOT NULL),
       count(*) FILTER (WHERE it.gpu_uuid IS NULL),
       count(*) FILTER (WHERE sp.uuid IS NOT NULL AND (it.end_s < sp.t0 - 1.0 OR it.start_s > sp.t1 + 1.0)),
       count(*) FILTER (WHERE it.end_s < it.start_s),
       count(DISTINCT it.gpu_uuid) FILTER (WHERE sp.uuid IS NULL AND it.gpu_uuid IS NOT NULL),
       count(*) FILTER (WHERE sp.uuid IS NULL AND it.gpu_uuid IS NOT NULL)
FROM it LEFT JOIN span sp ON it.node = sp.node AND it.gpu_uuid = sp.uuid
""",
        [*i_par, *w, *s_par, *w],
    ).fetchone()
    keys = ("overlapping", "no_uuid", "outside_samples", "negative", "unsampled_gpus", "unsampled_iterations")
    return dict(zip(keys, (int(v or 0) for v in row), strict=True)) if row else dict.fromkeys(keys, 0)


def _issue_notes(issues: dict[str, int]) -> list[str]:
    """What the bad iteration rows counted by :func:`_iteration_issues` mean for the result."""
    notes: list[str] = []
    if issues["overlapping"]:
        notes.append(
            f"{issues['overlapping']} iterations overlap an earlier one on the same GPU: clipped to "
            "the time after it (each GPU second counted once)"
        )
    if issues["no_uuid"]:
        notes.append(f"{issues['no_uuid']} iterations carry no gpu_uuid: not attributed to any GPU")
    if issues["unsampled_gpus"]:
        notes.append(
            f"{issues['unsampled_gpus']} GPU uuid(s) ran {issues['unsampled_iterations']} iterations in the "
            "window but have no samples in it: their time and energy are not in any interval"
        )
    if issues["negative"]:
        notes.append(f"{issues['negative']} iterations end before they start: ignored")
    if issues["outside_samples"]:
        notes.append(
            f"{issues['outside_samples']} iterations lie more than 1 s outside their GPU's samples "
            "(clock skew between engine and sampler?): they fall in no interval"
        )
    return notes


def _trust_from(df: pd.DataFrame, trust: Trust, lagged: int) -> None:
    labels = {t for ts in df["trusts"] for t in (ts if ts is not None else [])}
    for label in sorted(labels):
        trust.add(label)
    if df["energy_estimated_j"].sum() > 0:
        trust.add(
            ESTIMATED,
            "energy integrated from power (trapezoid rule) where the energy counter is missing or went "
            f"backwards: {df['energy_estimated_j'].sum():.1f} J of {df['energy_j'].sum():.1f} J",
        )
    if (df["util_fallback_intervals"] > 0).any():
        trust.add(
            ESTIMATED,
            f"SM activity missing on {int(df['util_fallback_intervals'].sum())} intervals: utilization % "
            "used instead (it reads busy whenever a kernel runs, so it overstates SM activity)",
        )
    if (df["host_bound_intervals"] > 0).any() or lagged > 0:
        trust.add(
            HOST_BOUND,
            f"{int(df['host_bound_intervals'].sum())} sample intervals with host_bound_pct > 0, "
            f"{lagged} iterations with lag_s > 0: the emulated GPU's host could not keep pace",
        )
    trust.notes.append(
        "energy apportioned to states by a per-GPU non-negative least-squares power model; the "
        "apportioned energy sums to the measured energy"
    )


def phase_breakdown(
    con: duckdb.DuckDBPyConnection, window: Window, *, intervals: IntervalTable | None = None
) -> PhaseBreakdown:
    """Time and energy of the window's GPUs by state, per GPU, per pool (role) and per hour, with
    the per-GPU power fits and the trust labels. Aggregation runs in SQL over a TEMP table of the
    intervals (``intervals``: one already open on ``con`` for this window, shared by several
    analyses; else one is made and dropped); only per GPU × role × hour sums reach Python."""
    if intervals is not None:
        return _breakdown_from(con, window, intervals.name)
    with IntervalTable(con, window) as t:
        return _breakdown_from(con, window, t.name)


def _breakdown_from(con: duckdb.DuckDBPyConnection, window: Window, table: str) -> PhaseBreakdown:
    trust = Trust()
    missing: list[str] = []
    fits = _fits(con, table)
    coef = _coef_frame(fits)
    con.register("pl_coef", coef)
    try:
        raw = con.execute(_aggregate_sql(table)).df()
    finally:
        con.unregister("pl_coef")
    issues = _iteration_issues(con, window)
    lagged = _lagged_iterations(con, window)
    if raw.empty:
        missing.append(
            f"no GPU sample intervals in the window ({window.dataset}, {window.start_s:.3f}–{window.end_s:.3f} s): "
            "a window needs two samples of a GPU"
        )
        missing += _issue_notes(issues)
        empty = pd.DataFrame(columns=[*_GPU_KEY, "role", *_SUM_COLS])
        return PhaseBreakdown(
            window, _finish(empty), _finish(empty), _finish(empty), fits, trust, missing, raw
        )
    _trust_from(raw, trust, lagged)
    keys = [*_GPU_KEY, "uuid", "name", "role", "worker"]
    raw["index"] = raw["index"].astype("Int64")
    per_gpu = raw.groupby([*_GPU_KEY, "role"], dropna=False, as_index=False).agg(
        {"uuid": "first", "name": "first", "worker": "first", **dict.fromkeys(_SUM_COLS, "sum")}
    )[[*keys, *_SUM_COLS]]
    per_pool = raw.groupby("role", as_index=False)[list(_SUM_COLS)].sum()
    per_pool.insert(
        1, "gpus", raw.groupby("role")[list(_GPU_KEY)].apply(lambda g: len(g.drop_duplicates())).values
    )
    per_hour = raw.groupby(["hour_s", "role"], as_index=False)[list(_SUM_COLS)].sum()
    # what is missing, per GPU
    for rec in (
        raw.groupby([*_GPU_KEY], dropna=False)
        .agg(
            unattributed_s=("unattributed_s", "sum"),
            no_energy=("no_energy_intervals", "sum"),
            resets=("counter_resets", "sum"),
            no_counter=("no_counter_intervals", "sum"),
            mig=("mig_instance_intervals", "sum"),
            intervals=("intervals", "sum"),
        )
        .reset_index()
        .to_dict(orient="records")
    ):
        name = gpu_key(rec["node"], rec["source"], rec["device"], rec["index"])
        if rec["unattributed_s"] > 0:
            missing.append(
                f"{name}: no owner worker and no iteration with its uuid: phase states unknown for "
                f"{rec['unattributed_s']:.1f} s (time counted under unattributed_s, not idle)"
            )
        if rec["no_energy"] > 0:
            missing.append(f"{name}: neither energy counter nor power on {int(rec['no_energy'])} intervals")
        if rec["resets"] > 0:
            missing.append(
                f"{name}: energy counter went backwards (reset/wrap) on {int(rec['resets'])} intervals: "
                "power integrated there"
            )
        if rec["no_counter"] > 0:
            missing.append(
                f"{name}: no energy counter on {int(rec['no_counter'])} intervals: power integrated"
            )
        if rec["mig"] > 0:
            missing.append(
                f"{name}: MIG instance: energy is counted once on its physical GPU's row, not here"
            )
    for key, fit in fits.items():
        if fit.r2 is not None and fit.r2 < 0.5:
            missing.append(f"{key}: power model fits poorly (R² {fit.r2:.2f}); energy shares uncertain")
    missing += _issue_notes(issues)
    return PhaseBreakdown(
        window, _finish(per_gpu), _finish(per_pool), _finish(per_hour), fits, trust, missing, raw
    )
