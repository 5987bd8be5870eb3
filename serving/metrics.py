"""Prometheus metrics of the router, named like vLLM's so existing dashboards work."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from serving.pool import RequestState, WorkerPool

# vLLM's histogram bucket bounds (vllm/v1/metrics/loggers.py): the one copy in this project (the
# router's histograms and analytics/external_validation.py's vLLM pages use these).
VLLM_TTFT_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
VLLM_REQUEST_TIME_BUCKETS_S = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
VLLM_ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# The router's latency histograms: vLLM's TTFT bounds up to 80 s.
_LATENCY_BUCKETS = VLLM_TTFT_BUCKETS_S[: VLLM_TTFT_BUCKETS_S.index(80.0) + 1]


class _PoolCollector(Collector):
    """Gauges read from the pool at scrape time (per worker: engine label = worker id)."""

    def __init__(self, pool: Callable[[], WorkerPool | None], model_name: str) -> None:
        self._pool, self._model = pool, model_name

    def collect(self) -> Iterable:
        pool = self._pool()
        running = GaugeMetricFamily(
            "vllm:num_requests_running",
            "Requests in model execution batches.",
            labels=["model_name", "engine"],
        )
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Requests waiting to be processed.", labels=["model_name", "engine"]
        )
        kv = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            labels=["model_name", "engine"],
        )
        workers = GaugeMetricFamily(
            "phaselens:workers", "Workers by role and state.", labels=["role", "state"]
        )
        dropped = CounterMetricFamily(
            "phaselens:telemetry_dropped_events", "Telemetry events dropped by the router's emitter."
        )
        deaths = CounterMetricFamily("phaselens:worker_deaths", "Worker processes that died unexpectedly.")
        restarts = CounterMetricFamily(
            "phaselens:worker_restarts", "Dead workers the pool restarted (same id, role and device)."
        )
        iteration_errors = CounterMetricFamily(
            "phaselens:iteration_errors",
            "Iterations that raised; their requests failed, the worker went on (since it started).",
            labels=["engine"],
        )
        kv_rejected = CounterMetricFamily(
            "phaselens:kv_handoff_rejected_connections",
            "KV hand-off connections a worker refused and closed (unauthenticated, malformed or oversized "
            "frame, too many connections), since it started.",
            labels=["engine", "reason"],
        )
        emulation = _emulation_families()
        if pool is not None:
            counts: dict[tuple[str, str], int] = {}
            for w in pool.workers.values():
                counts[(w.role, w.state)] = counts.get((w.role, w.state), 0) + 1
                if w.state not in ("ready", "draining"):
                    continue  # a dead or starting worker runs nothing: no stale gauges
                labels = [self._model, w.id]
                running.add_metric(labels, w.stats.get("running", 0))
                waiting.add_metric(labels, w.stats.get("waiting", 0))
                kv.add_metric(labels, w.stats.get("kv_usage", 0.0))
                iteration_errors.add_metric([w.id], w.stats.get("iteration_errors", 0))
                for reason, n in (w.stats.get("kv_rejected") or {}).items():
                    kv_rejected.add_metric([w.id, reason], n)
                _add_emulation(emulation, w.id, w.stats.get("emulation"))
            for (role, state), n in counts.items():
                workers.add_metric([role, state], n)
            dropped.add_metric([], pool.telemetry.dropped_events)
            deaths.add_metric([], pool.worker_deaths)
            restarts.add_metric([], pool.worker_restarts)
        yield from (running, waiting, kv, workers, dropped, deaths, restarts, iteration_errors, kv_rejected)
        yield from emulation.values()


class _RejectedCollector(Collector):
    """Requests the router turned away before admitting them, by reason (serving.admission)."""

    def __init__(self, counts: dict[str, int]) -> None:
        self._counts = counts

    def collect(self) -> Iterable:
        family = CounterMetricFamily(
            "phaselens:requests_rejected",
            "Requests turned away before admission: queue_full (429), body_too_large (413).",
            labels=["reason"],
        )
        for reason, n in sorted(self._counts.items()):
            family.add_metric([reason], n)
        yield family


_EMULATION_LABELS = ["worker", "device", "models_shape"]
# (metric, help, key in the device's emulation counters); counters get the _total suffix on exposition.
_EMULATION_COUNTERS = (
    ("phaselens:emulation_iterations", "Iterations an emulated GPU modeled.", "iterations"),
    (
        "phaselens:emulation_paced_iterations",
        "Iterations paced to the modeled GPU time (the host kept up).",
        "paced_iterations",
    ),
    (
        "phaselens:emulation_lagged_iterations",
        "Iterations whose host time ran past the modeled GPU time (host-bound, not paced).",
        "lagged_iterations",
    ),
    (
        "phaselens:emulation_lag_seconds",
        "Host time beyond the modeled GPU time, summed over lagged iterations.",
        "lag_s_total",
    ),
    ("phaselens:emulation_modeled_seconds", "Modeled GPU time of all iterations.", "modeled_s_total"),
)


def _emulation_families() -> dict[str, CounterMetricFamily | GaugeMetricFamily]:
    families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
        key: CounterMetricFamily(name, text, labels=_EMULATION_LABELS)
        for name, text, key in _EMULATION_COUNTERS
    }
    families["host_bound_fraction"] = GaugeMetricFamily(
        "phaselens:emulation_host_bound_fraction",
        "Share of an emulated GPU's iterations the host could not pace (lagged / iterations).",
        labels=_EMULATION_LABELS,
    )
    return families


def _add_emulation(families: dict, worker: str, counters: dict | None) -> None:
    """One sample per family for an emulated worker (its engine stats carry the device's counters)."""
    if not counters:
        return
    labels = [worker, counters.get("device", ""), counters.get("models_shape", "")]
    for key, family in families.items():
        if counters.get(key) is not None:
            family.add_metric(labels, counters[key])


class ServingMetrics:
    """Histograms and counters updated as requests stream and finish."""

    def __init__(
        self,
        model_name: str,
        pool: Callable[[], WorkerPool | None],
        rejected: dict[str, int] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name"]
        r = self.registry
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token.",
            labels,
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Inter-token latency.",
            labels,
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.tpot = Histogram(
            "vllm:request_time_per_output_token_seconds",
            "Mean time per output token of a request.",
            labels,
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency.",
            labels,
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.queue = Histogram(
            "vllm:request_queue_time_seconds",
            "Time from arrival to first scheduling.",
            labels,
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed.", labels, registry=r)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generation tokens processed.", labels, registry=r
        )
        self.success = Counter(
            "vllm:request_success",
            "Requests finished, by reason.",
            ["model_name", "finished_reason"],
            registry=r,
        )
        self.failed = Counter(
            "phaselens:requests_failed", "Requests that ended in an error.", labels, registry=r
        )
        self.kv_bytes = Counter(
            "phaselens:kv_transfer_bytes",
            "KV bytes handed from prefill to decode workers.",
            labels,
            registry=r,
        )
        self.kv_seconds = Histogram(
            "phaselens:kv_transfer_seconds",
            "KV hand-off time per request.",
            labels,
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.registry.register(_PoolCollector(pool, model_name))
        self.registry.register(_RejectedCollector(rejected if rejected is not None else {}))

    def on_token(self, req: RequestState, ts_s: float) -> None:
        m = self.model_name
        if len(req.token_ts) == 1:
            self.ttft.labels(m).observe(max(0.0, ts_s - req.arrival_s))
        else:
            self.itl.labels(m).observe(max(0.0, ts_s - req.token_ts[-2]))

    def on_finish(self, req: RequestState) -> None:
        m = self.model_name
        if req.finish_reason == "abort":  # aborted (client gone): its reason is in req.error
            self.success.labels(m, "abort").inc()
            return
        if req.error is not None:
            self.failed.labels(m).inc()
            return
        self.success.labels(m, req.finish_reason or "stop").inc()
        self.prompt_tokens.labels(m).inc(len(req.prompt_ids))
        self.generation_tokens.labels(m).inc(len(req.output_ids))
        self.e2e.labels(m).observe(max(0.0, (req.finished_s or 0) - req.arrival_s))
        if len(req.token_ts) > 1:
            self.tpot.labels(m).observe((req.token_ts[-1] - req.token_ts[0]) / (len(req.token_ts) - 1))
        sched = req.meta.get("first_scheduled_s")
        if sched is not None:
            self.queue.labels(m).observe(max(0.0, sched - req.arrival_s))
        if req.meta.get("kv_transfer_bytes") is not None:
            self.kv_bytes.labels(m).inc(req.meta["kv_transfer_bytes"])
            self.kv_seconds.labels(m).observe(
                max(0.0, req.meta["kv_transfer_end_s"] - req.meta["kv_transfer_start_s"])
            )

    def render(self) -> bytes:
        return generate_latest(self.registry)
