"""GPU metrics over time, bucketed in DuckDB for charts of a whole fleet: the dashboard's GPUs page.

:func:`gpu_series` averages a window's GPU samples per GPU and time bucket, in the store, so that a
chart gets at most ``max_points`` values per metric (GPUs x buckets) whatever the window: 64 GPUs over
an hour of 100 ms samples (2.3 M rows) leave the store as 64 x 60 one-minute means per metric.

The bucket width is the smallest of :data:`BUCKET_STEPS_S` (0.1 s ... 1 day, then whole days) for
which the buckets over the span the window's samples cover (not the window: a live hour whose samples
are its last 3 minutes gets buckets for those minutes) times its GPUs fit ``max_points``; buckets are aligned to multiples of the
width in epoch time (a 10 s bucket is a rollup bucket), computed on whole milliseconds so that
floating point never moves a sample across a boundary. A bucket's value is the mean of the samples in
it that have the metric (NULL where none has); a GPU's ``means`` are over the whole window.

Raw ``gpu_samples`` older than the raw retention are folded into ``gpu_samples_10s`` and deleted
(collector/store/retention.py), so the read takes both: the raw rows where they are kept, the 10 s
rollup rows (their ``avg_*``, weighted by their ``samples``, placed at the bucket's middle) where they
replaced them; a long window past the raw retention is read from the rollup alone. Each GPU comes
with its device attributes (``devices``, the newest row before the window's end: worker, role,
UUID, name), which is how a page groups the GPUs of one tensor-parallel replica (same worker).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import duckdb

from analytics.trust import HOST_BOUND, Trust
from analytics.window import AnalyticsError, Window

#: metrics of the series, in the order pages show them
SERIES_METRICS: tuple[str, ...] = (
    "sm_active_pct",
    "tensor_active_pct",
    "dram_active_pct",
    "gpu_util_pct",
    "mem_used_bytes",
    "temperature_c",
    "sm_clock_mhz",
    "power_w",
    "power_limit_w",
)
DEFAULT_MAX_POINTS = 6_000
MIN_MAX_POINTS = 100
MIN_MAX_BUCKETS = 10
MAX_MAX_POINTS = 200_000
_DAY_S = 86_400.0
#: bucket widths, s (past the last one: whole days); each >= 10 s is a multiple of the 10 s rollup
BUCKET_STEPS_S: tuple[float, ...] = (
    0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0,
    3600.0, 7200.0, 10_800.0, 21_600.0, 43_200.0, _DAY_S,
)  # fmt: skip
ROLLUP_BUCKET_S = 10.0
_DIGITS = 3  # decimals of a value in the answer (its JSON stays small; a chart shows fewer)

_GPU = 'node, source, device, "index"'
# The raw samples grouped per GPU key and bucket on the keyed rows (gpu_sample_rows: no join per
# row; NaN is stored as NULL, so avg/count skip a missing value), then joined to their identity and
# merged with the 10 s rollup rows as (sum, count) per metric: exact means over both.
_SQL = """
WITH k AS (SELECT gpu_key, node, source, device, "index", emulated FROM gpu_keys WHERE {pred}),
raw AS (
    SELECT gpu_key, (round(ts_s * 1000)::BIGINT // $bucket_ms) AS b, count(*) AS n,
           max(host_bound_pct) AS hb, {raw_aggregates}
    FROM gpu_sample_rows
    WHERE gpu_key IN (SELECT gpu_key FROM k) AND ts_s >= $start AND ts_s < $end
    GROUP BY ALL
),
parts AS (
    SELECT k.node, k.source, k.device, k."index", k.emulated, raw.b, raw.n::DOUBLE AS n, raw.hb,
           FALSE AS rolled, {raw_parts}
    FROM raw JOIN k USING (gpu_key)
    UNION ALL
    SELECT {gpu}, emulated, (round((bucket_start_s + {half}) * 1000)::BIGINT // $bucket_ms),
           samples::DOUBLE, avg_host_bound_pct, TRUE, {rollup_parts}
    FROM gpu_samples_10s
    WHERE {pred} AND bucket_start_s + {half} >= $start AND bucket_start_s + {half} < $end AND samples > 0
)
SELECT {gpu}, b, sum(n) AS n, max(hb) AS hb, bool_or(rolled) AS rolled, bool_or(NOT rolled) AS raw,
       list(DISTINCT trust_label(node, source, emulated)) AS trust, {sums}
FROM parts
GROUP BY {gpu}, b
"""
# The window's GPUs and the span its samples cover (the buckets fit the data, not the window: a live
# hour whose samples are the last 3 minutes gets buckets for those minutes).
_COUNT_SQL = """
WITH r AS (
    SELECT gpu_key, min(ts_s) AS t0, max(ts_s) AS t1 FROM gpu_sample_rows
    WHERE gpu_key IN (SELECT gpu_key FROM gpu_keys WHERE {pred}) AND ts_s >= $start AND ts_s < $end
    GROUP BY gpu_key
),
g AS (
    SELECT k.node, k.source, k.device, k."index", r.t0, r.t1 FROM r JOIN gpu_keys k USING (gpu_key)
    UNION ALL
    SELECT {gpu}, min(bucket_start_s + {half}), max(bucket_start_s + {half}) FROM gpu_samples_10s
    WHERE {pred} AND bucket_start_s + {half} >= $start AND bucket_start_s + {half} < $end
    GROUP BY ALL
)
SELECT count(DISTINCT (node, source, device, "index")), min(t0), max(t1) FROM g
"""
_DEVICES_SQL = """
SELECT node, source, device, "index", uuid, name, worker, role
FROM devices WHERE {pred} AND since_s < $end
QUALIFY row_number() OVER (PARTITION BY node, source, device, "index" ORDER BY since_s DESC) = 1
"""


@dataclass(slots=True)
class GpuSeries:
    """Per GPU and time bucket, the mean of each metric of :data:`SERIES_METRICS`.

    ``times_s``: the buckets' starts (every bucket from the window's first sample to its last,
    empty ones too); ``gpus``: one dict
    per GPU (``key`` node|source|device|index, ``node``, ``source``, ``device``, ``index``, ``uuid``,
    ``name``, ``worker``, ``role``, ``trust``), ordered by role, worker and index; ``series[metric]``:
    one list per GPU of one value per bucket (NaN where the bucket has none); ``samples``: the samples
    per GPU and bucket; ``means[metric]``: per GPU, the mean over the window."""

    window: Window
    bucket_s: float
    max_points: int
    times_s: list[float]
    gpus: list[dict[str, Any]]
    series: dict[str, list[list[float]]]
    samples: list[list[float]]
    means: dict[str, list[float]]
    sources: list[str] = field(default_factory=list)
    trust: Trust = field(default_factory=Trust)
    missing: list[str] = field(default_factory=list)

    @property
    def points_per_metric(self) -> int:
        return len(self.gpus) * len(self.times_s)

    def to_dict(self) -> dict[str, Any]:
        from analytics.jsonable import json_safe

        small = json_safe(
            {
                "window": self.window.describe(),
                "bucket_s": self.bucket_s,
                "max_points": self.max_points,
                "points_per_metric": self.points_per_metric,
                "sources": self.sources,
                "times_s": self.times_s,
                "gpus": self.gpus,
                "metrics": list(SERIES_METRICS),
                "means": self.means,
                "trust": self.trust.to_dict(),
                "missing": self.missing,
            }
        )
        # the matrices hold plain floats and None already (see _fill): no walk over every value
        return small | {"series": self.series, "samples": self.samples}


def check_max_points(value: Any) -> int:
    """``value`` as the most values per metric; AnalyticsError naming the allowed range otherwise."""
    try:
        n = int(str(value))
    except (TypeError, ValueError):
        n = -1
    if not MIN_MAX_POINTS <= n <= MAX_MAX_POINTS:
        raise AnalyticsError(
            f"max_points must be a whole number in [{MIN_MAX_POINTS}, {MAX_MAX_POINTS}] "
            f"(values per metric: GPUs x time buckets), got {value!r}",
            "max_points",
        )
    return n


def _bucket_count(start_s: float, end_s: float, bucket_s: float) -> int:
    ms = round(bucket_s * 1000)
    return (math.ceil(end_s * 1000) - 1) // ms - round(start_s * 1000) // ms + 1


def check_max_buckets(value: Any) -> int | None:
    """``value`` as the most time buckets (None: as many as ``max_points`` allows); AnalyticsError
    naming the allowed range otherwise."""
    if value is None:
        return None
    try:
        n = int(str(value))
    except (TypeError, ValueError):
        n = -1
    if not MIN_MAX_BUCKETS <= n <= MAX_MAX_POINTS:
        raise AnalyticsError(
            f"max_buckets must be a whole number in [{MIN_MAX_BUCKETS}, {MAX_MAX_POINTS}] (time buckets "
            f"per GPU), got {value!r}",
            "max_buckets",
        )
    return n


def bucket_s_for(
    start_s: float, end_s: float, gpus: int, max_points: int, max_buckets: int | None = None
) -> float:
    """The narrowest bucket width (:data:`BUCKET_STEPS_S`, then whole days) whose buckets over
    ``[start_s, end_s)`` times ``gpus`` fit ``max_points`` (and whose count fits ``max_buckets``)."""
    per_gpu = max(1, max_points // max(1, gpus))
    if max_buckets is not None:
        per_gpu = max(1, min(per_gpu, max_buckets))
    for step in BUCKET_STEPS_S:
        if _bucket_count(start_s, end_s, step) <= per_gpu:
            return step
    days = math.ceil((end_s - start_s) / _DAY_S / max(1, per_gpu - 1))
    while _bucket_count(start_s, end_s, days * _DAY_S) > per_gpu:
        days += 1
    return days * _DAY_S


def _named(window: Window, column: str, params: dict[str, Any]) -> str:
    pred, values = window.node_sql(column)
    for i, v in enumerate(values):
        pred = pred.replace("?", f"$node{i}", 1)
        params[f"node{i}"] = v
    return pred


def gpu_series(
    con: duckdb.DuckDBPyConnection,
    window: Window,
    *,
    max_points: int = DEFAULT_MAX_POINTS,
    max_buckets: int | None = None,
) -> GpuSeries:
    """The window's GPU samples as per-GPU means per time bucket (see the module's docstring), at
    most ``max_points`` values per metric and ``max_buckets`` buckets per GPU (a chart's width: fewer,
    wider buckets for few GPUs); AnalyticsError when the window has more GPUs than ``max_points``."""
    max_points = check_max_points(max_points)
    max_buckets = check_max_buckets(max_buckets)
    params: dict[str, Any] = {"start": window.start_s, "end": window.end_s}
    pred = _named(window, "node", params)
    gpus_found = con.execute(
        _COUNT_SQL.format(gpu=_GPU, pred=pred, half=ROLLUP_BUCKET_S / 2), params
    ).fetchone()
    n_gpus = int(gpus_found[0]) if gpus_found else 0
    # buckets over the samples' span (the last sample inside: the span's end is exclusive)
    data_start = float(gpus_found[1]) if n_gpus else window.start_s
    data_end = min(float(gpus_found[2]) + 1e-3, window.end_s) if n_gpus else window.end_s
    if n_gpus > max_points:
        raise AnalyticsError(
            f"max_points={max_points} is fewer than the window's {n_gpus} GPUs (one value per GPU and "
            f"bucket at the least); ask for max_points >= {n_gpus}",
            "max_points",
        )
    bucket_s = bucket_s_for(data_start, data_end, n_gpus, max_points, max_buckets)
    bucket_ms = round(bucket_s * 1000)
    first = round(data_start * 1000) // bucket_ms
    n_buckets = _bucket_count(data_start, data_end, bucket_s)
    times_s = [(first + i) * bucket_ms / 1000.0 for i in range(n_buckets)]
    result = GpuSeries(window, bucket_s, max_points, times_s, [], {}, [], {})  # filled below
    if n_gpus == 0:
        result.series = {m: [] for m in SERIES_METRICS}
        result.means = {m: [] for m in SERIES_METRICS}
        result.missing.append("no GPU samples in the window")
        return result
    sql = _SQL.format(
        gpu=_GPU,
        pred=pred,
        half=ROLLUP_BUCKET_S / 2,
        raw_aggregates=", ".join(f"avg({m}) AS {m}, count({m}) AS {m}__n" for m in SERIES_METRICS),
        raw_parts=", ".join(
            f"raw.{m} * raw.{m}__n AS {m}__s, raw.{m}__n::DOUBLE AS {m}__n" for m in SERIES_METRICS
        ),
        rollup_parts=", ".join(
            f"avg_{m} * samples, CASE WHEN avg_{m} IS NOT NULL THEN samples::DOUBLE END"
            for m in SERIES_METRICS
        ),
        sums=", ".join(f"sum({m}__s) AS {m}__s, sum({m}__n) AS {m}__n" for m in SERIES_METRICS),
    )
    df = con.execute(sql, params | {"bucket_ms": bucket_ms}).df()
    devices = con.execute(
        _DEVICES_SQL.format(pred=pred), {k: v for k, v in params.items() if k != "start"}
    ).df()
    _fill(result, df, devices, first)
    return result


def _gpu_key(node: Any, source: Any, device: Any, index: Any) -> str:
    idx = "" if index is None or (isinstance(index, float) and math.isnan(index)) else int(index)
    return f"{node}|{source}|{device}|{idx}"


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _fill(result: GpuSeries, df: Any, devices: Any, first: int) -> None:
    """Matrices of ``result`` from the rows ``df`` (per GPU and bucket: samples, and per metric the
    sum and count of its values) and the GPUs' ``devices`` attributes."""
    import numpy as np

    attrs = {_gpu_key(r.node, r.source, r.device, r.index): r for r in devices.itertuples(index=False)}
    keys = [_gpu_key(*k) for k in zip(df["node"], df["source"], df["device"], df["index"], strict=True)]
    labels_of: dict[str, set[str]] = {}
    for key, trust, hb in zip(keys, df["trust"], df["hb"].fillna(0.0), strict=True):
        labels = labels_of.setdefault(key, set())
        labels.update(str(x) for x in (trust if trust is not None else []))
        if hb > 0:
            labels.add(HOST_BOUND)
    firsts = df.assign(_key=keys).drop_duplicates("_key")
    gpus = []
    for key, node, source, device, idx in zip(
        firsts["_key"], firsts["node"], firsts["source"], firsts["device"], firsts["index"], strict=True
    ):
        a = attrs.get(key)
        labels = labels_of[key]
        for label in labels - {HOST_BOUND}:
            result.trust.add(label)
        if HOST_BOUND in labels:
            result.trust.add(HOST_BOUND, "samples from emulated windows the host could not keep pace with")
        gpus.append(
            {
                "key": key,
                "node": node,
                "source": source,
                "device": device,
                "index": None if idx is None or pd_isna(idx) else int(idx),
                "uuid": _text(getattr(a, "uuid", None)),
                "name": _text(getattr(a, "name", None)),
                "worker": _text(getattr(a, "worker", None)),
                "role": _text(getattr(a, "role", None)),
                "trust": sorted(labels),
            }
        )
    order = {"prefill": 0, "decode": 1, "mixed": 2}
    gpus.sort(
        key=lambda g: (
            g["node"],
            order.get(g["role"] or "", 3),
            _natural(g["worker"] or ""),
            g["index"] if g["index"] is not None else -1,
            g["device"],
        )
    )
    row_of = {g["key"]: i for i, g in enumerate(gpus)}
    n = len(result.times_s)
    rows = np.asarray([row_of[k] for k in keys], dtype=np.int64)
    cols = df["b"].to_numpy(dtype=np.int64) - first
    inside = (cols >= 0) & (cols < n)
    rows, cols = rows[inside], cols[inside]
    samples = np.zeros((len(gpus), n))
    samples[rows, cols] = df["n"].to_numpy(dtype=float)[inside]
    result.samples = samples.tolist()
    for m in SERIES_METRICS:
        sums = np.zeros((len(gpus), n))
        counts = np.zeros((len(gpus), n))
        sums[rows, cols] = df[f"{m}__s"].to_numpy(dtype=float, na_value=0.0)[inside]
        counts[rows, cols] = df[f"{m}__n"].to_numpy(dtype=float, na_value=0.0)[inside]
        with np.errstate(invalid="ignore", divide="ignore"):
            values = np.round(np.where(counts > 0, sums / counts, np.nan), _DIGITS)
        # JSON-ready: None where a bucket has no value (json_safe would walk every cell)
        result.series[m] = np.where(np.isnan(values), None, values).tolist()
        with np.errstate(invalid="ignore", divide="ignore"):
            totals = counts.sum(axis=1)
            result.means[m] = np.where(totals > 0, sums.sum(axis=1) / totals, np.nan).tolist()
    result.gpus = gpus
    rolled, raw = bool(df["rolled"].any()), bool(df["raw"].any())
    result.sources = (["gpu_samples"] if raw else []) + (["gpu_samples_10s"] if rolled else [])
    if rolled:
        result.trust.notes.append("older samples from the 10 s rollup (means weighted by their samples)")
    for m in SERIES_METRICS:
        if all(math.isnan(v) for v in result.means[m]):
            result.missing.append(f"{m}: not in the window's samples (the source does not report it)")
    result.trust.notes.append(f"means per GPU and {result.bucket_s:g} s bucket")


def pd_isna(value: Any) -> bool:
    """A missing value of a pandas cell (None, NaN, pd.NA)."""
    import pandas as pd

    return bool(pd.isna(value))


def _natural(text: str) -> tuple[Any, ...]:
    """``worker-10`` after ``worker-9``."""
    import re

    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))
