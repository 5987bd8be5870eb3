"""Serving-engine metrics (vLLM, SGLang, NVIDIA Dynamo, LMCache, the phaselens router).

:class:`EngineScrapeSource` scrapes an engine's ``/metrics``; the mapping here also serves
:class:`collector.sources.prometheus_query.PrometheusQuerySource`, which reads the same series from a
Prometheus-compatible server.

``engine_metrics`` rows: ``node, endpoint, engine, ts_s, metric, labels, value`` with ``labels`` a dict
(sorted keys; the store's JSON object) and ``engine`` one of :data:`ENGINES`: ``dynamo`` is a Dynamo frontend
(``dynamo_frontend_*``), ``dynamo_worker`` a Dynamo worker/component (``dynamo_component_*``: its
``dynamo_component``/``dynamo_endpoint`` labels say which), ``lmcache`` the LMCache connector inside a
vLLM or SGLang process (``lmcache:*``). Metric names are normalised across engines:

==========================  ==========================================================================
histograms (``_sum``,       ``ttft_seconds``, ``itl_seconds``, ``tpot_seconds``, ``e2e_seconds``,
``_count``, ``_bucket``)    ``queue_seconds``, ``prefill_seconds``, ``decode_seconds``,
                            ``input_sequence_tokens``, ``output_sequence_tokens``
counters (``_total``)       ``prompt_tokens_total``, ``generation_tokens_total``, ``requests_total``
gauges                      ``requests_running``, ``requests_waiting``, ``kv_cache_usage_ratio`` (0-1),
                            ``kv_blocks_used``, ``kv_blocks_total`` (KV capacity; vLLM's from
                            ``cache_config_info``'s ``num_gpu_blocks`` label), ``prefix_cache_hit_ratio``
dynamo_worker               ``requests_total``, ``request_duration_seconds`` (the worker's time per
                            request), ``requests_running``, ``kv_blocks_used``/``_total``,
                            ``kv_cache_usage_ratio``, ``prefix_cache_hit_ratio``
lmcache                     ``retrieve_requests_total``, ``store_requests_total``,
                            ``retrieve_requested_tokens_total``, ``retrieve_hit_tokens_total``,
                            ``retrieve_hit_ratio``, ``local_cache_usage_bytes``,
                            ``remote_cache_usage_bytes``, ``retrieve_seconds``, ``store_seconds``
per interval (computed)     ``<counter>_per_s`` (e.g. ``prompt_tokens_per_s``), ``<histogram>_mean``
                            (e.g. ``ttft_seconds_mean`` = Δsum/Δcount), ``<histogram>_count_per_s``
==========================  ==========================================================================

Other metrics under an engine prefix pass through under their own name, prefix removed (e.g.
SGLang's ``cache_hit_rate``). Every other family of a scrape (``process_*``, ``python_*``, an engine
the ``engine`` filter leaves out, or anything with ``passthrough=False``) is counted as ``unmapped``
(a warning naming the family, once per family per hour); ``*_created`` series are metadata and are
skipped. A counter that went down restarted: its new value is the increase (counted as
``counter_reset``, severity info).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from collector.sources.base import (
    TABLE_ENGINE_METRICS,
    SourceResult,
    UnmappedFamilies,
)
from collector.sources.dcgm import ClockGuard
from collector.sources.exposition import PageSource, Sample, finite, parse_exposition, split_name

ENGINE_PREFIXES: tuple[tuple[str, str], ...] = (
    ("vllm:", "vllm"),
    ("sglang:", "sglang"),
    ("dynamo_frontend_", "dynamo"),
    ("dynamo_component_", "dynamo_worker"),
    ("lmcache:", "lmcache"),
    ("phaselens:", "phaselens"),
)
ENGINES = ("vllm", "sglang", "dynamo", "dynamo_worker", "lmcache", "phaselens")
#: What an ``engine`` filter also takes: metrics that live on the same endpoint.
_COMPANIONS: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm", "lmcache"),
    "sglang": ("sglang", "lmcache"),
    "dynamo": ("dynamo", "dynamo_worker"),
    "dynamo_worker": ("dynamo_worker", "vllm", "sglang", "lmcache"),
    "lmcache": ("lmcache",),
    "phaselens": ("vllm", "phaselens"),
}
ENGINE_ROW_COLUMNS = ("node", "endpoint", "engine", "ts_s", "metric", "labels", "value")

_H, _C, _G = "histogram", "counter", "gauge"


@dataclass(frozen=True, slots=True)
class _Known:
    base: str  # normalised name without suffix
    kind: str  # histogram | counter | gauge
    rank: int = 0  # lower wins when an engine exports two names for one thing


#: (engine, metric stem without prefix and without ``_total``) → normalised metric.
ENGINE_METRICS: dict[str, dict[str, _Known]] = {
    "vllm": {
        "time_to_first_token_seconds": _Known("ttft_seconds", _H),
        "inter_token_latency_seconds": _Known("itl_seconds", _H),
        "time_per_output_token_seconds": _Known("itl_seconds", _H, 1),  # pre-0.11 name of the same
        "request_time_per_output_token_seconds": _Known("tpot_seconds", _H),
        "e2e_request_latency_seconds": _Known("e2e_seconds", _H),
        "request_queue_time_seconds": _Known("queue_seconds", _H),
        "request_prefill_time_seconds": _Known("prefill_seconds", _H),
        "request_decode_time_seconds": _Known("decode_seconds", _H),
        "request_prompt_tokens": _Known("input_sequence_tokens", _H),
        "request_generation_tokens": _Known("output_sequence_tokens", _H),
        "num_requests_running": _Known("requests_running", _G),
        "num_requests_waiting": _Known("requests_waiting", _G),
        "kv_cache_usage_perc": _Known("kv_cache_usage_ratio", _G),
        "gpu_cache_usage_perc": _Known("kv_cache_usage_ratio", _G, 1),
        "prompt_tokens": _Known("prompt_tokens", _C),
        "generation_tokens": _Known("generation_tokens", _C),
        "request_success": _Known("requests", _C),
    },
    "sglang": {
        "time_to_first_token_seconds": _Known("ttft_seconds", _H),
        "inter_token_latency_seconds": _Known("itl_seconds", _H),
        "time_per_output_token_seconds": _Known("itl_seconds", _H, 1),
        "e2e_request_latency_seconds": _Known("e2e_seconds", _H),
        "queue_time_seconds": _Known("queue_seconds", _H),
        "num_running_reqs": _Known("requests_running", _G),
        "num_queue_reqs": _Known("requests_waiting", _G),
        "token_usage": _Known("kv_cache_usage_ratio", _G),
        "prompt_tokens": _Known("prompt_tokens", _C),
        "generation_tokens": _Known("generation_tokens", _C),
        "num_requests": _Known("requests", _C),
    },
    "dynamo": {
        "time_to_first_token_seconds": _Known("ttft_seconds", _H),
        "inter_token_latency_seconds": _Known("itl_seconds", _H),
        "request_duration_seconds": _Known("e2e_seconds", _H),
        "input_sequence_tokens": _Known("input_sequence_tokens", _H),
        "output_sequence_tokens": _Known("output_sequence_tokens", _H),
        "requests": _Known("requests", _C),
        "inflight_requests": _Known("requests_running", _G),
        "queued_requests": _Known("requests_waiting", _G),
    },
    "dynamo_worker": {
        "requests": _Known("requests", _C),
        "request_duration_seconds": _Known("request_duration_seconds", _H),
        "inflight_requests": _Known("requests_running", _G),
        "kvstats_active_blocks": _Known("kv_blocks_used", _G),
        "kvstats_total_blocks": _Known("kv_blocks_total", _G),
        "kvstats_gpu_cache_usage_percent": _Known("kv_cache_usage_ratio", _G),  # 0.0-1.0 despite the name
        "kvstats_gpu_prefix_cache_hit_rate": _Known("prefix_cache_hit_ratio", _G),
    },
    "lmcache": {
        "num_retrieve_requests": _Known("retrieve_requests", _C),
        "num_store_requests": _Known("store_requests", _C),
        "num_requested_tokens": _Known("retrieve_requested_tokens", _C),
        "num_hit_tokens": _Known("retrieve_hit_tokens", _C),
        "retrieve_hit_rate": _Known("retrieve_hit_ratio", _G),
        "local_cache_usage": _Known("local_cache_usage_bytes", _G),
        "remote_cache_usage": _Known("remote_cache_usage_bytes", _G),
        "time_to_retrieve": _Known("retrieve_seconds", _H),
        "time_to_store": _Known("store_seconds", _H),
    },
    "phaselens": {},
}
ENGINE_METRICS["phaselens"] = ENGINE_METRICS["vllm"]  # the bundled router exports vLLM names

#: Counters an engine does not export but its histograms imply: Dynamo's token totals are the
#: sums of its per-request sequence-length histograms.
_DERIVED_COUNTERS: dict[str, dict[str, str]] = {
    "dynamo": {"input_sequence_tokens": "prompt_tokens", "output_sequence_tokens": "generation_tokens"},
}

_DROP_LABELS = ("__name__", "instance", "job")


@dataclass(frozen=True, slots=True)
class EnginePoint:
    """One engine sample after normalisation."""

    engine: str
    base: str  # normalised name without suffix
    kind: str  # histogram | summary | counter | gauge
    suffix: str  # '' | _sum | _count | _bucket | _total
    labels: dict[str, str]
    value: float

    @property
    def metric(self) -> str:
        if self.kind == _C:
            return self.base + "_total"
        return self.base + self.suffix


def _labels_json(labels: dict[str, str]) -> str:
    return json.dumps(labels, sort_keys=True, separators=(",", ":"))


def _engine_of(name: str) -> tuple[str, str] | None:
    for prefix, engine in ENGINE_PREFIXES:
        if name.startswith(prefix):
            return engine, name[len(prefix) :]
    return None


def _classify(s: Sample) -> tuple[str, str, _Known | None, str, str] | None:
    """(engine, raw stem, known spec or None, kind, suffix) for an engine sample, else None."""
    found = _engine_of(s.name)
    if found is None:
        return None
    engine, rest = found
    table = ENGINE_METRICS.get(engine, {})
    known = table.get(rest)
    if known is not None and known.kind in (_G, _C):
        return engine, rest, known, known.kind, "_total" if known.kind == _C else ""
    for suf in ("_total", "_sum", "_count", "_bucket", "_created"):
        if rest.endswith(suf):
            known = table.get(rest[: -len(suf)])
            if known is not None:
                return engine, rest[: -len(suf)], known, known.kind, suf
    if rest in table:  # a histogram's stem alone: a summary-style quantile row; keep it as is
        return engine, rest, table[rest], table[rest].kind, ""
    # Not one we know: pass it through under its own name, prefix removed.
    prefix = s.name[: len(s.name) - len(rest)]
    if s.type in (_C, _H, "summary", "gaugehistogram") and s.stem.startswith(prefix):
        return engine, s.stem[len(prefix) :], None, s.type, s.suffix
    if s.type == _G:
        return engine, rest, None, _G, ""
    stem, suf = split_name(rest)
    kind = {"_total": _C, "_bucket": _H, "_sum": _H, "_count": _H, "_created": _C}.get(suf, _G)
    return engine, stem, None, kind, suf


class EngineMapper:
    """Turns the samples of one snapshot (one endpoint, one instant) into :class:`EnginePoint` s."""

    def __init__(self, engine: str = "auto", *, include_buckets: bool = True, passthrough: bool = True):
        if engine != "auto" and engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; expected 'auto' or one of {ENGINES}")
        self.engine = engine
        self.include_buckets = include_buckets
        self.passthrough = passthrough

    def accepts(self, engine: str) -> bool:
        if self.engine == "auto":
            return True
        return engine in _COMPANIONS[self.engine]

    def map(
        self, samples: Iterable[Sample], result: SourceResult, unmapped: set[str] | None = None
    ) -> list[EnginePoint]:
        """Normalise one snapshot's samples; the families left out are added to ``unmapped``."""
        classified = []
        present: dict[tuple[str, str], int] = {}  # (engine, base) → best rank present
        is_phaselens = self.engine == "phaselens"
        skipped: set[str] = set()
        for s in samples:
            if s.name.endswith("_created"):
                continue  # a counter's or histogram's creation time: metadata, not a metric
            c = _classify(s)
            if c is None or not self.accepts(c[0]):
                skipped.add(s.stem)
                continue
            engine, stem, known, kind, suffix = c
            if suffix in ("_gsum", "_gcount"):
                continue
            if known is None and not self.passthrough:
                skipped.add(s.stem)
                continue
            if suffix == "_bucket" and not self.include_buckets:
                continue
            if not finite(s.value) and not (suffix == "" and kind == "summary"):
                result.count("non_finite", f"{s.name}{s.labels}: {s.value}", severity="warning")
                continue
            is_phaselens = is_phaselens or engine == "phaselens"
            base = known.base if known is not None else stem
            if known is not None:
                key = (engine, base)
                present[key] = min(present.get(key, known.rank), known.rank)
            classified.append((engine, base, known, kind, suffix, s))
        points: list[EnginePoint] = []
        for engine, base, known, kind, suffix, s in classified:
            if known is not None and known.rank > present[(engine, base)]:
                continue  # an engine exporting old and new names: keep the preferred one
            eng = "phaselens" if is_phaselens and engine == "vllm" else engine
            labels = {k: v for k, v in s.labels.items() if k not in _DROP_LABELS}
            points.append(EnginePoint(eng, base, kind, suffix, labels, float(s.value)))
            derived = _DERIVED_COUNTERS.get(engine, {}).get(base)
            if derived and suffix == "_sum" and (engine, derived) not in present:
                points.append(EnginePoint(eng, derived, _C, "_total", labels, float(s.value)))
            if (
                engine == "vllm"
                and base == "cache_config_info"
                and (engine, "kv_blocks_total") not in present
            ):
                blocks = _number(labels.get("num_gpu_blocks"))
                if blocks is not None:  # vLLM's KV capacity is a label of this info gauge
                    keep = {k: v for k, v in labels.items() if k in ("engine", "model_name")}
                    points.append(EnginePoint(eng, "kv_blocks_total", _G, "", keep, blocks))
        if unmapped is not None:
            unmapped |= skipped
        return points


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text else None
    except ValueError:
        return None
    return value if value is not None and finite(value) else None


class DeltaTracker:
    """Per-interval rates and means between consecutive snapshots of the same endpoint."""

    def __init__(self, stale_after_s: float = 3600.0) -> None:
        self._counters: dict[tuple, tuple[float, float]] = {}
        self._hists: dict[tuple, tuple[float, float, float]] = {}
        # Series not seen for this long are forgotten, so label churn (pods come and go) stays bounded.
        self.stale_after_s = stale_after_s
        self._pruned_s: float | None = None

    def __len__(self) -> int:
        return len(self._counters) + len(self._hists)

    def _prune(self, ts_s: float) -> None:
        if self._pruned_s is not None and ts_s - self._pruned_s < self.stale_after_s / 10:
            return
        self._pruned_s = ts_s
        horizon = ts_s - self.stale_after_s
        for d in (self._counters, self._hists):
            for k in [k for k, v in d.items() if v[0] < horizon]:
                del d[k]

    def update(
        self, endpoint: str, ts_s: float, points: list[EnginePoint], result: SourceResult
    ) -> list[tuple[EnginePoint, str]]:
        """Return ``(point, metric name)`` for every delta-derived value of this snapshot."""
        self._prune(ts_s)
        out: list[tuple[EnginePoint, str]] = []
        hist_now: dict[tuple, dict[str, Any]] = {}
        for p in points:
            if p.kind == _C and p.suffix in ("_total", ""):
                key = (endpoint, p.engine, p.base, _labels_json(p.labels))
                prev = self._counters.get(key)
                self._counters[key] = (ts_s, p.value)
                if prev is None or ts_s <= prev[0]:
                    continue
                inc = p.value - prev[1]
                if inc < 0:
                    result.count(
                        "counter_reset",
                        f"{endpoint} {p.metric}{p.labels}: {prev[1]} -> {p.value}",
                        severity="info",
                    )
                    inc = p.value
                out.append((_derived(p, inc / (ts_s - prev[0])), p.base + "_per_s"))
            elif p.kind in (_H, "summary") and p.suffix in ("_sum", "_count"):
                key = (endpoint, p.engine, p.base, _labels_json(p.labels))
                h = hist_now.setdefault(key, {"point": p})
                h[p.suffix] = p.value
        for key, h in hist_now.items():
            if "_sum" not in h or "_count" not in h:
                continue
            prev = self._hists.get(key)
            self._hists[key] = (ts_s, h["_sum"], h["_count"])
            if prev is None or ts_s <= prev[0]:
                continue
            d_sum, d_count = h["_sum"] - prev[1], h["_count"] - prev[2]
            p = h["point"]
            if d_count < 0 or d_sum < 0:
                result.count(
                    "counter_reset",
                    f"{endpoint} {p.base}{p.labels}: count {prev[2]} -> {h['_count']}",
                    severity="info",
                )
                d_sum, d_count = h["_sum"], h["_count"]
            out.append((_derived(p, d_count / (ts_s - prev[0])), p.base + "_count_per_s"))
            if d_count > 0:
                out.append((_derived(p, d_sum / d_count), p.base + "_mean"))
        return out


def _derived(p: EnginePoint, value: float) -> EnginePoint:
    return EnginePoint(p.engine, p.base, p.kind, p.suffix, p.labels, value)


def host_of(url_or_instance: str) -> str | None:
    """The host name of a URL or a Prometheus ``instance`` label (``host:port``); None without one."""
    if "://" not in url_or_instance:
        url_or_instance = "//" + url_or_instance
    return urlsplit(url_or_instance).hostname


class EngineRows:
    """Shared by both sources: points of one snapshot → raw rows + per-interval rows.

    A snapshot with two series under one natural key (engine, metric, labels: the same series twice
    on a page, or two that differ only in ``instance``/``job``, or an old and a new name of a
    counter) keeps the first one in page order and counts the others as ``duplicate_series`` (a
    warning naming the series), so ``engine_metrics`` never holds two values for one key and
    instant.
    """

    def __init__(self, mapper: EngineMapper) -> None:
        self.mapper = mapper
        self.deltas = DeltaTracker()
        self.duplicate_series = 0  # series dropped for a key already taken, since the start

    def rows(
        self,
        samples: Iterable[Sample],
        *,
        node: str | None,
        endpoint: str,
        ts_s: float,
        result: SourceResult,
        unmapped: set[str] | None = None,
    ) -> list[dict[str, Any]]:
        points = self._first_per_key(self.mapper.map(samples, result, unmapped), endpoint, result)
        rows = [_row(node, endpoint, ts_s, p, p.metric) for p in points]
        rows += [
            _row(node, endpoint, ts_s, p, m) for p, m in self.deltas.update(endpoint, ts_s, points, result)
        ]
        return rows

    def _first_per_key(
        self, points: list[EnginePoint], endpoint: str, result: SourceResult
    ) -> list[EnginePoint]:
        seen: set[tuple[str, str, str]] = set()
        kept: list[EnginePoint] = []
        first_dropped: EnginePoint | None = None
        for p in points:
            key = (p.engine, p.metric, _labels_json(p.labels))
            if key in seen:
                first_dropped = first_dropped or p
                continue
            seen.add(key)
            kept.append(p)
        dropped = len(points) - len(kept)
        if first_dropped is not None:
            self.duplicate_series += dropped
            result.count(
                "duplicate_series",
                f"{endpoint}: {dropped} series with the key of an earlier one, e.g. "
                f"{first_dropped.engine} {first_dropped.metric}{first_dropped.labels}; the first kept",
                dropped,
                severity="warning",
            )
        return kept


def _row(node: str | None, endpoint: str, ts_s: float, p: EnginePoint, metric: str) -> dict[str, Any]:
    return {
        "node": node,
        "endpoint": endpoint,
        "engine": p.engine,
        "ts_s": ts_s,
        "metric": metric,
        "labels": dict(sorted(p.labels.items())),  # the store writes it as a JSON object
        "value": p.value,
    }


class EngineScrapeSource(PageSource):
    """Scrapes one engine ``/metrics`` endpoint (vLLM, SGLang, Dynamo frontend, phaselens router).

    ``engine="auto"`` takes every known prefix and labels ``vllm:*`` rows ``phaselens`` when the
    exposition also carries ``phaselens:*`` metrics (the bundled router). ``scrape``: the page's
    deadline, size limit, client, clock and backoff (:class:`~collector.sources.exposition.PageSource`).
    """

    def __init__(
        self,
        url: str,
        *,
        engine: str = "auto",
        node: str | None = None,
        interval_s: float = 5.0,
        include_buckets: bool = True,
        passthrough: bool = True,
        **scrape: Any,
    ) -> None:
        super().__init__(f"engine:{url}", url, interval_s=interval_s, **scrape)
        self.node = node or host_of(url)
        self._rows = EngineRows(
            EngineMapper(engine, include_buckets=include_buckets, passthrough=passthrough)
        )
        self._clock_guard = ClockGuard()
        self._unmapped = UnmappedFamilies()
        self.detected_engines: set[str] = set()

    @property
    def engine(self) -> str:
        return self._rows.mapper.engine

    def _discover(self) -> bool:
        result = SourceResult(self.name, self.clock())
        samples = parse_exposition(self._fetch(), result)
        engines = {c[0] for s in samples if (c := _engine_of(s.name)) and self._rows.mapper.accepts(c[0])}
        self.detected_engines = engines
        return bool(engines)

    def _collect(self, now_s: float, result: SourceResult) -> None:
        text = self._fetch()
        samples = parse_exposition(text, result)
        if not self._clock_guard.admit(self.url, now_s, result, self.url):
            return
        unmapped: set[str] = set()
        rows = self._rows.rows(
            samples, node=self.node, endpoint=self.url, ts_s=now_s, result=result, unmapped=unmapped
        )
        self._unmapped.count(unmapped, now_s, result, f"no engine_metrics mapping (engine={self.engine})")
        self.detected_engines |= {r["engine"] for r in rows}
        result.add_rows(TABLE_ENGINE_METRICS, rows)

    def health_details(self) -> dict[str, Any]:
        return {"unmapped_families": len(self._unmapped), "duplicate_series": self._rows.duplicate_series}
