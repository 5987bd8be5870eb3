"""The service's summaries, cached: one page load (or several pages, several users) does not compute
the same window's summary more than once.

Two levels, both keyed by the store's version (its import count) and the window (a live window
ending now has its end rounded down to ``LIVE_ROUND_S`` and lives ``LIVE_TTL_S``, as the overview's
cache; a scenario's lives until the next import):

* the answers: every query parameter in the key (``GET /api/v1/analytics/summary`` asked again, the
  Overview's current summary);
* the resolved window's (dataset, start, end, nodes) part objects (phases, idle split, bimodality, external attribution, the grouped scan
  of iterations, and the cost and latency parts with the prices / SLO they were computed for): a
  summary of the same window with another SLO (the Latency page), fleet size (Cost, Overview) or
  skipped part recomputes only what those change (``latency``, ``annual``, ``cost`` for other
  prices) — :func:`analytics.summary.summarize`'s ``reuse``. The figures are those of a fresh
  summary of the window (tests/phaselens/test_summary_cache.py checks it against ``phaselens analyze``).

Concurrent requests for one window wait for the first one's computation and then reuse its parts.
The Overview of a scenario skips the bimodality (its GPU-interval table is the costliest step) and
has the whole summary completed on a thread afterwards, for the Bimodal page.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from phaselens.overview import LIVE_TTL_S, OverviewCache, cache_key

log = logging.getLogger(__name__)

PRICE_PARAMS = ("gpu_usd_per_hour", "electricity_usd_per_kwh", "pue")
SLO_PARAMS = ("slo_ttft_ms", "slo_tpot_ms")
# the parts that depend on the window only (and the grouped iteration scan they share)
WINDOW_PARTS = ("phases", "idle", "bimodal", "external", "iteration_groups")
MAX_WINDOWS = 4  # windows whose part objects are kept (a 64-GPU hour's: tens of MB)
MAX_ANSWERS = 32


def _sig(params: dict[str, Any], names: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """The values of ``names`` in ``params`` as numbers (for comparing requests), sorted."""
    out = []
    for n in names:
        v = params.get(n)
        if v is not None:
            try:
                out.append((n, float(v)))
            except (TypeError, ValueError):
                out.append((n, math.nan))  # refused by the summary itself
    return tuple(out)


class SummaryCache:
    """Summaries by request, and the part objects of recent windows (see the module's docstring).
    ``imports``: the store's import count (its version: a new import, new keys)."""

    def __init__(self, store: Any, imports: Callable[[], int], clock: Callable[[], float] = time.monotonic):
        self.store = store
        self._imports = imports
        self._clock = clock
        self.answers = OverviewCache(max_entries=MAX_ANSWERS, clock=clock)
        self._windows: OrderedDict[Any, tuple[float, float, dict[str, Any]]] = OrderedDict()
        self._window_locks: dict[Any, threading.Lock] = {}
        self._lock = threading.Lock()
        self._completing: set[Any] = set()
        self._closed = False
        self.part_reuses = 0  # summaries that reused a window's parts (not computed from scratch)

    def get(
        self,
        params: dict[str, Any],
        *,
        skip: frozenset[str] = frozenset(),
        con: Any = None,
        complete_later: bool = False,
    ) -> dict:
        """The summary JSON of ``params`` (``GET /api/v1/analytics/summary``'s query parameters)
        without the parts in ``skip``: cached, or computed on ``con`` (a store cursor; a reader of
        its own when None). AnalyticsError / ValueError name a bad parameter, as run_summary's.

        ``complete_later`` (the Overview's, which skips the bimodality): for a scenario's window,
        the whole summary is then computed on a thread of its own after this answer, so that the
        Bimodal page finds it (it waits for that computation rather than running its own)."""
        key, ttl, fixed = cache_key(params, self._imports(), time.time())

        def compute() -> Any:
            if con is not None:
                return self._compute(con, fixed, skip, ttl)
            with self.store.reader() as cur:
                return self._compute(cur, fixed, skip, ttl)

        got = self.answers.get((key, tuple(sorted(skip))), ttl, compute)
        if complete_later and skip and math.isinf(ttl):
            self._complete(fixed)
        return got

    def completing(self) -> int:
        """How many background completions are running."""
        with self._lock:
            return len(self._completing)

    def close(self) -> None:
        """Start no more background completions (the service is stopping)."""
        with self._lock:
            self._closed = True

    def _complete(self, params: dict[str, Any]) -> None:
        """The whole summary of ``params`` computed (once) on a daemon thread; its failure is logged
        (the page that asks computes in the foreground and reports it)."""
        key, ttl, fixed = cache_key(params, self._imports(), time.time())
        with self._lock:
            if self._closed or key in self._completing or self.answers.has((key, ()), ttl):
                return
            self._completing.add(key)

        def run() -> None:
            try:
                self.get(fixed)
            except Exception as e:  # a background warm-up: the page that asks reports it
                log.warning("summary completion failed: %s", e)
            finally:
                with self._lock:
                    self._completing.discard(key)

        threading.Thread(target=run, daemon=True, name="summary-complete").start()

    def read(
        self, name: str, params: dict[str, Any], run: Callable[[Any, dict[str, Any]], Any], con: Any
    ) -> Any:
        """Another analytics read of a window (``run(con, params)``, e.g. the histogram), cached
        under ``name`` with the same keys and lifetimes as the summaries."""
        key, ttl, fixed = cache_key(params, self._imports(), time.time())
        return self.answers.get((name, key), ttl, lambda: run(con, fixed))

    def _compute(self, con: Any, params: dict[str, Any], skip: frozenset[str], ttl: float) -> dict:
        from analytics.reads import run_summary, window_of

        # the resolved window (the Overview asks with since or without bounds, the pages with both)
        wkey = (window_of(con, params), self._imports())
        with self._lock:
            lock = self._window_locks.setdefault(wkey, threading.Lock())
        prices, slo = _sig(params, PRICE_PARAMS), _sig(params, SLO_PARAMS)
        with lock:  # a second request for the window waits, then reuses the first one's parts
            with self._lock:
                hit = self._windows.get(wkey)
                if hit is not None and self._clock() - hit[0] >= min(hit[1], ttl):
                    hit = None
                reuse: dict[str, Any] = {}
                if hit is not None:
                    parts = hit[2]
                    reuse = {k: parts[k] for k in WINDOW_PARTS if k in parts}
                    for name, sig in (("cost", prices), ("latency", slo)):
                        if name in parts and parts[name][0] == sig:
                            reuse[name] = parts[name][1]
                    if reuse:
                        self.part_reuses += 1
            objects: dict[str, Any] = {}
            summary = run_summary(con, params, skip=skip, objects=objects, reuse=reuse)
            with self._lock:
                kept = dict(hit[2]) if hit is not None else {}
                kept |= {k: objects[k] for k in WINDOW_PARTS if k in objects}
                for name, sig in (("cost", prices), ("latency", slo)):
                    if name in objects:
                        kept[name] = (sig, objects[name])
                self._windows[wkey] = (hit[0] if hit is not None else self._clock(), ttl, kept)
                self._windows.move_to_end(wkey)
                while len(self._windows) > MAX_WINDOWS:
                    old, _ = self._windows.popitem(last=False)
                    self._window_locks.pop(old, None)
        return summary


__all__ = ["LIVE_TTL_S", "SummaryCache"]
