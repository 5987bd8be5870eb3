"""The store reads of the external attribution (analytics/external.py): the GPU sample intervals
of the window (SQL; MIG instances sampled on their physical GPU's times) and the engines'
counters and gauges as time series (:class:`EngineSeries`), interpolated to the GPUs' sample times.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import pandas as pd

from analytics.window import Window

#: engine_metrics names (normalised by the collector) the attribution reads.
ENGINE_COUNTERS = (
    "prompt_tokens_total",
    "generation_tokens_total",
    "iteration_tokens_total_count",
    "prefill_seconds_sum",
    "decode_seconds_sum",
    "requests_total",
)
ENGINE_GAUGES = ("requests_running", "requests_waiting")


# --- the store reads (SQL) ----------------------------------------------------------------------------

# A MIG instance's row is stored only when its values change (dcgm-exporter repeats them every
# scrape; the collector keeps a row per change), so an instance is sampled on its physical GPU's
# sample times, each taking the instance's last stored values (ASOF), from up to an hour before.
_INTERVALS_SQL = """
WITH x AS (
    SELECT node, source, device, "index", ts_s, uuid, name, parent_uuid, mig_instance_id, mig_profile,
           k8s_pod, k8s_namespace, {role} AS role,
           gr_engine_active_pct, gpu_util_pct, sm_active_pct, power_w, energy_mj, power_limit_w,
           trust_label(node, source, emulated) AS trust
    FROM gpu_samples_full
    WHERE {nodes} AND ts_s >= ? - 3600.0 AND ts_s < ?
), whole AS (
    SELECT * FROM x WHERE parent_uuid IS NULL AND ts_s >= ?
), inst AS (
    SELECT DISTINCT node, source, device, "index", parent_uuid FROM x WHERE parent_uuid IS NOT NULL
), grid AS (
    SELECT i.node, i.source, i.device, i."index", w.ts_s
    FROM inst i JOIN whole w ON w.node = i.node AND w.source = i.source AND w.uuid = i.parent_uuid
), filled AS (
    SELECT g.ts_s, v.* EXCLUDE (ts_s)
    FROM grid g ASOF JOIN (SELECT * FROM x WHERE parent_uuid IS NOT NULL) v
      ON g.node = v.node AND g.source = v.source AND g.device = v.device
     AND g."index" IS NOT DISTINCT FROM v."index" AND g.ts_s >= v.ts_s
), s AS (
    SELECT * FROM whole UNION ALL BY NAME SELECT * FROM filled
), d AS (
    SELECT *,
           ts_s - lag(ts_s) OVER w AS dt_s,
           lag(energy_mj) OVER w AS prev_energy_mj,
           lag(power_w) OVER w AS prev_power_w
    FROM s
    WINDOW w AS (PARTITION BY node, source, device, "index" ORDER BY ts_s)
)
SELECT *,
       CASE WHEN gr_engine_active_pct IS NOT NULL THEN 'gr_engine_active'
            WHEN gpu_util_pct IS NOT NULL THEN 'gpu_util'
            WHEN sm_active_pct IS NOT NULL THEN 'sm_active' END AS busy_measure,
       least(100.0, greatest(0.0, coalesce(gr_engine_active_pct, gpu_util_pct, sm_active_pct)))
           / 100.0 * dt_s AS busy_s,
       CASE WHEN energy_mj IS NOT NULL AND prev_energy_mj IS NOT NULL AND energy_mj >= prev_energy_mj
            THEN (energy_mj - prev_energy_mj) / 1000.0 END AS counter_energy_j,
       CASE WHEN power_w IS NOT NULL AND prev_power_w IS NOT NULL
            THEN (power_w + prev_power_w) / 2.0 * dt_s END AS integrated_energy_j,
       energy_mj < prev_energy_mj AS counter_reset
FROM d
WHERE dt_s IS NOT NULL AND dt_s > 0
ORDER BY node, source, device, "index", ts_s
"""

# Engines that hold no GPU of their own are not read: a Dynamo frontend, and the bundled stack's
# router (engine 'phaselens': its tokens are the bundled stack's, counted from its telemetry).
_ENGINE_SQL = """
SELECT endpoint, any_value(engine) AS engine, ts_s, metric, sum(value) AS value
FROM engine_metrics
WHERE {nodes} AND ts_s >= ? AND ts_s <= ? AND metric IN ({metrics}) AND value IS NOT NULL
  AND (engine IS NULL OR engine NOT IN ('dynamo', 'phaselens'))
GROUP BY endpoint, ts_s, metric
ORDER BY endpoint, metric, ts_s
"""

_ENGINE_LABELS_SQL = """
SELECT endpoint, any_value(engine) AS engine, mode(node) AS node,
       mode(labels->>'pod') AS pod,
       mode(labels->>'namespace') AS namespace,
       mode(labels->>'dynamo_component') AS dynamo_component,
       mode(labels->>'dynamo_namespace') AS dynamo_namespace,
       mode(labels->>'model_name') AS model,
       count(*) AS n_rows
FROM engine_metrics
WHERE {nodes} AND ts_s >= ? AND ts_s < ? AND (engine IS NULL OR engine NOT IN ('dynamo', 'phaselens'))
GROUP BY endpoint
ORDER BY endpoint
"""


def _has_column(con: duckdb.DuckDBPyConnection, view: str, column: str) -> bool:
    rows = con.execute(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = ? AND column_name = ?",
        [view, column],
    ).fetchone()
    return bool(rows and rows[0])


def read_intervals(con: duckdb.DuckDBPyConnection, window: Window) -> pd.DataFrame:
    nodes, params = window.node_sql("node")
    role = "role" if _has_column(con, "gpu_samples_full", "role") else "NULL::VARCHAR"
    sql = _INTERVALS_SQL.format(nodes=nodes, role=role)
    return con.execute(sql, [*params, window.start_s, window.end_s, window.start_s]).df()


def read_engine_rows(con: duckdb.DuckDBPyConnection, window: Window) -> tuple[pd.DataFrame, pd.DataFrame]:
    nodes, params = window.node_sql("node")
    metrics = (*ENGINE_COUNTERS, *ENGINE_GAUGES)
    marks = ", ".join("?" for _ in metrics)
    # engine scrapes may straddle the window: take one scrape period's worth beyond each edge
    margin = 600.0
    values = con.execute(
        _ENGINE_SQL.format(nodes=nodes, metrics=marks),
        [*params, window.start_s - margin, window.end_s + margin, *metrics],
    ).df()
    labels = con.execute(
        _ENGINE_LABELS_SQL.format(nodes=nodes), [*params, window.start_s - margin, window.end_s + margin]
    ).df()
    return values, labels


def _cumulative(ts: np.ndarray, v: np.ndarray) -> np.ndarray:
    """A counter made monotonic: a drop is a restart, whose new value is the increase."""
    inc = np.diff(v, prepend=v[0])
    inc = np.where(inc < 0, v, inc)
    inc[0] = 0.0
    return v[0] + np.cumsum(inc)


@dataclass(slots=True)
class EngineSeries:
    endpoint: str
    engine: str | None
    series: dict[str, tuple[np.ndarray, np.ndarray]]  # metric → (ts_s, cumulative or gauge value)

    def increase(self, metric: str, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
        """The counter's increase over each ``(a, b]`` (interpolated); NaN outside its scrapes."""
        s = self.series.get(metric)
        if s is None or len(s[0]) < 2:
            return None
        ts, cum = s
        inside = (a >= ts[0] - 1e-6) & (b <= ts[-1] + 1e-6)
        out = np.interp(b, ts, cum) - np.interp(a, ts, cum)
        return np.where(inside, out, np.nan)

    def clipped_increase(self, metric: str, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
        """The counter's increase over the part of each ``(a, b]`` inside its scrapes (0 outside)."""
        s = self.series.get(metric)
        if s is None or len(s[0]) < 2:
            return None
        ts, cum = s
        return np.interp(b, ts, cum) - np.interp(a, ts, cum)

    def span(self, metric: str, start_s: float, end_s: float) -> tuple[np.ndarray, np.ndarray]:
        """``(start, end)`` clipped to the metric's scrapes, as 1-element arrays for :meth:`increase`."""
        s = self.series.get(metric)
        lo, hi = (start_s, end_s) if s is None else (max(start_s, s[0][0]), min(end_s, s[0][-1]))
        return np.array([lo]), np.array([max(lo, hi)])

    def mean_gauge(self, metric: str, start_s: float, end_s: float) -> float:
        s = self.series.get(metric)
        if s is None:
            return float("nan")
        ts, v = s
        m = (ts >= start_s) & (ts < end_s)
        return float(v[m].mean()) if m.any() else float("nan")


def engine_series(values: pd.DataFrame) -> dict[str, EngineSeries]:
    out: dict[str, EngineSeries] = {}
    for (ep, metric), grp in values.groupby(["endpoint", "metric"], sort=False):
        ts = grp["ts_s"].to_numpy(dtype=float)
        v = grp["value"].to_numpy(dtype=float)
        if metric in ENGINE_COUNTERS:
            v = _cumulative(ts, v)
        e = out.setdefault(ep, EngineSeries(ep, grp["engine"].iloc[0], {}))
        e.series[metric] = (ts, v)
    return out
