"""Observe the workload of a stored window: from the bundled stack's per-request rows (``requests``:
every arrival time and token count), or from an external fleet's engine metrics (``engine_metrics``:
vLLM's ``request_prompt_tokens`` / ``request_generation_tokens`` histograms, Dynamo's
``input_sequence_tokens`` / ``output_sequence_tokens``, counted per scrape).

:func:`observe` picks the source (``auto``: the requests where the window has any, else the engine
histograms) and says clearly when a window has neither.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd

from analytics.trust import ESTIMATED, MEASURED, SIMULATED, Trust
from analytics.window import AnalyticsError, Window
from analytics.workload import arrivals
from analytics.workload.model import (
    BINS_PER_DOUBLING,
    ENGINE_HISTOGRAMS,
    REQUESTS,
    JointLengths,
    LengthStats,
    Workload,
    log_edges,
)
from serving.trace import TraceRequest

AUTO = "auto"
#: pairs of (prompt, output) tokens kept from a requests window (a reservoir sample; the joint exactly)
RETAINED_PAIRS = 2048
NO_PREFIX_NOTE = (
    "not known: the bundled stack keeps no prefix cache and its request rows carry no cached-token count"
)


def observe(con: duckdb.DuckDBPyConnection, window: Window, *, source: str = AUTO, seed: int = 0) -> Workload:
    """The workload of ``window``; ``source`` is ``auto``, ``requests`` or ``engine_histograms``.
    AnalyticsError naming the window and what was looked for when it holds nothing to observe."""
    if source not in (AUTO, REQUESTS, ENGINE_HISTOGRAMS):
        raise AnalyticsError(
            f"unknown workload source {source!r}; use auto, {REQUESTS} or {ENGINE_HISTOGRAMS}", "source"
        )
    if source in (AUTO, REQUESTS):
        nodes, params = window.node_sql("node")
        n = con.execute(
            f"SELECT count(*) FROM requests WHERE {nodes} AND arrival_s >= ? AND arrival_s < ?",
            [*params, window.start_s, window.end_s],
        ).fetchone()[0]
        if n or source == REQUESTS:
            return observe_requests(con, window, seed=seed)
    return observe_engine_histograms(con, window)


# -- the bundled stack's requests -----------------------------------------------------------------

_LENGTHS_SQL = """
SELECT (1 + ceil({b} * log2(greatest(prompt_tokens, 1))))::INTEGER AS pi,
       (1 + ceil({b} * log2(greatest(output_tokens, 1))))::INTEGER AS oi,
       count(*) AS n
FROM requests
WHERE {nodes} AND arrival_s >= ? AND arrival_s < ? AND prompt_tokens > 0 AND output_tokens > 0
GROUP BY ALL
"""

_STATS_SQL = """
SELECT count(*), avg(prompt_tokens), quantile_cont(prompt_tokens, [0.5, 0.9, 0.99]),
       avg(output_tokens), quantile_cont(output_tokens, [0.5, 0.9, 0.99])
FROM requests
WHERE {nodes} AND arrival_s >= ? AND arrival_s < ? AND prompt_tokens > 0 AND output_tokens > 0
"""

# (a sample of the FROM clause is taken before WHERE: the window's rows are sampled in a subquery)
_PAIRS_SQL = """
SELECT prompt_tokens, output_tokens FROM (
    SELECT prompt_tokens, output_tokens FROM requests
    WHERE {nodes} AND arrival_s >= ? AND arrival_s < ? AND prompt_tokens > 0 AND output_tokens > 0
) USING SAMPLE reservoir({n} ROWS) REPEATABLE ({seed})
"""


def observe_requests(con: duckdb.DuckDBPyConnection, window: Window, *, seed: int = 0) -> Workload:
    """The workload of ``window`` from its ``requests`` rows: every arrival (failed requests too:
    they were offered load), the lengths of those with prompt and output tokens."""
    nodes, params = window.node_sql("node")
    bounds = [*params, window.start_s, window.end_s]
    got = con.execute(
        f"SELECT arrival_s, trust_label(node, source) AS trust FROM requests "
        f"WHERE {nodes} AND arrival_s >= ? AND arrival_s < ? ORDER BY arrival_s",
        bounds,
    ).fetchnumpy()
    times = np.asarray(got["arrival_s"], dtype=float)
    if not len(times):
        raise AnalyticsError(
            f"no requests arrived in the window ({window.label()}): nothing to observe; widen --since, "
            "pick another dataset, or observe an external fleet's engine histograms"
        )
    trust = Trust()
    for label in sorted(set(got["trust"].tolist())):
        trust.add(label, "a simulated scenario's requests" if label == SIMULATED else None)
    n_len, p_mean, p_q, o_mean, o_q = con.execute(_STATS_SQL.format(nodes=nodes), bounds).fetchone()
    if not n_len:
        raise AnalyticsError(
            f"none of the {len(times)} requests of the window ({window.label()}) has prompt and output token "
            "counts: no length distribution to observe"
        )
    if n_len < len(times):
        trust.notes.append(
            f"{len(times) - n_len} of {len(times)} requests without prompt or output tokens (failed before "
            "a token): counted as arrivals, not in the lengths"
        )
    cells_df = con.execute(_LENGTHS_SQL.format(b=BINS_PER_DOUBLING, nodes=nodes), bounds).df()
    n_bins = (int(max(cells_df["pi"].max(), cells_df["oi"].max())) + 2) if len(cells_df) else 2
    edges = log_edges(n_bins)
    cells = [(int(i), int(j), float(c)) for i, j, c in cells_df.itertuples(index=False)]
    pairs = con.execute(_PAIRS_SQL.format(nodes=nodes, n=RETAINED_PAIRS, seed=int(seed)), bounds).fetchall()
    lengths = JointLengths(edges, edges, cells, True, [(int(p), int(o)) for p, o in pairs])
    return workload_from_arrivals(
        REQUESTS,
        window,
        times,
        lengths,
        LengthStats(float(p_mean), *map(float, p_q)),
        LengthStats(float(o_mean), *map(float, o_q)),
        None,
        NO_PREFIX_NOTE,
        trust,
    )


def workload_from_arrivals(
    source: str,
    window: Window,
    times: np.ndarray,
    lengths: JointLengths,
    prompt: LengthStats,
    output: LengthStats,
    prefix: float | None,
    prefix_note: str,
    trust: Trust,
) -> Workload:
    """A workload from arrival times (the requests' own, or a trace's) and what was measured of
    their lengths: the rate curve, hourly rates and burstiness computed here."""
    interval = arrivals.curve_interval_s(window.duration_s, len(times))
    curve = arrivals.rate_curve(times, window.start_s, window.end_s, interval)
    b = arrivals.burstiness(times, curve, window.start_s, window.end_s)
    return Workload(
        source=source,
        window=window.describe(),
        request_count=len(times),
        mean_rps=len(times) / window.duration_s,
        rate_curve=curve,
        hourly_rps=arrivals.hourly_rps(curve, window.end_s),
        interarrival_cv=b.interarrival_cv,
        burstiness_cv=b.burstiness_cv,
        gamma_shape=b.gamma_shape,
        dispersion_index=b.dispersion_index,
        dispersion_interval_s=b.dispersion_interval_s,
        lengths=lengths,
        prompt_tokens=prompt,
        output_tokens=output,
        prefix_reuse_ratio=prefix,
        prefix_reuse_note=prefix_note,
        trust=trust,
    )


# -- an external fleet's engine histograms --------------------------------------------------------

#: engine_metrics names (normalised by collector/sources/prometheus.py) read here
_HIST = ("input_sequence_tokens", "output_sequence_tokens")
_COUNTERS = (
    *(f"{h}_{s}" for h in _HIST for s in ("bucket", "count", "sum")),
    "prefix_cache_hits_total",
    "prefix_cache_queries_total",
)
_GAUGES = ("prefix_cache_hit_ratio", "cache_hit_rate")
#: how far before the window a counter's last value is looked for (the base of its first increase)
_LOOKBACK_S = 3600.0

# Each counter's increase per scrape, (prev_ts_s, ts_s]: a counter that went down restarted, its new
# value is the increase (as the collector counts it). The bundled router (engine 'phaselens') is left
# out: its requests are observed from the requests rows.
_INCREASES_SQL = """
WITH s AS (
    SELECT node, endpoint, engine, metric, labels->>'le' AS le, ts_s, value,
           lag(value) OVER w AS prev, lag(ts_s) OVER w AS prev_ts
    FROM engine_metrics
    WHERE {nodes} AND metric IN ({metrics}) AND ts_s >= ? AND ts_s < ? AND value IS NOT NULL
      AND (engine IS NULL OR engine <> 'phaselens')
    WINDOW w AS (PARTITION BY node, endpoint, metric, labels::VARCHAR ORDER BY ts_s)
)
SELECT node || ' ' || endpoint AS series, engine, metric, le, prev_ts AS from_s, ts_s AS to_s,
       CASE WHEN value >= prev THEN value - prev ELSE value END AS inc
FROM s WHERE prev IS NOT NULL AND ts_s >= ?
"""

_GAUGES_SQL = """
SELECT metric, avg(value) AS value, count(*) AS n FROM engine_metrics
WHERE {nodes} AND metric IN ({metrics}) AND ts_s >= ? AND ts_s < ? AND value IS NOT NULL
  AND (engine IS NULL OR engine <> 'phaselens')
GROUP BY metric
"""


def observe_engine_histograms(con: duckdb.DuckDBPyConnection, window: Window) -> Workload:
    """The workload of ``window`` from the engines' per-request length histograms: the requests
    counted per scrape (the histograms' ``_count``) make the rate curve and the index of dispersion;
    the buckets make the two length marginals. A Dynamo frontend sees every request once: where one
    is scraped its histograms are used alone, else the engines' (vLLM) summed."""
    nodes, params = window.node_sql("node")
    marks = ", ".join("?" for _ in _COUNTERS)
    df = con.execute(
        _INCREASES_SQL.format(nodes=nodes, metrics=marks),
        [*params, *_COUNTERS, window.start_s - _LOOKBACK_S, window.end_s, window.start_s],
    ).df()
    hist = df[df["metric"].str.startswith(_HIST)]
    if hist.empty:
        raise AnalyticsError(
            f"nothing to observe in the window ({window.label()}): no requests rows, and no engine "
            "per-request length histograms (vLLM request_prompt_tokens / request_generation_tokens, Dynamo "
            "input/output_sequence_tokens) scraped twice or more in it (SGLang's metrics carry no "
            "per-request lengths); widen --since or pick another dataset"
        )
    trust = Trust()
    if window.simulated:
        trust.add(SIMULATED, "a simulated fleet's engine pages (a scenario's rows)")
    else:
        trust.add(MEASURED, "request counts and lengths from the engines' histograms")
    if (hist["engine"] == "dynamo").any():
        hist = hist[hist["engine"] == "dynamo"]
        trust.notes.append("lengths and rates from the Dynamo frontend (each request counted once)")
    count = hist[hist["metric"] == "input_sequence_tokens_count"]
    n_requests = float(count["inc"].sum())
    if n_requests <= 0:
        raise AnalyticsError(
            f"the engines counted no requests in the window ({window.label()}): nothing to observe"
        )
    covered_from = max(window.start_s, float(count["from_s"].min()))
    covered_to = min(window.end_s, float(count["to_s"].max()))
    span = Window(covered_from, max(covered_to, covered_from + 1e-6), window.dataset, window.nodes)
    if covered_from > window.start_s + 1 or covered_to < window.end_s - 60:
        trust.notes.append(
            f"the engines were scraped over {span.duration_s:.0f} s of the {window.duration_s:.0f} s window: "
            "the rate is over the scraped span"
        )
    interval = arrivals.curve_interval_s(span.duration_s, int(n_requests))
    at = ((count["from_s"] + count["to_s"]) / 2).to_numpy(dtype=float)
    curve = arrivals.curve_from_counts(
        at, count["inc"].to_numpy(dtype=float), span.start_s, span.end_s, interval
    )
    idx, scrape_s = arrivals.dispersion_of_increases(
        [
            (g["from_s"].to_numpy(float), g["to_s"].to_numpy(float), g["inc"].to_numpy(float))
            for _, g in count.groupby("series")
        ],
        curve,
        span.end_s,
    )
    cv = float(np.sqrt(idx)) if idx is not None else None
    trust.add(
        ESTIMATED,
        "length percentiles interpolated in the histograms' buckets; the joint prompt/output distribution "
        "is the product of the two marginals (the engines export no joint), so the two are taken as "
        "independent",
    )
    if idx is not None:
        trust.notes.append(
            f"burstiness from the counts per scrape (~{scrape_s:.0f} s): CV ≈ √(index of dispersion), "
            "no single arrival time is seen"
        )
    prompt_edges, prompt_counts = _marginal(hist, "input_sequence_tokens")
    output_edges, output_counts = _marginal(hist, "output_sequence_tokens")
    cells = [
        (i, j, float(p * o / output_counts.sum()))
        for i, p in enumerate(prompt_counts)
        if p > 0
        for j, o in enumerate(output_counts)
        if o > 0
    ]
    lengths = JointLengths(prompt_edges, output_edges, cells, joint=False)
    prefix, prefix_note = _prefix_reuse(con, window, df)
    return Workload(
        source=ENGINE_HISTOGRAMS,
        window=span.describe(),
        request_count=round(n_requests),
        mean_rps=n_requests / span.duration_s,
        rate_curve=curve,
        hourly_rps=arrivals.hourly_rps(curve, span.end_s),
        interarrival_cv=None,
        burstiness_cv=cv,
        gamma_shape=1.0 / idx if idx else None,
        dispersion_index=idx,
        dispersion_interval_s=scrape_s,
        lengths=lengths,
        prompt_tokens=_stats(hist, "input_sequence_tokens", lengths, "prompt"),
        output_tokens=_stats(hist, "output_sequence_tokens", lengths, "output"),
        prefix_reuse_ratio=prefix,
        prefix_reuse_note=prefix_note,
        trust=trust,
    )


def _marginal(hist: pd.DataFrame, name: str) -> tuple[list[float], np.ndarray]:
    """``(edges, counts)`` of one length histogram over the window, summed over its series; a series
    without one of the others' bucket bounds counts up to its own next lower bound there."""
    b = hist[(hist["metric"] == f"{name}_bucket") & hist["le"].notna()].copy()
    if b.empty:
        raise AnalyticsError(f"the engines' {name} histogram has no buckets in the window")
    b["bound"] = b["le"].map(lambda s: np.inf if s in ("+Inf", "Inf", "inf") else float(s))
    per = b.groupby(["series", "bound"])["inc"].sum()
    bounds = np.sort(b["bound"].unique())
    total = np.zeros(len(bounds))
    for _, s in per.groupby(level="series"):
        own = s.droplevel("series").sort_index()
        k = np.searchsorted(own.index.to_numpy(), bounds, side="right") - 1
        total += np.where(k >= 0, own.to_numpy()[np.maximum(k, 0)], 0.0)
    counts = np.diff(np.concatenate(([0.0], np.maximum.accumulate(total))))
    return [0.0, *bounds.tolist()], counts


def _stats(hist: pd.DataFrame, name: str, lengths: JointLengths, axis: str) -> LengthStats:
    s = hist.loc[hist["metric"] == f"{name}_sum", "inc"].sum()
    n = hist.loc[hist["metric"] == f"{name}_count", "inc"].sum()
    return LengthStats(
        float(s / n) if n > 0 else None,
        lengths.percentile(axis, 50),
        lengths.percentile(axis, 90),
        lengths.percentile(axis, 99),
    )


def _prefix_reuse(
    con: duckdb.DuckDBPyConnection, window: Window, df: pd.DataFrame
) -> tuple[float | None, str]:
    """vLLM's prefix cache hit tokens / queried tokens; else the mean of a hit-ratio gauge (Dynamo
    worker's ``prefix_cache_hit_ratio``, SGLang's ``cache_hit_rate``); else None, said why."""
    queries = df.loc[df["metric"] == "prefix_cache_queries_total", "inc"].sum()
    hits = df.loc[df["metric"] == "prefix_cache_hits_total", "inc"].sum()
    if queries > 0:
        return float(hits / queries), "vLLM prefix cache: hit tokens / queried tokens over the window"
    nodes, params = window.node_sql("node")
    marks = ", ".join("?" for _ in _GAUGES)
    rows = con.execute(
        _GAUGES_SQL.format(nodes=nodes, metrics=marks), [*params, *_GAUGES, window.start_s, window.end_s]
    ).fetchall()
    for metric, value, _n in rows:
        return float(value), f"mean of the engines' {metric} gauge over the window"
    return None, "not known: the engines export no prefix-cache counters or hit-ratio gauge in the window"


# -- the window's requests as a trace -------------------------------------------------------------

_TRACE_SQL = """
SELECT arrival_s, prompt_tokens, output_tokens FROM requests
WHERE {nodes} AND arrival_s >= ? AND arrival_s < ? AND prompt_tokens > 0 AND output_tokens > 0
ORDER BY arrival_s
"""


def requests_trace(con: duckdb.DuckDBPyConnection, window: Window) -> list[TraceRequest]:
    """The window's requests as a trace to replay (``serving.trace.TraceRequest``, arrivals in seconds
    from the window's first, in arrival order): each one's own arrival and token counts, so a
    simulation of it sees the observed traffic itself. Requests without prompt and output tokens
    (failed before a token) are left out, as from :func:`observe_requests`' lengths."""
    nodes, params = window.node_sql("node")
    rows = con.execute(_TRACE_SQL.format(nodes=nodes), [*params, window.start_s, window.end_s]).fetchall()
    if not rows:
        return []
    t0 = float(rows[0][0])
    return [TraceRequest(float(a) - t0, int(p), int(o)) for a, p, o in rows]


_DISPATCH_SQL = """
SELECT node || '/' || prefill_worker AS prefill_worker, arrival_s, first_scheduled_s FROM requests
WHERE {nodes} AND arrival_s >= ? AND arrival_s < ? AND first_scheduled_s IS NOT NULL
  AND prefill_worker IS NOT NULL
"""


def dispatch_rows(con: duckdb.DuckDBPyConnection, window: Window) -> list[dict[str, object]]:
    """The window's scheduled requests as ``serving.sim.device_model.dispatch_delays_s`` takes them:
    ``arrival_s``, ``first_scheduled_s`` and ``prefill_worker`` (``<node>/<worker>``: worker ids
    repeat across nodes)."""
    nodes, params = window.node_sql("node")
    df = con.execute(_DISPATCH_SQL.format(nodes=nodes), [*params, window.start_s, window.end_s]).df()
    return df.to_dict("records")
