"""``GET /api/v1/analytics/overview``: the headline figures of a window and of the period of the
same length before it (``analytics/overview.py``), computed from two analytics summaries and
cached, so that several dashboard users and the Prometheus export (``phaselens/metrics_export.py``)
do not recompute them.

Cache: a live window ending now is rounded to :data:`LIVE_ROUND_S` (its end moves on in steps) and
its result kept :data:`LIVE_TTL_S`; a scenario's result is kept until the store takes an import
(scenarios change only that way). Concurrent requests for one key wait for one computation.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

LIVE_ROUND_S = 2.0  # a live window's end, rounded down to this step (the cache key moves with it)
LIVE_TTL_S = 5.0  # how long a live result is reused as it is
# how long a live window's newest result is answered while a newer one is computed: a visitor after
# a quiet spell sees the last figures at once (with their computed_at_s), the next refresh the new ones
LIVE_STALE_S = 300.0
MAX_ENTRIES = 64
SKIP_PARTS = frozenset({"bimodal", "roofline"})  # summary parts neither the overview nor /metrics read
PREVIOUS_SLACK_S = 0.01  # a scenario's previous period may start this much before the scenario
OVERVIEW_PARAMS = frozenset(  # what GET /api/v1/analytics/overview takes
    {"dataset", "since", "start_s", "end_s", "node", "slo_ttft_ms", "slo_tpot_ms", "fleet_gpus"}
)


@dataclass(frozen=True, slots=True)
class OverviewResult:
    """One computation: the window's summary (the Prometheus export reads its per-GPU parts), the
    previous period's (or None), the overview JSON, and when and how fast it was computed."""

    current: dict[str, Any]
    previous: dict[str, Any] | None
    overview: dict[str, Any]
    computed_at_s: float
    compute_s: float


class OverviewCache:
    """Results by key with a time-to-live; one computation per key at a time (others wait on it)."""

    def __init__(self, max_entries: int = MAX_ENTRIES, clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: OrderedDict[Any, tuple[float, OverviewResult]] = OrderedDict()
        self._inflight: dict[Any, Future[OverviewResult]] = {}
        self._lock = threading.Lock()
        self._max = max_entries
        self._clock = clock
        self.hits = 0
        self.misses = 0

    def has(self, key: Any, ttl_s: float) -> bool:
        """Whether ``key`` holds a result younger than ``ttl_s`` or one is being computed."""
        with self._lock:
            hit = self._entries.get(key)
            return key in self._inflight or (hit is not None and self._clock() - hit[0] < ttl_s)

    def get(self, key: Any, ttl_s: float, compute: Callable[[], OverviewResult]) -> OverviewResult:
        """The cached result of ``key`` younger than ``ttl_s``, else ``compute()`` (once, however
        many callers ask meanwhile; an exception reaches every waiting caller and is not cached)."""
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and self._clock() - hit[0] < ttl_s:
                self._entries.move_to_end(key)
                self.hits += 1
                return hit[1]
            fut = self._inflight.get(key)
            owner = fut is None
            if owner:
                fut = Future()
                self._inflight[key] = fut
                self.misses += 1
        if not owner:
            return fut.result()  # type: ignore[union-attr]
        try:
            result = compute()
        except BaseException as e:
            with self._lock:
                self._inflight.pop(key, None)
            fut.set_exception(e)  # type: ignore[union-attr]
            raise
        with self._lock:
            self._inflight.pop(key, None)
            self._entries[key] = (self._clock(), result)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
        fut.set_result(result)  # type: ignore[union-attr]
        return result


def _clean(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


def _scenario_span(con: Any, dataset: str) -> tuple[float, float] | None:
    row = con.execute("SELECT start_s, end_s FROM scenarios WHERE scenario_id = ?", [dataset]).fetchone()
    return (float(row[0]), float(row[1])) if row else None


def previous_summary(
    con: Any, params: dict[str, Any], current: dict[str, Any], summaries: Any = None
) -> tuple[dict[str, Any] | None, str | None]:
    """The summary (without :data:`SKIP_PARTS`) of the period of ``current``'s length just before
    it, with ``params``' other parameters; ``(None, why)`` when that period would start before the
    scenario ``current`` belongs to, or before 2000 (the earliest time a window may hold)."""
    from analytics.reads import run_summary
    from analytics.window import EARLIEST_S, LIVE, utc

    w = current["window"]
    start_s, duration_s = float(w["start_s"]), float(w["duration_s"])
    if start_s - duration_s < EARLIEST_S:  # the window is valid, so the overview answers it too
        return None, (
            f"no data: the previous period would start before {utc(EARLIEST_S)}, the earliest a window "
            "may start (pick a shorter range)"
        )
    span = _scenario_span(con, w["dataset"]) if w["dataset"] != LIVE else None
    if span is not None and start_s - duration_s < span[0] - PREVIOUS_SLACK_S:
        return None, (
            "no data: the previous period would start before the scenario does (pick a later, shorter range)"
        )
    prev_params = _clean({**params, "since": None, "dataset": w["dataset"]})
    prev_params |= {"start_s": start_s - duration_s, "end_s": start_s}
    if summaries is not None:
        return summaries.get(prev_params, skip=SKIP_PARTS, con=con), None
    return run_summary(con, prev_params, skip=SKIP_PARTS), None


def compute_overview(con: Any, params: dict[str, Any], summaries: Any = None) -> OverviewResult:
    """Both summaries of ``params`` (those of ``GET /api/v1/analytics/summary``) on ``con`` and the
    overview of the two; through ``summaries`` (phaselens/summary_cache.py's SummaryCache) when
    given, so the pages' own summary reads of the window reuse them. The previous period is the window's length just before its start; for a
    scenario it must lie inside the scenario's span, else it is 'no data' with the reason."""
    from analytics.overview import overview
    from analytics.reads import run_summary

    t = time.perf_counter()
    if summaries is not None:
        current = summaries.get(params, skip=SKIP_PARTS, con=con, complete_later=True)
    else:
        current = run_summary(con, params, skip=SKIP_PARTS)
    previous, why = previous_summary(con, params, current, summaries)
    fleet = params.get("fleet_gpus")
    result = overview(
        current, previous, fleet_gpus=int(fleet) if fleet is not None else None, previous_missing=why
    )
    return OverviewResult(current, previous, result, time.time(), time.perf_counter() - t)


def cache_key(params: dict[str, Any], imports: int, now_s: float) -> tuple[tuple[Any, ...], float, dict]:
    """``(key, ttl_s, params)``: a live window ending now gets its end rounded down to
    :data:`LIVE_ROUND_S` (written into the params, so every caller of the key computes the same
    window); a scenario's key holds the store's import count (a new import, a new key)."""
    params = _clean(dict(params))
    dataset = str(params.get("dataset") or "live")
    live = dataset == "live"
    if live and params.get("end_s") is None:
        end = math.floor(now_s / LIVE_ROUND_S) * LIVE_ROUND_S
        params["end_s"] = end
    ttl = LIVE_TTL_S if live else math.inf
    frozen = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()))
    return (frozen, None if live else imports), ttl, params


def rolling_key(params: dict[str, Any]) -> tuple[Any, ...] | None:
    """The key of a live window that ends now ('the last hour'), whatever the time; else None."""
    params = _clean(dict(params))
    if str(params.get("dataset") or "live") != "live" or params.get("end_s") is not None:
        return None
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()))


class OverviewService:
    """The collector's overviews: ``get(params)`` answers from the cache or computes on a store
    reader cursor. ``imports`` is a callable giving the store's import count (scenario freshness).

    A live window that ends now is answered with the newest result of the same span while it is
    younger than :data:`LIVE_STALE_S`; once it is older than :data:`LIVE_TTL_S` one recomputation
    starts in the background. So refreshing pages and many users never queue computations, and the
    answer (its ``window``, ``computed_at_s``) says which window it covers."""

    def __init__(self, store: Any, imports: Callable[[], int], summaries: Any = None) -> None:
        self.store = store
        self.summaries = summaries  # a SummaryCache shared with GET /api/v1/analytics/summary
        self._imports = imports
        self.cache = OverviewCache()
        self._latest: dict[tuple[Any, ...], OverviewResult] = {}
        self._refreshing: set[tuple[Any, ...]] = set()
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        """Start no more background recomputations (the service is stopping)."""
        with self._lock:
            self._closed = True

    def get(self, params: dict[str, Any]) -> OverviewResult:
        now = time.time()
        rolling = rolling_key(params)
        key, ttl, fixed = cache_key(params, self._imports(), now)

        def compute() -> OverviewResult:
            with self.store.reader() as cur:
                return compute_overview(cur, fixed, self.summaries)

        if rolling is None:
            return self.cache.get(key, ttl, compute)
        with self._lock:
            latest = self._latest.get(rolling)
        if latest is not None and now - latest.computed_at_s < LIVE_STALE_S:
            if now - latest.computed_at_s >= LIVE_TTL_S:
                self._refresh(rolling, key, ttl, compute)
            return latest
        result = self.cache.get(key, ttl, compute)
        self._remember(rolling, result)
        return result

    def _remember(self, rolling: tuple[Any, ...], result: OverviewResult) -> None:
        with self._lock:
            old = self._latest.get(rolling)
            if old is None or result.computed_at_s >= old.computed_at_s:
                self._latest[rolling] = result
            while len(self._latest) > MAX_ENTRIES:
                self._latest.pop(next(iter(self._latest)))

    def _refresh(
        self, rolling: tuple[Any, ...], key: Any, ttl: float, compute: Callable[[], OverviewResult]
    ) -> None:
        """Recompute ``rolling`` on a thread of its own (one at a time per window)."""
        with self._lock:
            if self._closed or rolling in self._refreshing:
                return
            self._refreshing.add(rolling)

        def run() -> None:
            try:
                self._remember(rolling, self.cache.get(key, ttl, compute))
            except Exception as e:  # the next request computes in the foreground and reports it
                log.warning("overview refresh failed: %s", e)
                with self._lock:
                    self._latest.pop(rolling, None)
            finally:
                with self._lock:
                    self._refreshing.discard(rolling)

        threading.Thread(target=run, daemon=True, name="overview-refresh").start()
