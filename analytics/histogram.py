"""Binned SM activity and utilization % per pool: the histogram behind the dashboard's Bimodal page.

:func:`activity_histogram` counts a window's GPU samples (``gpu_samples`` with the device attributes
in effect at each sample, ``gpu_samples_full``) in bins of ``bin_pct`` percent, per pool (the GPU's
role: prefill, decode, mixed, unknown) and for the whole fleet, in DuckDB: only the counts leave the
store, never the samples. A value of exactly 100 % falls in the last bin; values outside [0, 100] are
clipped into the end bins. Each sample counts once (the collector samples at a fixed period, so
counts are proportional to time). The mixture centres and the dip test of the same window are the
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

_SQL = """
WITH s AS (
    SELECT coalesce(role, 'unknown') AS pool, node, source, device, "index",
           sm_active_pct, gpu_util_pct, host_bound_pct,
           trust_label(node, source, emulated) AS trust
    FROM gpu_samples_full
    WHERE {pred} AND ts_s >= ? AND ts_s < ?
),
v AS (
    SELECT pool, 'sm_active' AS metric, sm_active_pct AS x FROM s WHERE isfinite(sm_active_pct)
    UNION ALL
    SELECT pool, 'gpu_util', gpu_util_pct FROM s WHERE isfinite(gpu_util_pct)
)
SELECT pool, metric, least(greatest(floor(x / ?), 0), ? - 1)::INTEGER AS bin, count(*) AS n, sum(x) AS total
FROM v GROUP BY GROUPING SETS ((pool, metric, bin), (metric, bin))
"""

_META_SQL = """
SELECT coalesce(role, 'unknown') AS pool,
       count(DISTINCT (node, source, device, "index")) AS gpus,
       count(*) AS samples,
       list(DISTINCT trust_label(node, source, emulated)) AS trust,
       count(*) FILTER (WHERE host_bound_pct > 0) AS host_bound_samples
FROM gpu_samples_full
WHERE {pred} AND ts_s >= ? AND ts_s < ?
GROUP BY GROUPING SETS ((pool), ())
"""


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
    pred, params = window.node_sql("node")
    bounds = [window.start_s, window.end_s]
    rows = con.execute(_SQL.format(pred=pred), [*params, *bounds, bin_pct, bins]).fetchall()
    meta = con.execute(_META_SQL.format(pred=pred), [*params, *bounds]).fetchall()
    trust = Trust()
    missing: list[str] = []
    groups: dict[str, dict[str, Any]] = {}
    for pool, gpus, samples, labels, host_bound in meta:
        key = FLEET if pool is None else str(pool)
        groups[key] = {"pool": key, "gpus": int(gpus), "samples": int(samples)}
        for metric in METRICS:
            groups[key][metric] = {"counts": [0] * bins, "n": 0, "mean_pct": math.nan}
        if pool is None:
            for label in labels or []:
                trust.add(str(label))
            if host_bound:
                trust.add(
                    HOST_BOUND,
                    f"{int(host_bound)} samples from emulated windows the host could not keep pace with",
                )
    totals: dict[tuple[str, str], float] = {}
    for pool, metric, b, n, total in rows:
        key = FLEET if pool is None else str(pool)
        part = groups[key][metric]
        part["counts"][int(b)] = int(n)
        part["n"] += int(n)
        totals[key, metric] = totals.get((key, metric), 0.0) + float(total)
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
