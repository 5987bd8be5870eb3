"""Bimodal idle time: how SM activity is distributed, and where "busy" GPU time is really idle.

A decoding GPU reads ~100 % utilization while most of its SMs idle; a prefilling one keeps them
busy. Over the sample intervals of :func:`analytics.attribution.gpu_intervals`:

* :func:`bimodality`: per fleet, pool (role), pool × hour and GPU, the distribution of SM activity
  (utilization % only where the source has no SM activity, then flagged), its bimodality —
  Hartigan's dip test (the ``diptest`` package), Sarle's bimodality coefficient, the two modes
  (peaks of the smoothed histogram: where each is, its share of the time and the valley between)
  — one verdict from that evidence (:data:`BIMODAL_RULE`, :func:`bimodal_verdict`), the
  time-weighted SM activity during prefill and during decode, and the gap between utilization %
  and SM activity;
* :func:`idle_split`: GPU-seconds (and joules) per category — productive prefill, stranded bandwidth
  in prefill (prefill time × (1 − MBU), else × (1 − DRAM activity)), productive decode, stranded
  compute (decode time × (1 − MFU), else × (1 − SM activity): :mod:`analytics.stranded`), host-bound gaps, true idle, unsampled (a gap in the GPU's samples: not
  idle) — per GPU, pool and hour.

Moments and per-phase activities are SQL aggregates over all intervals; the dip test and the
modes run in numpy on at most ``max_points`` values per group, drawn in SQL by a hash of the
interval (so a group's sample is a uniform one, the same on every run). Formulas and sources:
docs/analytics/attribution.md.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pandas as pd

from analytics.attribution import (
    CATEGORIES,
    CATEGORY_SUM_COLS,
    IntervalTable,
    PhaseBreakdown,
    phase_breakdown,
)
from analytics.bimodal_stats import (
    BIMODAL_RULE,
    DIP_KEYS,
    MIN_POINTS,
    NO_SPREAD_STD_PCT,
    bimodal_verdict,
    dip_and_modes,
    moments_from_sums,
    sarle_coefficient,
)
from analytics.intervals import SM_SHIFT_PCT
from analytics.jsonable import table_records, tables_dict
from analytics.power_model import gpu_key, nnls_gram
from analytics.stranded import basis_note, stranded_basis
from analytics.trust import ESTIMATED, Trust
from analytics.window import Window, utc

# -- bimodality -----------------------------------------------------------------------------------


@dataclass(slots=True)
class Bimodality:
    """Bimodality of SM activity. ``table``: one row per group, ``scope`` one of ``fleet``,
    ``pool``, ``pool_hour``, ``gpu`` (``role``, ``hour_s``, ``gpu`` fill the key), with ``n``
    (intervals), ``mean_sm_pct``, ``std_sm_pct``, ``skewness``, ``excess_kurtosis``, ``sarle``,
    ``dip``, ``dip_p_value``, ``dip_n`` (values the dip test and modes used), ``bimodal`` and
    ``verdict`` (:func:`bimodal_verdict`: dip p < 0.05 and two modes; the words), the modes (:func:`histogram_modes`) ``mode_low_pct``/``mode_high_pct``,
    ``std_low_pct``/``std_high_pct``, ``weight_low``/``weight_high``, ``valley_pct`` (the high
    ones None where the values have one peak); ``sm_prefill_pct``/``sm_decode_pct`` (and
    ``util_prefill_pct``/``util_decode_pct``, ``dram_prefill_pct``/``dram_decode_pct``): the mean
    activity while the GPU ran prefill / decode work (least squares of activity-seconds on the state
    seconds, non-negative); ``util_pct``, ``util_sm_gap_pct`` (time-weighted utilization % minus
    SM activity, on intervals with both); ``sm_fallback_intervals``. ``rule``: :data:`BIMODAL_RULE`.
    ``missing``: groups left out and why."""

    window: Window
    table: pd.DataFrame
    trust: Trust
    missing: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": self.window.describe(),
            "rule": BIMODAL_RULE,
            "table": table_records(self.table),
            "trust": self.trust.to_dict(),
            "missing": list(self.missing),
        }


_SCOPES: dict[str, tuple[str, ...]] = {  # scope -> the key columns of its groups
    "fleet": (),
    "pool": ("role", "rh"),
    "pool_hour": ("role", "rh", "hour_s"),
    "gpu": ("role", "rh", "node", "source", "device", "index", "gh"),
}
# integer keys of a row's GPU and role, the same in the moments and the points queries
_GH_SQL = 'hash(node, source, device, "index")'
_RH_SQL = "hash(coalesce(role, 'unknown'))"


def _moments_sql(table: str, where: str) -> str:
    """Per GPU × role × hour: the power sums of SM activity and the Gram sums of the per-phase
    activity regressions — all additive, so every scope's figures are sums of these rows."""
    xs = {
        "p": "coalesce(prefill_s, 0) + coalesce(mixed_prefill_s, 0)",
        "d": "coalesce(decode_s, 0) + coalesce(mixed_decode_s, 0)",
        "o": "interval_s - unsampled_s - (coalesce(prefill_s, 0) + coalesce(mixed_prefill_s, 0) "
        "+ coalesce(decode_s, 0) + coalesce(mixed_decode_s, 0))",
    }
    sampled = "(interval_s - unsampled_s)"  # the activities are means over the sampled time
    ys = {"sm": "sm_active_pct", "util": "gpu_util_pct", "dram": "dram_active_pct"}
    parts = []
    keys = list(xs)
    for i, a in enumerate(keys):
        for b in keys[i:]:
            for y, col in ys.items():
                parts.append(f"sum(({xs[a]}) * ({xs[b]})) FILTER (WHERE {col} IS NOT NULL) AS g_{y}_{a}{b}")
        for y, col in ys.items():
            parts.append(f"sum(({xs[a]}) * {col} * {sampled}) AS r_{y}_{a}")
    return f"""
SELECT role, hour_s, node, source, device, "index", {_GH_SQL} AS gh, {_RH_SQL} AS rh, count(*) AS rows, sum(sm_n) AS n, sum(sm_s1) AS s1, sum(sm_s2) AS s2, sum(sm_s3) AS s3,
       sum(sm_s4) AS s4,
       count(*) FILTER (WHERE sm_source = 'gpu_util') AS sm_fallback_intervals,
       sum({sampled}) FILTER (WHERE sm_source = 'sm_active' AND gpu_util_pct IS NOT NULL) AS both_s,
       sum(gpu_util_pct * {sampled}) FILTER (WHERE sm_source = 'sm_active' AND gpu_util_pct IS NOT NULL)
           AS util_pct_s,
       sum(sm_active_pct * {sampled}) FILTER (WHERE sm_source = 'sm_active' AND gpu_util_pct IS NOT NULL)
           AS sm_pct_s,
       {", ".join(parts)}
FROM (SELECT * REPLACE (coalesce(role, 'unknown') AS role) FROM {table}) WHERE {where}
GROUP BY ALL
"""


def _scope_records(base: pd.DataFrame) -> list[dict[str, Any]]:
    """The per GPU × role × hour sums added up for every scope (fleet, pool, pool × hour, GPU)."""
    if base.empty:
        return []
    key_cols = ["role", "hour_s", "node", "source", "device", "index", "gh", "rh"]
    sums = [c for c in base.columns if c not in key_cols]
    out: list[dict[str, Any]] = []
    for scope, kept in _SCOPES.items():
        if kept:
            g = base.groupby(list(kept), dropna=False)[sums].sum(min_count=1).reset_index()
        else:
            g = base[sums].sum(min_count=1).to_frame().T
        for rec in g.to_dict(orient="records"):
            rec["scope"] = scope
            out.append(rec)
    return out


def _min_gpu_values(base: pd.DataFrame) -> int | None:
    """The smallest count of SM activity values of a GPU that has any (the points query's
    ``min(n_gpu)``), from the per GPU × role × hour moments rows (:func:`_moments_sql`: integer
    sums, so the same integer); None where no GPU has a value."""
    if base.empty:
        return None
    per_gpu = base.groupby(["node", "source", "device", "index"], dropna=False)["n"].sum()
    per_gpu = per_gpu[per_gpu > 0]
    return int(per_gpu.min()) if len(per_gpu) else None


def _points_sql(
    iv: IntervalTable, where: str, max_points: int, min_gpu_n: int | None = None
) -> tuple[str, list[Any]]:
    """Up to ``max_points`` SM activity values per GPU (utilization % where a sample has none), drawn
    uniformly by a hash of the sample time; each with its GPU (``gh``), role (``rh``), hour and its
    GPU's count of values (``n_gpu``), so that pooled groups can be drawn in proportion. On buckets
    the values are the raw samples' (a bucket's mean would blur the modes), with the role, hour and
    busy share of their bucket. ``min_gpu_n``: the smallest ``n_gpu`` (of the GPUs with values),
    when known: the draw's loosest bound then filters every sample as a constant, before any join
    (as a subquery, DuckDB applies it only after joining all the samples to their GPU)."""
    key = 'node, source, device, "index"'
    if iv.exact:
        sql = f"""
WITH v AS (SELECT * FROM {iv.name} WHERE {where} AND sm_active_pct IS NOT NULL),
ng AS (SELECT {key}, count(*) AS n_gpu FROM v GROUP BY ALL)
SELECT hash(v.node, v.source, v.device, v."index") AS gh,
       hash(coalesce(v.role, 'unknown')) AS rh, v.hour_s, v.sm_active_pct AS x, ng.n_gpu
FROM v JOIN ng ON v.node = ng.node AND v.source = ng.source AND v.device = ng.device
 AND v."index" IS NOT DISTINCT FROM ng."index"
WHERE (hash(v.t1_s) % 1000003) < 1000003.0 * {max_points} / ng.n_gpu
"""
        return sql, []
    pred, par = iv.window.node_sql("gk.node")
    d = repr(iv.bucket_s)
    loosest = (
        f"(SELECT 1000003.0 * {max_points} / min(n_gpu) FROM ng)"
        if min_gpu_n is None
        else repr(1000003.0 * max_points / float(min_gpu_n))  # the same double DuckDB computes
    )
    sql = f"""
WITH b AS (SELECT {key}, k, {_GH_SQL} AS gh, {_RH_SQL} AS rh, hour_s FROM {iv.name} WHERE {where}),
ng AS (  -- per GPU, its count of values and its gpu_key (the samples are joined by key, not by name)
    SELECT gk.gpu_key, n.* FROM (
        SELECT {key}, sum(sm_n) AS n_gpu FROM {iv.name} WHERE {where} GROUP BY ALL HAVING sum(sm_n) > 0) n
    JOIN gpu_keys gk ON n.node = gk.node AND n.source = gk.source AND n.device = gk.device
     AND n."index" IS NOT DISTINCT FROM gk."index"
    WHERE {pred}
),
v AS (
    SELECT ng.node, ng.source, ng.device, ng."index", floor(s.ts_s / {d})::BIGINT AS k,
           coalesce(s.sm_active_pct, s.gpu_util_pct) AS x, ng.n_gpu
    FROM gpu_sample_rows s JOIN ng ON s.gpu_key = ng.gpu_key
    WHERE s.ts_s >= ? AND s.ts_s < ? AND coalesce(s.sm_active_pct, s.gpu_util_pct) IS NOT NULL
      AND (hash(s.ts_s) % 1000003) < 1000003.0 * {max_points} / ng.n_gpu
      -- the same draw's loosest bound, on every sample before the join (few reach it)
      AND (hash(s.ts_s) % 1000003) < {loosest}
)
SELECT b.gh, b.rh, b.hour_s, v.x, v.n_gpu
FROM v JOIN b ON v.node = b.node AND v.source = b.source AND v.device = b.device
 AND v."index" IS NOT DISTINCT FROM b."index" AND v.k = b.k
"""
    return sql, [*par, iv.window.start_s, iv.window.end_s]


def _cells(pts: dict[str, np.ndarray]) -> tuple[dict[tuple[int, int, float], np.ndarray], dict[int, float]]:
    """The drawn values (``x``) per (GPU, role, hour) — ``gh``, ``rh``, ``hour_s`` of the points
    query's columns — each sorted, the cells in order of their key, so that the thinning of pooled
    groups draws the same values whatever order the query's rows came in; and each GPU's count of
    values (``n_gpu``). Rows with a NULL key are left out (as a grouping drops them)."""
    cells: dict[tuple[int, int, float], np.ndarray] = {}
    per_gpu_n: dict[int, float] = {}
    cols = {k: pts[k] for k in ("gh", "rh", "hour_s", "x", "n_gpu")}
    keep = ~(
        np.ma.getmaskarray(cols["gh"]) | np.ma.getmaskarray(cols["rh"]) | np.ma.getmaskarray(cols["hour_s"])
    )
    gh, rh = np.ma.getdata(cols["gh"])[keep], np.ma.getdata(cols["rh"])[keep]
    hour = np.ma.getdata(cols["hour_s"]).astype(float)[keep]
    x = np.ma.filled(np.ma.asarray(cols["x"], dtype=float), np.nan)[keep]
    n_gpu = np.ma.getdata(cols["n_gpu"])[keep]
    keep = ~np.isnan(hour)  # NaN, as a NULL, is no key
    gh, rh, hour, x, n_gpu = gh[keep], rh[keep], hour[keep], x[keep], n_gpu[keep]
    if not len(x):
        return cells, per_gpu_n
    order = np.lexsort((x, hour, rh, gh))
    gh, rh, hour, x, n_gpu = gh[order], rh[order], hour[order], x[order], n_gpu[order]
    new = np.flatnonzero((gh[1:] != gh[:-1]) | (rh[1:] != rh[:-1]) | (hour[1:] != hour[:-1])) + 1
    bounds = np.concatenate(([0], new, [len(x)]))
    for lo, hi in itertools.pairwise(bounds):
        cells[(int(gh[lo]), int(rh[lo]), float(hour[lo]))] = x[lo:hi]
        per_gpu_n[int(gh[lo])] = float(n_gpu[lo])
    return cells, per_gpu_n


def _phase_activity(rec: dict[str, Any], y: str) -> tuple[float | None, float | None]:
    """Mean activity (%) during prefill and during decode: non-negative least squares of the
    activity-seconds of the intervals on their prefill / decode / other seconds."""
    keys = ("p", "d", "o")
    g = np.zeros((3, 3))
    r = np.zeros(3)
    for i, a in enumerate(keys):
        for j, b in enumerate(keys):
            name = f"g_{y}_{a}{b}" if i <= j else f"g_{y}_{b}{a}"
            v = rec.get(name)
            g[i, j] = 0.0 if v is None or pd.isna(v) else float(v)
        v = rec.get(f"r_{y}_{a}")
        r[i] = 0.0 if v is None or pd.isna(v) else float(v)
    present = [i for i in range(3) if g[i, i] > 1e-12]
    b = np.zeros(3)
    if present:
        b[present] = nnls_gram(g[np.ix_(present, present)], r[present])
    out = tuple(float(b[i]) if i in present else None for i in (0, 1))
    return out[0], out[1]


def bimodality(
    con: duckdb.DuckDBPyConnection,
    window: Window,
    *,
    min_busy_frac: float = 0.0,
    max_points: int = 5_000,
    bucket_s: float | None = None,
    intervals: IntervalTable | None = None,
) -> Bimodality:
    """Bimodality of SM activity per fleet, pool, pool × hour and GPU over ``window``'s sample
    intervals. ``min_busy_frac`` > 0 keeps only intervals whose GPU-busy (prefill + decode) share is
    at least that (idle intervals otherwise form a mode of their own at 0 %); GPUs without serving
    telemetry have no known busy share and are then left out (noted)."""
    if not 0.0 <= min_busy_frac <= 1.0:
        raise ValueError(f"min_busy_frac must be within [0, 1], got {min_busy_frac}")
    if max_points < MIN_POINTS:
        raise ValueError(f"max_points must be at least {MIN_POINTS}, got {max_points}")
    if intervals is not None:
        if intervals.window != window:
            raise ValueError("the interval table given is of another window than the one asked for")
        return _bimodality_from(con, window, intervals, min_busy_frac, max_points)
    with IntervalTable(con, window, bucket_s) as t:
        return _bimodality_from(con, window, t, min_busy_frac, max_points)


def _bimodality_from(
    con: duckdb.DuckDBPyConnection, window: Window, iv: IntervalTable, min_busy_frac: float, max_points: int
) -> Bimodality:
    table = iv.name
    trust = Trust()
    missing: list[str] = []
    where = "TRUE"
    if min_busy_frac > 0:
        where = (
            "attributed AND coalesce(prefill_s, 0) + coalesce(mixed_prefill_s, 0) + coalesce(decode_s, 0)"
            f" + coalesce(mixed_decode_s, 0) >= {float(min_busy_frac)} * (interval_s - unsampled_s)"
            " AND interval_s > unsampled_s"
        )
        unattributed = con.execute(f"SELECT count(*) FROM {table} WHERE NOT attributed").fetchone()[0]
        if unattributed:
            missing.append(
                f"{unattributed} intervals of GPUs without serving telemetry left out: their busy share "
                "is unknown"
            )
    labels = con.execute(f"SELECT DISTINCT trust FROM {table}").fetchall()
    for (label,) in labels:
        trust.add(label)
    base = con.execute(_moments_sql(table, where)).df()
    mom = _scope_records(base)
    psql, ppar = _points_sql(iv, where, max_points, _min_gpu_values(base))
    cells, per_gpu_n = _cells(con.execute(psql, ppar).fetchnumpy())
    rows = []
    rng = np.random.default_rng(0)
    # each scope's cells, in the cells' order: looked up, not filtered from all cells per scope
    by_role: dict[int, list[tuple[int, np.ndarray]]] = {}
    by_role_hour: dict[tuple[int, float], list[tuple[int, np.ndarray]]] = {}
    by_role_gpu: dict[tuple[int, int], list[tuple[int, np.ndarray]]] = {}
    every = [(gh, vals) for (gh, _, _), vals in cells.items()]
    for (gh, rh, hour), vals in cells.items():
        by_role.setdefault(rh, []).append((gh, vals))
        by_role_hour.setdefault((rh, hour), []).append((gh, vals))
        by_role_gpu.setdefault((rh, gh), []).append((gh, vals))
    for rec in mom:
        scope = rec["scope"]
        row: dict[str, Any] = {"scope": scope, "role": None, "hour_s": None, "gpu": None}
        want_rh = want_gh = want_hour = None
        if scope in ("pool", "pool_hour", "gpu"):
            row["role"], want_rh = rec["role"], int(rec["rh"])
        if scope == "pool_hour":
            row["hour_s"] = want_hour = float(rec["hour_s"])
        if scope == "gpu":
            row["gpu"] = gpu_key(rec["node"], rec["source"], rec["device"], rec["index"])
            want_gh = int(rec["gh"])
        if want_rh is None:
            chosen = every
        elif want_gh is not None:
            chosen = by_role_gpu.get((want_rh, want_gh), [])
        elif want_hour is not None:
            chosen = by_role_hour.get((want_rh, want_hour), [])
        else:
            chosen = by_role.get(want_rh, [])
        by_gpu: dict[int, list[np.ndarray]] = {}
        for gh, vals in chosen:
            by_gpu.setdefault(gh, []).append(vals)
        x = _draw({g: np.concatenate(v) for g, v in by_gpu.items()}, per_gpu_n, max_points, rng)
        mo = moments_from_sums(
            *(_num(rec[c]) or 0.0 for c in ("n", "s1", "s2", "s3", "s4")), shift=SM_SHIFT_PCT
        )
        n = mo.n
        row.update(
            n=n,
            mean_sm_pct=mo.mean,
            std_sm_pct=mo.std,
            skewness=mo.skewness,
            excess_kurtosis=mo.excess_kurtosis,
            sarle=sarle_coefficient(mo.skewness, mo.excess_kurtosis, n),
            dip_n=len(x),
        )
        row.update(dip_and_modes(x))
        std = row["std_sm_pct"]
        row["no_spread"] = n >= MIN_POINTS and (std is None or std < NO_SPREAD_STD_PCT)
        if row["no_spread"]:  # bimodality is not defined: no test result, no modes, no Sarle's b
            row.update(dict.fromkeys(DIP_KEYS), sarle=None)
        row["bimodal"], row["verdict"] = bimodal_verdict(
            row["dip_p_value"], row["mode_high_pct"], no_spread=row["no_spread"]
        )
        for y in ("sm", "util", "dram"):
            p, d = _phase_activity(rec, y)
            row[f"{y}_prefill_pct"], row[f"{y}_decode_pct"] = p, d
        both = _num(rec["both_s"])
        row["util_pct"] = _num(rec["util_pct_s"]) / both if both else None
        row["util_sm_gap_pct"] = (_num(rec["util_pct_s"]) - _num(rec["sm_pct_s"])) / both if both else None
        row["sm_fallback_intervals"] = int(rec["sm_fallback_intervals"] or 0)
        rows.append(row)
        label = _label(row)
        if n < MIN_POINTS:
            missing.append(f"{label}: {n} intervals with SM activity: too few for the dip test and modes")
        elif row["no_spread"]:
            missing.append(
                f"{label}: constant / no spread (SM activity std {std or 0.0:.2f} points < "
                f"{NO_SPREAD_STD_PCT:g}): bimodality not defined"
            )
        # a disaggregated pool's GPUs run one phase: the other's activity is not missing there
        if row["sm_prefill_pct"] is None and scope != "pool_hour" and row["role"] != "decode":
            missing.append(f"{label}: no prefill time: SM activity during prefill unknown")
        if row["sm_decode_pct"] is None and scope != "pool_hour" and row["role"] != "prefill":
            missing.append(f"{label}: no decode time: SM activity during decode unknown")
        if both is None or both == 0:
            missing.append(f"{label}: no interval with both utilization % and SM activity: gap unknown")
    table_df = pd.DataFrame(rows)
    if table_df.empty:
        missing.insert(0, "no GPU sample intervals with SM activity or utilization % in the window")
    else:
        order = {s: i for i, s in enumerate(_SCOPES)}
        table_df = table_df.sort_values(
            by=["scope", "role", "hour_s", "gpu"], key=lambda c: c.map(order) if c.name == "scope" else c
        ).reset_index(drop=True)
        if table_df["sm_fallback_intervals"].max() > 0:
            trust.add(
                ESTIMATED,
                "SM activity missing on some intervals (e.g. dcgm-exporter without profiling fields): "
                "utilization % used there, which reads busy whenever any kernel runs",
            )
    trust.notes.append(
        f"dip test (Hartigan) and modes (peaks of the smoothed histogram) on up to {max_points} "
        "uniformly drawn intervals per group; moments and per-phase activity on all intervals"
    )
    # the hour-level rows are many and noisy: their missing phases are not worth a note each
    return Bimodality(window, table_df, trust, missing)


def _label(row: dict[str, Any]) -> str:
    if row["scope"] == "fleet":
        return "fleet"
    if row["scope"] == "pool":
        return f"pool {row['role']}"
    if row["scope"] == "pool_hour":
        return f"pool {row['role']} hour from {utc(row['hour_s'])}"
    return f"GPU {row['gpu']}"


def _num(v: Any) -> float | None:
    if v is None or (isinstance(v, float) and not math.isfinite(v)) or pd.isna(v):
        return None
    return float(v)


def _draw(
    groups: dict[int, np.ndarray], per_gpu_n: dict[int, float], max_points: int, rng: np.random.Generator
) -> np.ndarray:
    """A group's values from each GPU's drawn ones, thinned so that GPUs weigh as their counts."""
    if not groups:
        return np.array([])
    if len(groups) == 1:
        return next(iter(groups.values()))
    total = float(sum(per_gpu_n[k] for k in groups))
    budget = min(max_points, sum(len(v) for v in groups.values()))
    out = []
    for k, v in groups.items():
        want = min(len(v), max(1, round(budget * per_gpu_n[k] / total)))
        out.append(v if want >= len(v) else rng.choice(v, size=want, replace=False))
    return np.concatenate(out)


# -- idle split -----------------------------------------------------------------------------------


@dataclass(slots=True)
class IdleSplit:
    """GPU-seconds and joules per category (``CATEGORIES``: productive_prefill, stranded_bandwidth,
    productive_decode, stranded_compute, host_bound, idle, unsampled — time in a gap of the GPU's
    samples, never idle) per GPU, pool (role) and hour × pool: ``<category>_s``, ``frac_<category>``
    (of ``attributed_s``, the time whose state is known; they sum to 1), ``energy_<category>_j``
    (summing to the attributed measured energy), plus ``interval_s``, ``attributed_s``,
    ``unattributed_s``, ``energy_j``, ``util_pct``, ``sm_active_pct`` and ``util_sm_gap_pct``
    (time-weighted, on intervals with both), the basis sums (:data:`analytics.stranded.BASIS_SUM_COLS`:
    ``decode_roofline_s`` split by MFU, ``decode_activity_s`` by SM activity,
    ``decode_activity_unknown_s`` by neither — counted productive —, prefill likewise, and the SM /
    DRAM activity basis's stranded seconds beside). ``basis``: which basis the stranded figures rest
    on. ``missing`` says what could not be split."""

    window: Window
    per_gpu: pd.DataFrame
    per_pool: pd.DataFrame
    per_hour: pd.DataFrame
    trust: Trust
    missing: list[str] = field(default_factory=list)
    #: which basis the stranded categories rest on (:func:`analytics.stranded.stranded_basis`)
    basis: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return tables_dict(self, basis=dict(self.basis))


_SPLIT_SUMS = (
    "interval_s",
    "attributed_s",
    "unattributed_s",
    "idle_s",
    "unsampled_s",
    "energy_j",
    "energy_idle_j",
    "energy_unsampled_j",
    "energy_unattributed_j",
    *CATEGORY_SUM_COLS,
)


def _split_table(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    g = df.groupby(keys, as_index=False, dropna=False)[list(_SPLIT_SUMS)].sum(min_count=1)
    for c in CATEGORIES:
        g[f"{c}_s"] = g[f"{c}_s"].fillna(0.0)
        g[f"energy_{c}_j"] = g[f"energy_{c}_j"].fillna(0.0)
    denom = g["attributed_s"].where(g["attributed_s"] > 0)
    for c in CATEGORIES:
        g[f"frac_{c}"] = g[f"{c}_s"] / denom
    both = g["both_s"].where(g["both_s"] > 0)
    g["util_pct"] = g["util_pct_s"] / both
    g["sm_active_pct"] = g["sm_pct_s"] / both
    g["util_sm_gap_pct"] = g["util_pct"] - g["sm_active_pct"]
    return g.drop(columns=["both_s", "util_pct_s", "sm_pct_s"])


def idle_split(
    con: duckdb.DuckDBPyConnection,
    window: Window,
    *,
    breakdown: PhaseBreakdown | None = None,
    bucket_s: float | None = None,
    intervals: IntervalTable | None = None,
) -> IdleSplit:
    """GPU time and energy of ``window`` per category, per GPU, pool and hour. ``breakdown``: a
    :func:`~analytics.attribution.phase_breakdown` of the same window to derive it from without
    querying again (its ``raw`` sums carry the categories)."""
    if breakdown is None:
        breakdown = phase_breakdown(con, window, bucket_s=bucket_s, intervals=intervals)
    elif breakdown.window != window:
        raise ValueError("the breakdown given is of another window than the one asked for")
    trust = Trust().merge([breakdown.trust])
    missing = list(breakdown.missing)
    raw = breakdown.raw
    if raw.empty:
        empty = pd.DataFrame(columns=[*_SPLIT_SUMS])
        return IdleSplit(window, empty, empty.copy(), empty.copy(), trust, missing)
    per_gpu = _split_table(raw, ["node", "source", "device", "index", "role"])
    per_pool = _split_table(raw, ["role"])
    per_hour = _split_table(raw, ["hour_s", "role"])
    unknown_d = float(raw["decode_activity_unknown_s"].sum())
    unknown_p = float(raw["prefill_activity_unknown_s"].sum())
    if unknown_d > 0:
        missing.append(
            f"{unknown_d:.1f} s of decode time have no work count (MFU) and no SM activity (nor "
            "utilization %): counted productive decode, stranded compute unknown there"
        )
    if unknown_p > 0:
        missing.append(
            f"{unknown_p:.1f} s of prefill time have no work count (MBU) and no DRAM activity: "
            "counted productive prefill, stranded bandwidth unknown there"
        )
    basis = stranded_basis(raw)
    trust.notes.append(basis_note(basis))
    return IdleSplit(window, per_gpu, per_pool, per_hour, trust, missing, basis)
