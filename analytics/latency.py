"""Request latency: TTFT, TPOT, ITL and end-to-end percentiles, SLO attainment, over time.

Per request (the ``requests`` table; the store's ``request_latency`` view has the same formulas)::

    TTFT = first_token_s − arrival_s
    TPOT = (finish_s − first_token_s) / (output_tokens − 1)      (output_tokens > 1; else undefined)
    e2e  = finish_s − arrival_s
    ITL  = tokens.itl_s (gap between consecutive tokens of one request)

Percentiles are linear interpolation between order statistics (DuckDB ``quantile_cont``, numpy's
default), over the requests that finished ``ok`` and arrived in the window (ITL: the tokens generated
in it). SLO attainment (DistServe's definition): the share of requests arrived in the window that
meet both the TTFT and the TPOT SLO; a request with one output token has no TPOT and meets that SLO;
a request whose status is not ``ok`` (error, aborted, none recorded) misses it and is counted.

Where only an engine's Prometheus histograms are stored (``engine_metrics`` ``*_seconds_bucket``),
:func:`histogram_percentiles` estimates percentiles from the buckets as Prometheus'
``histogram_quantile`` does (linear inside the bucket holding the rank), labelled estimated with the
bucket bounds stated.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from analytics.iteration_groups import registered_groups
from analytics.jsonable import json_safe
from analytics.trust import EMULATED, ESTIMATED, HOST_BOUND, MEASURED, SIMULATED, Trust
from analytics.window import AnalyticsError, Window
from serving.sim.summary import SloSpec

__all__ = [
    "HISTOGRAM_METRICS",
    "LatencySummary",
    "Percentiles",
    "SloSpec",
    "bucket_quantile",
    "histogram_percentiles",
    "latency_summary",
]

QUANTILES = (0.5, 0.9, 0.99)
METRICS = ("ttft", "tpot", "itl", "e2e")
#: our metric → the normalised engine_metrics histogram (collector.sources.prometheus)
HISTOGRAM_METRICS = {
    "ttft": "ttft_seconds",
    "tpot": "tpot_seconds",
    "itl": "itl_seconds",
    "e2e": "e2e_seconds",
}
_NICE_BUCKETS_S = (1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 4 * 3600.0, 86400.0)


@dataclass(frozen=True, slots=True)
class Percentiles:
    """p50/p90/p99 and mean of one latency, in seconds (NaN with ``n == 0``). ``method``:
    ``exact`` (per request) or ``histogram`` (estimated from buckets; ``bounds_s`` the bucket each
    percentile fell in, ``(lower, upper)``)."""

    metric: str
    n: float
    p50_s: float
    p90_s: float
    p99_s: float
    mean_s: float
    method: str = "exact"
    bounds_s: dict[str, tuple[float, float]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self), inf_as_text=True)


@dataclass(slots=True)
class LatencySummary:
    """Latency percentiles (``percentiles``: metric → :class:`Percentiles`), SLO attainment over the
    window (``attainment``: both / ttft / tpot shares, counts), per time bucket (``over_time``), the
    requests by trust label and status, engine-histogram estimates (``estimated``) and the Trust."""

    slo: SloSpec
    requests: int
    ok: int
    failed: int
    by_status: dict[str, int]
    by_trust: dict[str, int]
    percentiles: dict[str, Percentiles]
    attainment: dict[str, float]
    over_time: pd.DataFrame
    bucket_s: float
    estimated: dict[str, Percentiles] = field(default_factory=dict)
    trust: Trust = field(default_factory=Trust)

    def to_dict(self) -> dict[str, Any]:
        return {
            "slo": {"ttft_s": self.slo.ttft_s, "tpot_s": self.slo.tpot_s},
            "requests": self.requests,
            "ok": self.ok,
            "failed": self.failed,
            "by_status": dict(self.by_status),
            "by_trust": dict(self.by_trust),
            "percentiles": {k: v.to_dict() for k, v in self.percentiles.items()},
            "attainment": json_safe(self.attainment, inf_as_text=True),
            "bucket_s": self.bucket_s,
            "over_time": json_safe(self.over_time.to_dict("records"), inf_as_text=True),
            "estimated": {k: v.to_dict() for k, v in self.estimated.items()},
            "trust": self.trust.to_dict(),
        }


def attainment_basis(latency: dict[str, Any]) -> str:
    """SLO attainment's denominator in words, from a latency part's JSON form: "45 of 50 requests;
    5 failed, each a miss" (or "; none failed") -- the one wording of the text, overview and report."""
    met = int((latency.get("attainment") or {}).get("met") or 0)
    requests, failed = int(latency.get("requests") or 0), int(latency.get("failed") or 0)
    failures = f"{failed:,} failed, each a miss" if failed else "none failed"
    return f"{met:,} of {requests:,} requests; {failures}"


def _bucket_for(duration_s: float, max_buckets: int = 120) -> float:
    for b in _NICE_BUCKETS_S:
        if duration_s / b <= max_buckets:
            return b
    return _NICE_BUCKETS_S[-1]


_REQUESTS_CTE = """
WITH wk AS (  -- each serving worker's GPUs: known, and whether any is emulated (devices rows)
    SELECT node, worker, bool_or(emulated) AS emulated FROM devices WHERE worker IS NOT NULL GROUP BY ALL
),
rq AS (
    SELECT r.arrival_s, coalesce(r.status, 'none') AS status, r.status = 'ok' AS ok,
           floor((r.arrival_s - $start) / $bucket) AS bucket,
           r.first_token_s - r.arrival_s AS ttft_s,
           CASE WHEN r.output_tokens > 1
                THEN (r.finish_s - r.first_token_s) / (r.output_tokens - 1) END AS tpot_s,
           r.finish_s - r.arrival_s AS e2e_s,
           coalesce(r.output_tokens, 0) <= 1 AS single_token,
           CASE WHEN starts_with(r.node, 'sim:') OR r.source = 'simulated' THEN 'simulated'
                WHEN coalesce(p.emulated, FALSE) OR coalesce(d.emulated, FALSE) THEN 'emulated'
                ELSE 'measured' END AS trust,
           p.worker IS NOT NULL OR d.worker IS NOT NULL AS gpu_known
    FROM requests r
    LEFT JOIN wk p ON p.node = r.node AND p.worker = r.prefill_worker
    LEFT JOIN wk d ON d.node = r.node AND d.worker = r.decode_worker
    WHERE {node} AND r.arrival_s >= $start AND r.arrival_s < $end
),
m AS (
    SELECT *, coalesce(ok AND ttft_s <= $slo_ttft, FALSE) AS meets_ttft,
           coalesce(ok AND (tpot_s <= $slo_tpot OR single_token), FALSE) AS meets_tpot
    FROM rq
)
"""

_AGG_COLUMNS = """count(*) AS requests, count(*) FILTER (WHERE ok) AS ok,
       count(*) FILTER (WHERE meets_ttft AND meets_tpot) AS met,
       count(*) FILTER (WHERE meets_ttft) AS met_ttft, count(*) FILTER (WHERE meets_tpot) AS met_tpot,
       count(*) FILTER (WHERE ok AND ttft_s IS NULL) AS no_first_token,
       count(*) FILTER (WHERE ok AND (ttft_s < 0 OR e2e_s < ttft_s)) AS negative,
       {aggs}"""
# the window's total, then per bucket: two plain aggregates (cheaper than GROUPING SETS, which
# feeds every row's quantile values to both groupings' states); the total also counts the requests
# per status and trust label (a pass of their own over the requests and their joins before)
_AGG_SQL = f"""
SELECT NULL::DOUBLE AS bucket, {_AGG_COLUMNS},
       histogram(status) AS by_status, histogram(trust) AS by_trust,
       count(*) FILTER (WHERE NOT gpu_known AND trust = 'measured') AS unknown_gpu
FROM m
UNION ALL
SELECT bucket, {_AGG_COLUMNS}, NULL, NULL, NULL FROM m GROUP BY bucket
ORDER BY bucket NULLS FIRST
"""

_ITL_SQL = """
SELECT floor((t.ts_s - ?) / ?) AS bucket, count(*) AS n,
       quantile_cont(t.itl_s, [0.5, 0.9, 0.99]) AS q, avg(t.itl_s) AS mean_s
FROM tokens t
WHERE {node} AND t.ts_s >= ? AND t.ts_s < ? AND t.itl_s IS NOT NULL
GROUP BY bucket
UNION ALL
SELECT NULL, count(*), quantile_cont(t.itl_s, [0.5, 0.9, 0.99]), avg(t.itl_s)
FROM tokens t
WHERE {node} AND t.ts_s >= ? AND t.ts_s < ? AND t.itl_s IS NOT NULL
"""

_HOST_BOUND_SQL = """
SELECT coalesce(sum(n), 0) AS iterations, coalesce(sum(lagged), 0) AS lagged FROM {groups} WHERE starts_in
"""


def _agg_columns() -> str:
    parts = []
    for metric in ("ttft", "tpot", "e2e"):
        col = f"{metric}_s"
        parts.append(f"count({col}) FILTER (WHERE ok) AS {metric}_n")
        parts.append(f"avg({col}) FILTER (WHERE ok) AS {metric}_mean_s")
        parts.append(f"quantile_cont({col}, [0.5, 0.9, 0.99]) FILTER (WHERE ok) AS {metric}_q")
    return ",\n       ".join(parts)


def _counts(total: dict[str, Any] | None) -> list[tuple[str, str, int]]:
    """``(kind, value, requests)`` rows from the total row of ``_AGG_SQL``: per status, per trust
    label, and the measured requests whose workers have no devices row (``unknown_gpu``)."""
    if total is None:
        return []
    rows = [("status", str(v), int(n)) for v, n in (total["by_status"] or {}).items()]
    rows += [("trust", str(v), int(n)) for v, n in (total["by_trust"] or {}).items()]
    rows.append(("unknown_gpu", "measured", int(total["unknown_gpu"] or 0)))
    return rows


def _nan_if_none(x: Any) -> float:
    return float("nan") if x is None else float(x)


def _percentiles(metric: str, n: Any, mean: Any, q: Any) -> Percentiles:
    if not n or q is None:
        nan = float("nan")
        return Percentiles(metric, 0, nan, nan, nan, nan)
    return Percentiles(metric, int(n), float(q[0]), float(q[1]), float(q[2]), _nan_if_none(mean))


def latency_summary(
    con: duckdb.DuckDBPyConnection,
    window: Window,
    slo: SloSpec | None = None,
    *,
    bucket_s: float | None = None,
    iteration_groups: pa.Table | None = None,
) -> LatencySummary:
    """TTFT/TPOT/ITL/e2e percentiles and SLO attainment over ``window`` and per ``bucket_s``
    (default: a round size giving at most 120 buckets), with trust labels per request: simulated
    (a scenario), emulated (a worker that served it ran on an emulated GPU: its ``devices`` rows),
    else measured; host-bound when the window's iterations lagged. Engine histograms in the window
    give ``estimated`` percentiles (and the headline ones when no request rows exist). All of it is
    aggregated in DuckDB; only per-bucket rows reach Python. The lagged iterations (those starting in
    the window) are counted from its :func:`analytics.iteration_groups.iteration_groups`
    (``iteration_groups`` when already computed)."""
    slo = slo or SloSpec()
    if not (slo.ttft_s > 0 and slo.tpot_s > 0):
        raise AnalyticsError(f"SLOs must be > 0 seconds, got TTFT {slo.ttft_s!r}, TPOT {slo.tpot_s!r}")
    if bucket_s is not None and not bucket_s > 0:
        raise AnalyticsError(f"bucket_s must be > 0, got {bucket_s!r}")
    bucket = float(bucket_s) if bucket_s is not None else _bucket_for(window.duration_s)
    trust = Trust()
    pred, params = window.node_sql("r.node")
    named = {"start": window.start_s, "end": window.end_s, "bucket": bucket}
    named |= {"slo_ttft": slo.ttft_s, "slo_tpot": slo.tpot_s}
    for i, v in enumerate(params):  # the node predicate's ? parameters, as named ones
        pred = pred.replace("?", f"$node{i}", 1)
        named[f"node{i}"] = v
    cte = _REQUESTS_CTE.format(node=pred)
    cur = con.execute(cte + _AGG_SQL.format(aggs=_agg_columns()), named)
    names = [d[0] for d in cur.description]
    agg = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    total = next((r for r in agg if r["bucket"] is None), None)
    counts = _counts(total)
    n = int(total["requests"]) if total is not None else 0
    ok = int(total["ok"]) if total is not None else 0
    by_status = {str(v): int(c) for k, v, c in sorted(counts, key=str) if k == "status"}
    by_trust = {str(v): int(c) for k, v, c in sorted(counts, key=str) if k == "trust"}
    unknown = sum(int(c) for k, _, c in counts if k == "unknown_gpu")
    for label in (SIMULATED, EMULATED, MEASURED):
        if by_trust.get(label):
            trust.add(label)
    if window.simulated:
        trust.add(SIMULATED, "a simulated scenario: virtual time and the GPU model")
    failed = n - ok
    if failed:
        trust.notes.append(
            f"{failed} of {n} requests did not finish ok ("
            + ", ".join(f"{k}: {v}" for k, v in sorted(by_status.items()) if k != "ok")
            + "): counted as missing the SLO, left out of the percentiles"
        )
    if total is not None and total["no_first_token"]:
        trust.notes.append(
            f"{int(total['no_first_token'])} ok requests have no first-token time: counted as missing the SLO"
        )
    if total is not None and total["negative"]:
        trust.notes.append(
            f"{int(total['negative'])} ok requests have a first token before their arrival or after their "
            "finish (clock skew between sources?): kept in the percentiles as stored"
        )
    if unknown and not window.simulated:
        trust.notes.append(
            f"{unknown} requests' workers have no devices row: labelled measured by their row, GPU unknown"
        )

    percentiles: dict[str, Percentiles] = {}
    for metric in ("ttft", "tpot", "e2e"):
        if total is None:
            percentiles[metric] = _percentiles(metric, 0, None, None)
        else:
            percentiles[metric] = _percentiles(
                metric, total[f"{metric}_n"], total[f"{metric}_mean_s"], total[f"{metric}_q"]
            )
    tpred, tparams = window.node_sql("t.node")
    itl_rows = con.execute(
        _ITL_SQL.format(node=tpred),
        [
            window.start_s,
            bucket,
            *tparams,
            window.start_s,
            window.end_s,
            *tparams,
            window.start_s,
            window.end_s,
        ],
    ).fetchall()
    itl_by_bucket = {r[0]: r for r in itl_rows if r[0] is not None}
    itl_all = next((r for r in itl_rows if r[0] is None), None)
    percentiles["itl"] = (
        _percentiles("itl", itl_all[1], itl_all[3], itl_all[2])
        if itl_all
        else _percentiles("itl", 0, None, None)
    )

    nan = float("nan")
    attainment = {
        "both": int(total["met"]) / n if n else nan,
        "ttft": int(total["met_ttft"]) / n if n else nan,
        "tpot": int(total["met_tpot"]) / n if n else nan,
        "met": int(total["met"]) if n else 0,
        "requests": n,
    }
    over_time = _over_time([r for r in agg if r["bucket"] is not None], window, bucket, itl_by_bucket)

    with registered_groups(con, window, iteration_groups) as groups:
        iters, lagged = con.execute(_HOST_BOUND_SQL.format(groups=groups)).fetchall()[0]
    if lagged:
        trust.add(
            HOST_BOUND,
            f"{lagged} of {iters} iterations in the window lagged their modeled time (host-bound "
            "emulation): latencies include host time the modeled GPU would not take",
        )

    estimated = histogram_percentiles(con, window)
    if estimated:
        trust.notes.append(
            "engine histograms: percentiles estimated from buckets (see estimated[...].bounds_s)"
        )
        if not n:
            trust.add(ESTIMATED, "no request rows in the window: the headline percentiles are the engine's")
            trust.add(SIMULATED if window.simulated else MEASURED)
            percentiles = {**percentiles, **estimated}
    if not n and not estimated:
        trust.notes.append("no requests and no engine latency histograms in the window: nothing to report")
    return LatencySummary(
        slo=slo,
        requests=n,
        ok=ok,
        failed=failed,
        by_status=by_status,
        by_trust=by_trust,
        percentiles=percentiles,
        attainment=attainment,
        over_time=over_time,
        bucket_s=bucket,
        estimated=estimated,
        trust=trust,
    )


def _over_time(
    agg: list[dict[str, Any]], window: Window, bucket: float, itl_by_bucket: dict[Any, Any]
) -> pd.DataFrame:
    cols = ["bucket_start_s", "requests", "failed", "met", "attainment"]
    cols += [f"{m}_p{p}_s" for m in METRICS for p in (50, 90, 99)]
    by = {float(r["bucket"]): r for r in agg}
    buckets = sorted(set(by) | {float(b) for b in itl_by_bucket})
    if not buckets:
        return pd.DataFrame(columns=cols)
    nan = float("nan")
    rows = []
    for b in buckets:
        r = by.get(b)
        row: dict[str, Any] = {"bucket_start_s": window.start_s + b * bucket}
        row["requests"] = int(r["requests"]) if r else 0
        row["failed"] = int(r["requests"] - r["ok"]) if r else 0
        row["met"] = int(r["met"]) if r else 0
        row["attainment"] = row["met"] / row["requests"] if row["requests"] else nan
        for m in ("ttft", "tpot", "e2e"):
            q = r[f"{m}_q"] if r else None
            for i, p in enumerate((50, 90, 99)):
                row[f"{m}_p{p}_s"] = _nan_if_none(q[i]) if q is not None else nan
        itl = itl_by_bucket.get(b)
        for i, p in enumerate((50, 90, 99)):
            row[f"itl_p{p}_s"] = _nan_if_none(itl[2][i]) if itl is not None and itl[2] is not None else nan
        rows.append(row)
    return pd.DataFrame(rows, columns=cols)


# -- engine histograms --------------------------------------------------------------------------------

_HIST_SQL = """
WITH s AS (
    SELECT node, endpoint, metric, labels, ts_s, value,
           value - lag(value) OVER (PARTITION BY node, endpoint, metric, labels ORDER BY ts_s) AS d
    FROM engine_metrics
    WHERE {node} AND ts_s >= ? AND ts_s < ? AND metric IN ({metrics}) AND value IS NOT NULL
),
inc AS (  -- increase per series over the window; a drop is a restart: the new value is the increase
    SELECT node, endpoint, metric, labels,
           sum(CASE WHEN d IS NULL THEN 0 WHEN d < 0 THEN value ELSE d END) AS increase,
           count(*) FILTER (WHERE d < 0) AS resets
    FROM s GROUP BY ALL
)
SELECT metric, json_extract_string(labels, '$.le') AS le, sum(increase) AS increase, sum(resets) AS resets
FROM inc GROUP BY ALL
"""


def _le(text: str | None) -> float:
    if text is None:
        return float("nan")
    t = text.strip().lower()
    if t in ("+inf", "inf"):
        return math.inf
    try:
        return float(t)
    except ValueError:
        return float("nan")


def bucket_quantile(
    q: float, bounds: list[float], cumulative: list[float]
) -> tuple[float, tuple[float, float]]:
    """Prometheus ``histogram_quantile``: ``bounds`` the buckets' upper bounds ascending (the last
    +Inf), ``cumulative`` their cumulative counts. Rank = q × total; within the first bucket whose
    count reaches the rank, linear between its lower and upper bound (the first bucket's lower bound
    is 0 when its upper bound is positive). A rank in the +Inf bucket gives the largest finite bound.
    Returns the estimate and the bucket ``(lower, upper)`` it lies in; NaN when the total is 0."""
    if not 0 <= q <= 1:
        raise AnalyticsError(f"quantile must be in [0, 1], got {q!r}")
    if len(bounds) < 2 or not math.isinf(bounds[-1]):
        return float("nan"), (float("nan"), float("nan"))
    total = cumulative[-1]
    if not total > 0:
        return float("nan"), (float("nan"), float("nan"))
    rank = q * total
    for i, (ub, c) in enumerate(zip(bounds, cumulative, strict=True)):
        if c >= rank:
            if math.isinf(ub):
                return bounds[-2], (bounds[-2], math.inf)
            lower = bounds[i - 1] if i else (0.0 if ub > 0 else ub)
            below = cumulative[i - 1] if i else 0.0
            inside = c - below
            if inside <= 0:
                return ub, (lower, ub)
            return lower + (ub - lower) * (rank - below) / inside, (lower, ub)
    return bounds[-2], (bounds[-2], math.inf)  # pragma: no cover - the +Inf bucket holds the total


def histogram_percentiles(con: duckdb.DuckDBPyConnection, window: Window) -> dict[str, Percentiles]:
    """p50/p90/p99 estimated from the engines' latency histograms (``engine_metrics``
    ``<metric>_bucket`` rows, cumulative counts with an ``le`` label) over ``window``: each series'
    increase between its first and last scrape in the window (a drop counts as a restart), summed
    over series per bucket, then :func:`bucket_quantile`. The mean is Δsum / Δcount. Metrics with no
    buckets in the window are absent."""
    pred, params = window.node_sql("node")
    names = [f"{h}{suf}" for h in HISTOGRAM_METRICS.values() for suf in ("_bucket", "_sum", "_count")]
    marks = ", ".join("?" for _ in names)
    rows = con.execute(
        _HIST_SQL.format(node=pred, metrics=marks), [*params, window.start_s, window.end_s, *names]
    ).fetchall()
    by_metric: dict[str, dict[str, Any]] = {}
    for metric, le, increase, _resets in rows:
        base, _, suffix = metric.rpartition("_")
        entry = by_metric.setdefault(base, {"buckets": {}, "sum": None, "count": None})
        if suffix == "bucket":
            bound = _le(le)
            if not math.isnan(bound):
                entry["buckets"][bound] = entry["buckets"].get(bound, 0.0) + float(increase)
        elif suffix in ("sum", "count"):
            entry[suffix] = float(increase)
    out: dict[str, Percentiles] = {}
    for ours, hist in HISTOGRAM_METRICS.items():
        entry = by_metric.get(hist)
        if not entry or not entry["buckets"]:
            continue
        bounds = sorted(entry["buckets"])
        cumulative = [entry["buckets"][b] for b in bounds]
        cumulative = [float(c) for c in np.maximum.accumulate(cumulative)]  # cumulative; guard rounding
        if not math.isinf(bounds[-1]) or not cumulative[-1] > 0:
            continue
        estimates = {f"p{int(q * 100)}": bucket_quantile(q, bounds, cumulative) for q in QUANTILES}
        total = cumulative[-1]
        mean = entry["sum"] / entry["count"] if entry["sum"] is not None and entry["count"] else float("nan")
        out[ours] = Percentiles(
            ours,
            total,
            estimates["p50"][0],
            estimates["p90"][0],
            estimates["p99"][0],
            mean,
            method="histogram",
            bounds_s={k: v[1] for k, v in estimates.items()},
        )
    return out
