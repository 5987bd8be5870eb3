"""Binned SM activity and utilization % per pool: the histogram behind the dashboard's Bimodal page.

:func:`activity_histogram` counts a window's GPU samples (``gpu_samples`` with the role of the device
row in effect at each sample) in bins of ``bin_pct`` percent, per pool (the GPU's
role: prefill, decode, mixed, unknown) and for the whole fleet, in DuckDB: only the counts leave the
store, never the samples. A value of exactly 100 % falls in the last bin; values outside [0, 100] are
clipped into the end bins. Each sample counts once (the collector samples at a fixed period, so
counts are proportional to time). The modes and the dip test of the same window are the
summary's ``bimodal`` part (:func:`analytics.bimodal.bimodality`); this module only bins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import duckdb

from analytics.trust import HOST_BOUND, Trust
from analytics.window import AnalyticsError, Window

DEFAULT_BIN_PCT = 2.0
#: bin widths the histogram accepts (each divides 100 into a whole number of bins)
BIN_PCTS = (1.0, 2.0, 2.5, 5.0, 10.0)
METRICS = {"sm_active": "sm_active_pct", "gpu_util": "gpu_util_pct"}
FLEET = "fleet"

# One scan: the samples with the role of the device row in effect at each (a range join on the few
# devices rows, cheaper than the gpu_samples_full view's ASOF join), counted per grouping set.
_SQL = """
WITH d AS (
    SELECT node, source, device, "index", since_s, role,
           lead(since_s) OVER (PARTITION BY node, source, device, "index" ORDER BY since_s) AS until_s
    FROM devices WHERE {dpred}
),
s AS (
    SELECT coalesce(d.role, 'unknown') AS pool, hash(g.node, g.source, g.device, g."index") AS gpu,
           CASE WHEN isfinite(g.sm_active_pct) THEN g.sm_active_pct END AS sm,
           CASE WHEN isfinite(g.gpu_util_pct) THEN g.gpu_util_pct END AS util,
           g.host_bound_pct, trust_label(g.node, g.source, g.emulated) AS trust
    FROM gpu_samples g LEFT JOIN d
      ON g.node = d.node AND g.source = d.source AND g.device = d.device
     AND g."index" IS NOT DISTINCT FROM d."index"
     AND g.ts_s >= d.since_s AND (d.until_s IS NULL OR g.ts_s < d.until_s)
    WHERE {gpred} AND g.ts_s >= $start AND g.ts_s < $end
),
b AS (
    -- greatest/least skip NULLs: a sample without the metric stays out of its bins explicitly
    SELECT *, CASE WHEN sm IS NOT NULL THEN least(greatest(floor(sm / $bin), 0), $bins - 1)::INTEGER END AS sm_bin,
           CASE WHEN util IS NOT NULL THEN least(greatest(floor(util / $bin), 0), $bins - 1)::INTEGER END AS util_bin
    FROM s
),
-- per GPU and bin pair first (thousands of rows at 64 GPUs x 1 h, not millions): the grouping sets
-- and their distinct counts then run on those
c AS (
    SELECT pool, gpu, trust, sm_bin, util_bin, count(*) AS n, sum(sm) AS sm_total,
           sum(util) AS util_total, count(*) FILTER (WHERE host_bound_pct > 0) AS host_bound_samples
    FROM b GROUP BY ALL
)
SELECT pool, sm_bin, util_bin, GROUPING(pool, sm_bin, util_bin) AS gid,
       coalesce(sum(n), 0)::BIGINT AS n, sum(sm_total) AS sm_total, sum(util_total) AS util_total,
       count(DISTINCT gpu) AS gpus, list(DISTINCT trust) AS trust,
       coalesce(sum(host_bound_samples), 0)::BIGINT AS host_bound_samples
FROM c
GROUP BY GROUPING SETS ((pool, sm_bin), (pool, util_bin), (sm_bin), (util_bin), (pool), ())
"""
# GROUPING(pool, sm_bin, util_bin): a bit set for each column left out (4 pool, 2 sm_bin, 1 util_bin)
_BY_POOL_SM, _BY_POOL_UTIL, _BY_SM, _BY_UTIL, _BY_POOL, _ALL = 1, 2, 5, 6, 3, 7


@dataclass(slots=True)
class ActivityHistogram:
    """Sample counts per bin of SM activity and utilization %. ``groups``: one dict per pool (and
    ``pool == "fleet"`` for all GPUs) with ``gpus``, ``samples``, and per metric (``sm_active``,
    ``gpu_util``) ``counts`` (one per bin), ``n`` and ``mean_pct`` (NaN without values)."""

    window: Window
    bin_pct: float
    groups: list[dict[str, Any]]
    trust: Trust = field(default_factory=Trust)
    missing: list[str] = field(default_factory=list)

    @property
    def edges_pct(self) -> list[float]:
        bins = round(100.0 / self.bin_pct)
        return [i * self.bin_pct for i in range(bins + 1)]

    def group(self, pool: str) -> dict[str, Any] | None:
        return next((g for g in self.groups if g["pool"] == pool), None)

    def to_dict(self) -> dict[str, Any]:
        from analytics.jsonable import json_safe

        return json_safe(
            {
                "window": self.window.describe(),
                "bin_pct": self.bin_pct,
                "edges_pct": self.edges_pct,
                "groups": self.groups,
                "trust": self.trust.to_dict(),
                "missing": list(self.missing),
            }
        )


def check_bin_pct(value: Any) -> float:
    """``value`` as a bin width in percent; AnalyticsError naming the allowed widths otherwise."""
    allowed = ", ".join(f"{b:g}" for b in BIN_PCTS)
    try:
        b = float(value)
    except (TypeError, ValueError):
        raise AnalyticsError(f"bin_pct must be one of {allowed} (percent), got {value!r}") from None
    if not math.isfinite(b) or b not in BIN_PCTS:
        raise AnalyticsError(f"bin_pct must be one of {allowed} (percent), got {value!r}")
    return b


def activity_histogram(
    con: duckdb.DuckDBPyConnection, window: Window, *, bin_pct: float = DEFAULT_BIN_PCT
) -> ActivityHistogram:
    """SM activity and utilization % of ``window``'s GPU samples, binned by ``bin_pct`` percent
    (one of :data:`BIN_PCTS`), per pool and for the fleet. Trust labels are the samples' own
    (``trust_label``), plus host-bound when an emulated sample's window lagged."""
    bin_pct = check_bin_pct(bin_pct)
    bins = round(100.0 / bin_pct)
    preds: dict[str, str] = {}
    named: dict[str, Any] = {"start": window.start_s, "end": window.end_s, "bin": bin_pct, "bins": bins}
    for prefix, column in (("d", "node"), ("g", "g.node")):  # the node predicates' ? as named ones
        pred, params = window.node_sql(column)
        for i, v in enumerate(params):
            pred = pred.replace("?", f"${prefix}node{i}", 1)
            named[f"{prefix}node{i}"] = v
        preds[f"{prefix}pred"] = pred
    rows = con.execute(_SQL.format(**preds), named).fetchall()
    trust = Trust()
    missing: list[str] = []
    groups: dict[str, dict[str, Any]] = {}

    def group(key: str) -> dict[str, Any]:
        if key not in groups:
            groups[key] = {"pool": key, "gpus": 0, "samples": 0}
            for metric in METRICS:
                groups[key][metric] = {"counts": [0] * bins, "n": 0, "mean_pct": math.nan}
        return groups[key]

    totals: dict[tuple[str, str], float] = {}
    for pool, sm_bin, util_bin, gid, n, sm_total, util_total, gpus, labels, host_bound in rows:
        key = FLEET if gid in (_BY_SM, _BY_UTIL, _ALL) else str(pool)
        if gid in (_BY_POOL, _ALL):
            g = group(key)
            g["gpus"], g["samples"] = int(gpus), int(n)
            if gid == _ALL:
                for label in labels or []:
                    trust.add(str(label))
                if host_bound:
                    trust.add(
                        HOST_BOUND,
                        f"{int(host_bound)} samples from emulated windows the host could not keep pace with",
                    )
            continue
        by_sm = gid in (_BY_POOL_SM, _BY_SM)
        metric, b, total = ("sm_active", sm_bin, sm_total) if by_sm else ("gpu_util", util_bin, util_total)
        if b is None:  # the samples without this metric
            continue
        part = group(key)[metric]
        part["counts"][int(b)] = int(n)
        part["n"] += int(n)
        totals[key, metric] = totals.get((key, metric), 0.0) + float(total or 0.0)
    for (key, metric), total in totals.items():
        part = groups[key][metric]
        part["mean_pct"] = total / part["n"] if part["n"] else math.nan
    if FLEET not in groups or groups[FLEET]["samples"] == 0:
        groups.pop(FLEET, None)
        missing.append("no GPU samples in the window")
    for key, g in groups.items():
        name = "the fleet" if key == FLEET else f"pool {key}"
        if g["samples"] and not g["sm_active"]["n"]:
            missing.append(f"{name}: no SM activity in its samples (the source has no profiling metrics)")
        if g["samples"] and not g["gpu_util"]["n"]:
            missing.append(f"{name}: no utilization % in its samples")
    ordered = sorted(
        (g for k, g in groups.items() if k != FLEET), key=lambda g: _POOL_ORDER.get(g["pool"], 9)
    )
    if FLEET in groups:
        ordered.insert(0, groups[FLEET])
    trust.notes.append(f"sample counts per {bin_pct:g} % bin; each sample counts once")
    return ActivityHistogram(window, bin_pct, ordered, trust, missing)


_POOL_ORDER = {"prefill": 0, "decode": 1, "mixed": 2, "unknown": 3}
