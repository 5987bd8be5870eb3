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

Where the pieces are: the rules both share (what part of an iteration is GPU-busy, when a request
is on a worker, the gap threshold) in analytics/interval_rules.py; the sample intervals' SQL as
named queries in analytics/interval_queries.py, the buckets' in analytics/bucket_queries.py and
analytics/bucket_iterations.py (each query a function of its own, composed by analytics/query.py);
here the request islands, the choices made per window (bucket width, long iterations, the
rollup) and :class:`IntervalTable`, which materialises one of the two. Formulas and sources:
docs/analytics/attribution.md.
"""

from __future__ import annotations

import itertools
import math
import uuid as uuidlib
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analytics.bucket_queries import buckets_sql
from analytics.interval_queries import intervals_sql
from analytics.interval_rules import (
    GAP_MIN_S,
    GAP_PERIODS,
    MAX_EDGE_FILTERS,
    NICE_BUCKETS_S,
    SM_SHIFT_PCT,
    gap_subcells,
    gap_threshold_sql,
    iteration_rows_sql,
    keyed_samples_sql,
    request_spans_sql,
)
from analytics.window import Window
from collector.store import iteration_seconds

__all__ = [  # the rules and the statements, re-exported: the analyses import them from here
    "GAP_MIN_S",
    "GAP_PERIODS",
    "MAX_EDGE_FILTERS",
    "NICE_BUCKETS_S",
    "SM_SHIFT_PCT",
    "TARGET_BUCKETS",
    "IntervalTable",
    "buckets_sql",
    "choose_bucket_s",
    "edge_seconds",
    "gap_subcells",
    "gap_threshold_sql",
    "has_long_iterations",
    "intervals_sql",
    "iteration_rows_sql",
    "keyed_samples_sql",
    "registered_islands",
    "request_islands",
    "request_spans_sql",
    "span_order",
    "use_rollup",
]


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


#: The automatic bucket width keeps the bucket table near this many rows (GPU × bucket).
TARGET_BUCKETS = 250_000


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
