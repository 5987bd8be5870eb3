"""The Prometheus HTTP query API as a source: :class:`PrometheusQuerySource` reads a
Prometheus-compatible server (Prometheus, Thanos, Mimir) through ``/api/v1/query_range`` for
``DCGM_FI_*`` series (→ ``gpu_samples``) and engine series (→ ``engine_metrics``, mapped as
:mod:`collector.sources.prometheus` maps a scraped engine page)."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import httpx

from collector.sources.backoff import Backoff
from collector.sources.base import (
    TABLE_ENGINE_METRICS,
    TABLE_GPU_SAMPLES,
    Source,
    SourceResult,
    SourceUnavailable,
)
from collector.sources.dcgm import _FB_FIELDS, DCGM_FIELDS, ClockGuard, GpuRowBuilder, is_dcgm_field
from collector.sources.exposition import Sample, split_name
from collector.sources.http import HttpClient
from collector.sources.prometheus import (
    ENGINE_METRICS,
    ENGINE_PREFIXES,
    ENGINE_ROW_COLUMNS,
    ENGINES,
    DeltaTracker,
    EngineMapper,
    EnginePoint,
    EngineRows,
    EngineScrapeSource,
    host_of,
)

#: The largest query answer read (a window of ``max_points`` steps of a fleet's DCGM and engine
#: series is tens of MB); a larger one is dropped (``page_too_large``) and its window asked again.
MAX_QUERY_BYTES = 256 * 1024 * 1024


def _dcgm_query() -> str:
    names = sorted({*DCGM_FIELDS, *_FB_FIELDS})
    return '{__name__=~"' + "|".join(names) + '"}'


def _engine_query(include_buckets: bool) -> str:
    alt = "|".join(p for p, _ in ENGINE_PREFIXES)
    q = '{__name__=~"(' + alt + ').+"'
    if not include_buckets:
        q += ',__name__!~".+_(bucket|created)"'
    return q + "}"


class PrometheusQuerySource(Source):
    """Reads a Prometheus-compatible server's ``/api/v1/query_range`` for DCGM and engine series.

    Each poll reads the window after the last one read (the first reaches back ``lookback_s``),
    aligned to ``step_s``; at most ``max_points`` steps per poll, so a long gap is caught up over
    several polls rather than asked for at once. Windows end ``delay_s`` before now, for servers that
    ingest late (remote write into Mimir/Thanos): a step already read is never read again.
    ``headers`` go with every request (e.g. Mimir's ``X-Scope-OrgID`` or an ``Authorization``). Each
    request ends by its deadline ``timeout_s`` (connect, headers and body) and reads at most
    ``max_body_bytes``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        dcgm: bool = True,
        engines: bool = True,
        step_s: float = 15.0,
        lookback_s: float = 300.0,
        max_points: int = 1000,
        delay_s: float = 0.0,
        interval_s: float | None = None,
        include_buckets: bool = False,
        headers: dict[str, str] | None = None,
        timeout_s: float = 10.0,
        max_body_bytes: int = MAX_QUERY_BYTES,
        clock: Callable[[], float] | None = None,
        backoff: Backoff | None = None,
        client: httpx.Client | None = None,
        discovery_ttl_s: float = 60.0,
    ) -> None:
        if step_s <= 0 or max_points < 1:
            raise ValueError("step_s must be > 0 and max_points >= 1")
        super().__init__(
            f"prometheus:{base_url}",
            interval_s=step_s if interval_s is None else interval_s,
            clock=clock,
            backoff=backoff,
            discovery_ttl_s=discovery_ttl_s,
        )
        self.base_url = base_url.rstrip("/")
        self.step_s = step_s
        self.lookback_s = lookback_s
        self.max_points = max_points
        self.delay_s = delay_s
        self.queries: dict[str, str] = {}
        if dcgm:
            self.queries["dcgm"] = _dcgm_query()
        if engines:
            self.queries["engine"] = _engine_query(include_buckets)
        self._engine_rows = EngineRows(EngineMapper("auto", include_buckets=include_buckets))
        self._gpu_guard = ClockGuard()
        self._cursor_s: float | None = None  # end of the last window read
        self._client = HttpClient(
            self.base_url, timeout_s=timeout_s, max_body_bytes=max_body_bytes, headers=headers, client=client
        )

    # --- Source ------------------------------------------------------------------------------------

    def _discover(self) -> bool:
        body = self._get("/api/v1/query", {"query": "vector(1)"})
        return body.get("status") == "success"

    def window(self, now_s: float) -> tuple[float, float] | None:
        """The (start, end) the next poll would read, or None when no whole step has passed."""
        step = self.step_s
        now_s -= self.delay_s
        start = now_s - self.lookback_s if self._cursor_s is None else self._cursor_s + step
        start = math.ceil(start / step) * step
        end = math.floor(now_s / step) * step
        end = min(end, start + (self.max_points - 1) * step)
        return (start, end) if end >= start else None

    def _collect(self, now_s: float, result: SourceResult) -> None:
        win = self.window(now_s)
        if win is None or not self.queries:
            return
        start, end = win
        answered = 0
        failures: list[str] = []
        for what, query in self.queries.items():
            series = self._query_range(what, query, start, end, result)
            if series is None:
                failures.append(what)
                continue
            answered += 1
            if what == "dcgm":
                self._map_dcgm(series, result)
            else:
                self._map_engine(series, result)
        if answered == 0:
            msgs = "; ".join(f"{e.kind}: {e.message}" for e in result.errors) or "no query answered"
            raise SourceUnavailable("query_error", msgs)
        self._cursor_s = end

    def close(self) -> None:
        self._client.close()

    # --- HTTP ----------------------------------------------------------------------------------------

    def _get(self, path: str, params: dict[str, Any]) -> dict[str, Any]:
        url = self.base_url + path
        status, raw = self._client.get(path, params, what=url, accept="application/json")
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            if status >= 500 or status in (401, 403, 404):
                text = raw[:160].decode("utf-8", errors="replace")
                raise SourceUnavailable("http_status", f"{url}: HTTP {status}: {text}")
            return {"status": "error", "errorType": "bad_response", "error": f"HTTP {status}, not JSON"}
        return body

    def _query_range(
        self, what: str, query: str, start: float, end: float, result: SourceResult
    ) -> list[dict[str, Any]] | None:
        body = self._get(
            "/api/v1/query_range",
            {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": self.step_s},
        )
        if body.get("status") != "success":
            result.count(
                "query_error",
                f"{what}: {body.get('errorType', '?')}: {body.get('error', body.get('status'))}",
            )
            return None
        for w in body.get("warnings") or []:
            result.count("partial_data", f"{what}: {w}")
        data = body.get("data")
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            kind = data.get("resultType") if isinstance(data, dict) else type(data).__name__
            result.count("bad_response", f"{what}: expected a matrix, got {kind}")
            return None
        series = data.get("result")
        if not isinstance(series, list):
            result.count("bad_response", f"{what}: result is not a list")
            return None
        return series

    # --- mapping ------------------------------------------------------------------------------------

    def _points(self, series: list[dict[str, Any]], result: SourceResult):
        """Yield (labels, name, ts, value) for every well-formed point; count the rest."""
        for s in series:
            metric = s.get("metric") if isinstance(s, dict) else None
            values = s.get("values") if isinstance(s, dict) else None
            if not isinstance(metric, dict) or not isinstance(values, list) or "__name__" not in metric:
                result.count("bad_response", f"malformed series: {str(s)[:160]}")
                continue
            name = metric["__name__"]
            for v in values:
                try:
                    ts, raw = float(v[0]), v[1]
                    value = float(raw)
                except (TypeError, ValueError, IndexError):
                    result.count("non_numeric", f"{name}: {str(v)[:80]}")
                    continue
                yield metric, name, ts, value

    def _map_dcgm(self, series: list[dict[str, Any]], result: SourceResult) -> None:
        by_ts: dict[float, GpuRowBuilder] = {}
        for labels, name, ts, value in self._points(series, result):
            if not is_dcgm_field(name):
                result.count("unknown_metric", f"{name} is not a DCGM field", severity="warning")
                continue
            b = by_ts.get(ts)
            if b is None:
                b = by_ts[ts] = GpuRowBuilder(self.name, None, result)
            b.add(name, labels, value, ts, default_node=host_of(labels.get("instance", "")))
        rows = []
        for ts in sorted(by_ts):
            for key, row in by_ts[ts].rows():
                if self._gpu_guard.admit(key, row["ts_s"], result, f"{row['node']} {row['device']}", False):
                    rows.append(row)
        result.add_samples(TABLE_GPU_SAMPLES, rows)  # as columns: the writer builds each once per flush

    def _map_engine(self, series: list[dict[str, Any]], result: SourceResult) -> None:
        snapshots: dict[tuple[str, float], list[Sample]] = defaultdict(list)
        for labels, name, ts, value in self._points(series, result):
            endpoint = labels.get("instance") or self.base_url
            stem, suffix = split_name(name)
            snapshots[(endpoint, ts)].append(
                Sample(name, stem, suffix, "untyped", {k: str(v) for k, v in labels.items()}, value, ts)
            )
        rows = []
        for endpoint, ts in sorted(snapshots, key=lambda k: (k[1], k[0])):
            rows += self._engine_rows.rows(
                snapshots[(endpoint, ts)], node=host_of(endpoint), endpoint=endpoint, ts_s=ts, result=result
            )
        result.add_samples(TABLE_ENGINE_METRICS, rows)


__all__ = [
    "ENGINES",
    "ENGINE_METRICS",
    "ENGINE_ROW_COLUMNS",
    "DeltaTracker",
    "EngineMapper",
    "EnginePoint",
    "EngineScrapeSource",
    "PrometheusQuerySource",
]
