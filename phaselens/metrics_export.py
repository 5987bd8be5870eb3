"""``GET /metrics``: the service's counters and its own health in the Prometheus text format
(version 0.0.4), so that an existing Prometheus/Grafana can chart and sum them (docs/PROMETHEUS.md lists
every series; docs/grafana/phaselens.json, built by phaselens/grafana_dashboard.py, charts them).

The figures are counters (GPU-seconds, joules and dollars per GPU-time category, tokens, requests,
control actions; phaselens/metrics_counters.py counts them): a thread counts the settled live data
one step every ``metrics_interval_s`` (at most ``metrics_window_s`` per step, so a backlog is caught
up in steps) while ``/metrics`` is being scraped (it idles after 10 minutes without a scrape, and
catches up on the next). A scrape renders the running totals plus the collector's health, never
computes, and never fails: a failed step counts nothing, is retried and is exported as
``phaselens_derived_up 0``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector as PromCollector
from prometheus_client.registry import CollectorRegistry

from phaselens.metrics_counters import (
    COUNTERS,
    LOOKBACK_S,
    SETTLE_S,
    Totals,
    count_step,
    drop_cursor,
    load_cursor,
    save_cursor,
    state_path,
    trust_values,
)

log = logging.getLogger(__name__)

# The refresh thread idles when nobody scrapes for this long (at least IDLE_AFTER_SCRAPES intervals),
# so a collector that no Prometheus scrapes spends nothing on counting (it catches up on the next).
IDLE_AFTER_S = 600.0
IDLE_AFTER_SCRAPES = 3
BORN_HOLD_STEPS = 4  # a new series is exported as 0 for this many --metrics-interval-s (60 s by default)


@dataclass(slots=True)
class Snapshot:
    """The running totals and how the steps went."""

    totals: Totals = field(default_factory=Totals)
    trust: dict[str, list[str]] = field(default_factory=dict)
    start_s: float = 0.0  # where this process began counting
    end_s: float = 0.0  # counted up to here (the cursor)
    last_success_s: float | None = None
    last_compute_s: float | None = None
    ok_total: int = 0
    error_total: int = 0
    last_error: str | None = None
    up: bool = False


class MetricsExporter(PromCollector):
    """The ``/metrics`` exposition: a thread counts the live data step by step; ``collect()`` (a
    scrape) only renders the running totals and the collector's counters."""

    def __init__(
        self,
        collector: Any,
        *,
        window_s: float | None = None,
        interval_s: float | None = None,
        settle_s: float | None = None,
        lookback_s: float = LOOKBACK_S,
    ) -> None:
        settings = collector.settings
        self.collector = collector
        #: the most one step counts (a backlog is caught up in steps of this)
        self.window_s = float(
            window_s if window_s is not None else getattr(settings, "metrics_window_s", 300.0)
        )
        self.interval_s = float(
            interval_s if interval_s is not None else getattr(settings, "metrics_interval_s", 15.0)
        )
        self.settle_s = float(
            settle_s if settle_s is not None else getattr(settings, "metrics_settle_s", SETTLE_S)
        )
        self.lookback_s = float(lookback_s)
        self.state_file = state_path(getattr(settings, "db_path", None))
        start, how = load_cursor(self.state_file, time.time(), settle_s=self.settle_s)
        log.info("metrics counters: %s", how)
        start = math.floor(start)
        self.snapshot = Snapshot(start_s=start, end_s=start)
        # new series show 0 this long first (a Prometheus scraping at least this often sees them start)
        self.snapshot.totals.hold_s = max(BORN_HOLD_STEPS * self.interval_s, 0.0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._kick = threading.Event()  # a scrape wakes an idle refresh thread
        self._last_scrape_s: float | None = None
        self._thread: threading.Thread | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    # -- the counting --------------------------------------------------------------------------------

    def refresh(self, now_s: float | None = None) -> bool:
        """Count the next step of settled data now (the thread's step; at most ``window_s`` of it,
        up to ``now - settle_s``); False when it failed (nothing counted, the step is retried)."""
        now = time.time() if now_s is None else now_s
        with self._lock:
            start = self.snapshot.end_s
        end = float(math.floor(min(now - self.settle_s, start + self.window_s)))
        t = time.perf_counter()
        if end > start:
            try:
                with self.collector.store.reader() as cur:
                    step = count_step(cur, start, end, lookback_s=self.lookback_s)
            except Exception as e:  # counted and exported; nothing of the step is counted
                with self._lock:
                    s = self.snapshot
                    s.error_total += 1
                    s.last_error = f"{type(e).__name__}: {e}"
                    s.up = False
                    s.last_compute_s = time.perf_counter() - t
                log.warning("metrics counters not advanced past %.0f: %s", start, e)
                return False
        with self._lock:
            s = self.snapshot
            if end > start:
                s.totals.add(step, time.time())
                s.end_s = end
                for part, labels in step.trust.items():
                    if labels:  # a step without data keeps the labels known
                        s.trust[part] = labels
            s.ok_total += 1
            s.last_success_s = time.time()
            s.last_compute_s = time.perf_counter() - t
            s.last_error = None
            s.up = True
        if end > start:
            try:
                save_cursor(self.state_file, end)
            except OSError as e:  # counting goes on; a restart must not resume from a stale cursor
                log.warning("metrics counters: cursor not saved to %s: %s", self.state_file, e)
                drop_cursor(self.state_file)
        return True

    def _scraped_recently(self) -> bool:
        last = self._last_scrape_s
        return last is not None and time.time() - last < max(
            IDLE_AFTER_SCRAPES * self.interval_s, IDLE_AFTER_S
        )

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._scraped_recently():
                self.refresh()
                self._stop.wait(self.interval_s)
            else:  # nobody scrapes: compute nothing until the next scrape
                self._kick.wait(1.0)
                self._kick.clear()

    def start(self) -> None:
        """Start the refresh thread: it computes every ``interval_s`` while ``/metrics`` is being
        scraped (the first computation right after the first scrape) and idles otherwise."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, daemon=True, name="metrics-export")
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    # -- a scrape ------------------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """Every family of the exposition (called by ``generate_latest`` on each scrape)."""
        with self._lock:
            s = self.snapshot
            s.totals.release(time.time())
            values = dict(s.totals.exported)
            trust = dict(s.trust)
            state = (s.up, s.ok_total, s.error_total, s.last_success_s, s.last_compute_s)
            span = (s.start_s, s.end_s)
        families = {
            name: CounterMetricFamily(name, text, labels=list(labels))
            for name, (labels, text) in COUNTERS.items()
        }
        for (name, labels), v in sorted(values.items()):
            families[name].add_metric(list(labels), v)
        yield from (f for f in families.values() if f.samples)
        info = GaugeMetricFamily(
            "phaselens_trust",
            "1 where the counted figures of a part (gpu_time, cost, requests) carry the trust label "
            "(measured, emulated, simulated, host-bound, estimated) in the last step with data, else 0.",
            labels=["part", "trust"],
        )
        for part, label, v in trust_values(trust):
            info.add_metric([part, label], v)
        yield info
        yield GaugeMetricFamily(
            "phaselens_counters_start_timestamp_seconds",
            "Where this process began counting (its counters start at 0 there), UTC epoch s.",
            value=span[0],
        )
        yield GaugeMetricFamily(
            "phaselens_counters_end_timestamp_seconds",
            "The counters hold the live data up to here, UTC epoch s (the settle lag behind now, or "
            "further while catching up).",
            value=span[1],
        )
        up, ok, err, last_s, compute_s = state
        yield GaugeMetricFamily(
            "phaselens_derived_up",
            "1 when the last counting step succeeded, else 0 (also before the first).",
            value=int(up),
        )
        runs = CounterMetricFamily(
            "phaselens_derived_computations",
            "Counting steps, by result.",
            labels=["result"],
        )
        runs.add_metric(["ok"], ok)
        runs.add_metric(["error"], err)
        yield runs
        if last_s is not None:
            yield GaugeMetricFamily(
                "phaselens_derived_last_success_timestamp_seconds",
                "When the last counting step succeeded, UTC epoch s.",
                value=last_s,
            )
        if compute_s is not None:
            yield GaugeMetricFamily(
                "phaselens_derived_compute_seconds",
                "How long the last counting step took, s.",
                value=compute_s,
            )
        yield from self._health()

    def _health(self) -> Iterator[Metric]:
        """The collector's own health: rows ingested, drops, gaps, errors, sources up."""
        c = self.collector
        st = c.stats
        rows = CounterMetricFamily(
            "phaselens_ingest_rows", "Rows written to the store, by table.", labels=["table"]
        )
        for table, n in sorted(st.rows_written.items()):
            rows.add_metric([table], n)
        yield rows
        yield CounterMetricFamily(
            "phaselens_ingest_results_dropped",
            "Poll results dropped because the writer fell behind.",
            value=st.results_dropped,
        )
        yield CounterMetricFamily(
            "phaselens_store_errors", "Store errors (refused rows, failed flushes).", value=st.store_errors
        )
        yield CounterMetricFamily(
            "phaselens_store_rows_lost",
            "Rows counted as written that a failed background flush lost (not held: a flush the "
            "disk refused is held and retried).",
            value=st.rows_lost,
        )
        yield GaugeMetricFamily(
            "phaselens_store_write_failing",
            "1 while the disk refuses the store's writes (no space left, ...), else 0.",
            value=0 if c.store.write_failure is None else 1,
        )
        yield GaugeMetricFamily(
            "phaselens_store_rows_held",
            "Rows appended and not yet committed (held while writes fail).",
            value=c.store.held_rows,
        )
        yield CounterMetricFamily(
            "phaselens_store_rows_dropped",
            "Held rows dropped past the bound while writes failed (recorded as store_gap).",
            value=sum(st.rows_dropped.values()),
        )
        yield GaugeMetricFamily(
            "phaselens_ingest_queue_depth", "Poll results waiting for the writer.", value=c._queue.qsize()
        )
        yield GaugeMetricFamily(
            "phaselens_uptime_seconds", "Seconds since the service started.", value=time.time() - c.started_s
        )
        up = GaugeMetricFamily(
            "phaselens_source_up",
            "1 when the source's last poll succeeded (status ok), else 0.",
            labels=["source"],
        )
        src_rows = CounterMetricFamily("phaselens_source_rows", "Rows a source delivered.", labels=["source"])
        src_err = CounterMetricFamily(
            "phaselens_source_errors", "Errors a source reported.", labels=["source"]
        )
        gaps = CounterMetricFamily(
            "phaselens_telemetry_gaps", "Telemetry sequence gaps detected.", labels=["source"]
        )
        missing = CounterMetricFamily(
            "phaselens_telemetry_missing_batches",
            "Telemetry batches missing in detected gaps.",
            labels=["source"],
        )
        for src in c.sources:
            try:
                h = {**src.health().to_dict(), **src.health_details()}
            except Exception as e:  # a scrape never fails on one source
                log.warning("health of %s: %s", src.name, e)
                continue
            name = str(h.get("name") or src.name)
            up.add_metric([name], 1.0 if h.get("status") == "ok" else 0.0)
            src_rows.add_metric([name], float(h.get("rows_total") or 0))
            src_err.add_metric([name], float(h.get("errors_total") or 0))
            if h.get("telemetry_gaps") is not None:
                gaps.add_metric([name], float(h["telemetry_gaps"]))
                missing.add_metric([name], float(h.get("telemetry_missing_batches") or 0))
        yield from (up, src_rows, src_err, gaps, missing)

    def render(self) -> bytes:
        """The exposition text of one scrape (which keeps the refresh thread computing)."""
        idle = not self._scraped_recently()
        self._last_scrape_s = time.time()
        if idle:
            self._kick.set()
        return generate_latest(self.registry)


def add_metrics_route(app: Any, exporter: MetricsExporter) -> None:
    """``GET /metrics`` on ``app``."""
    from fastapi.responses import Response

    # the class itself, not the postponed annotation: a string 'Response' (imported here only) is
    # a type FastAPI cannot resolve, and /openapi.json failed on it
    @app.get("/metrics", response_class=Response, response_model=None)
    def metrics() -> Any:
        """The counters and the collector's health, Prometheus text format 0.0.4."""
        return Response(exporter.render(), media_type=CONTENT_TYPE_PLAIN_0_0_4)
