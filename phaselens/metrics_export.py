"""``GET /metrics``: the service's derived figures and its own health in the Prometheus text format
(version 0.0.4), so that an existing Prometheus/Grafana can chart them (docs/PROMETHEUS.md lists
every series; docs/grafana/phaselens.json charts them).

Derived figures (phase time fractions, stranded / host-bound / idle shares, J/token, $/1M tokens,
SLO attainment; per GPU, per pool and for the fleet, each with a ``trust`` label) come from a
computation over the last ``metrics_window_s`` of live data that a thread repeats every
``metrics_interval_s`` through the overview cache (``phaselens/overview.py``) — never on a scrape —
while ``/metrics`` is being scraped (it idles after 10 minutes without a scrape).
A scrape renders what the last computation left plus the collector's health, and never fails: if
the last computation failed, the previous figures are exported with
``phaselens_derived_up 0`` and the failure counted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector as PromCollector
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger(__name__)

# phase breakdown fractions → the phase label of phaselens_phase_time_ratio
PHASE_FRACTIONS = {
    "prefill": ("frac_prefill",),
    "decode": ("frac_decode",),
    "mixed": ("frac_mixed_prefill", "frac_mixed_decode"),
    "host_bound": ("frac_host", "frac_gap"),
    "idle": ("frac_idle",),
    "unsampled": ("frac_unsampled",),  # in gaps of the GPU's samples: not known, not idle
}
# the estimated states of GPUs without phaselens telemetry (analytics.external) → their phase label
EXTERNAL_PHASES = ("prefill", "decode", "other_busy", "idle")
# idle split fractions → their own metric (name, help)
SHARES = {
    "frac_stranded_compute": (
        "phaselens_stranded_compute_ratio",
        "Share of GPU-time busy in decode with the compute idle (decode seconds x (1 - SM activity)).",
    ),
    "frac_stranded_bandwidth": (
        "phaselens_stranded_bandwidth_ratio",
        "Share of GPU-time busy in prefill with the memory bandwidth idle (prefill seconds x (1 - DRAM activity)).",
    ),
    "frac_host_bound": (
        "phaselens_host_bound_ratio",
        "Share of GPU-time the GPU waited on the host between or inside iterations.",
    ),
    "frac_idle": ("phaselens_idle_ratio", "Share of GPU-time with no work."),
}
LABELS = ("scope", "pool", "node", "gpu", "trust")
# The refresh thread idles when nobody scrapes for this long (at least IDLE_AFTER_SCRAPES intervals),
# so a collector that no Prometheus scrapes spends nothing on derived figures.
IDLE_AFTER_S = 600.0
IDLE_AFTER_SCRAPES = 3


@dataclass(slots=True)
class Sample:
    """One derived series value: metric name, labels, value."""

    name: str
    labels: dict[str, str]
    value: float


@dataclass(slots=True)
class Snapshot:
    """What the last successful computation left, and how the computations went."""

    samples: list[Sample] = field(default_factory=list)
    window_s: float = 0.0
    window: tuple[float, float] | None = None  # [start_s, end_s) the samples cover
    last_success_s: float | None = None
    last_compute_s: float | None = None
    ok_total: int = 0
    error_total: int = 0
    last_error: str | None = None
    up: bool = False


def _trust(labels: Iterable[str]) -> str:
    return ",".join(labels) or "none"


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if f == f and abs(f) != float("inf") else None


def _gpu_name(row: dict[str, Any], uuids: dict[tuple[str, str, Any], str] | None = None) -> str:
    """A GPU's label: its UUID (from the row, else from ``uuids`` by node, device and index), else
    ``device/index``."""
    uuid = row.get("uuid")
    if not (isinstance(uuid, str) and uuid) and uuids:
        uuid = uuids.get((str(row.get("node")), str(row.get("device")), row.get("index")))
    if isinstance(uuid, str) and uuid:
        return uuid
    return f"{row.get('device')}/{row.get('index')}"


def derived_samples(summary: dict[str, Any], overview: dict[str, Any]) -> list[Sample]:
    """The derived series of one live summary and its overview (pure: what ``/metrics`` exports)."""
    parts = summary.get("parts") or {}
    out: list[Sample] = []

    def add(name: str, value: Any, **labels: str) -> None:
        v = _finite(value)
        if v is not None:
            out.append(Sample(name, {k: labels.get(k, "") for k in LABELS} | labels, v))

    phases = parts.get("phases") or {}
    ptrust = _trust((phases.get("trust") or {}).get("labels") or [])
    for scope, rows in (("pool", phases.get("per_pool") or []), ("gpu", phases.get("per_gpu") or [])):
        for r in rows:
            where = {"scope": scope, "pool": str(r.get("role") or ""), "trust": ptrust}
            if scope == "gpu":
                where |= {"node": str(r.get("node") or ""), "gpu": _gpu_name(r)}
            for phase, cols in PHASE_FRACTIONS.items():
                vals = [_finite(r.get(c)) for c in cols]
                if all(v is None for v in vals):
                    continue
                add("phaselens_phase_time_ratio", sum(v or 0.0 for v in vals), phase=phase, **where)
    external = parts.get("external") or {}  # GPUs without phaselens telemetry: estimated shares
    etrust = _trust((external.get("trust") or {}).get("labels") or [])
    for scope, rows in (("pool", external.get("per_pool") or []), ("gpu", external.get("per_gpu") or [])):
        for r in rows:
            where = {"scope": scope, "pool": str(r.get("pool") or ""), "trust": etrust}
            if scope == "gpu":
                where |= {"node": str(r.get("node") or ""), "gpu": str(r.get("gpu") or "")}
            for phase in EXTERNAL_PHASES:
                add("phaselens_phase_time_ratio", r.get(f"{phase}_share"), phase=phase, **where)
    uuids = {
        (str(r.get("node")), str(r.get("device")), r.get("index")): r["uuid"]
        for r in phases.get("per_gpu") or []
        if isinstance(r.get("uuid"), str) and r["uuid"]
    }
    idle = parts.get("idle") or {}
    itrust = _trust((idle.get("trust") or {}).get("labels") or [])
    for scope, rows in (("pool", idle.get("per_pool") or []), ("gpu", idle.get("per_gpu") or [])):
        for r in rows:
            where = {"scope": scope, "pool": str(r.get("role") or ""), "trust": itrust}
            if scope == "gpu":
                where |= {"node": str(r.get("node") or ""), "gpu": _gpu_name(r, uuids)}
            for col, (name, _help) in SHARES.items():
                add(name, r.get(col), **where)
    cost = parts.get("cost") or {}
    ctrust = _trust((cost.get("trust") or {}).get("labels") or [])
    cost_rows = [("fleet", cost.get("total") or {})]
    cost_rows += [("pool", r) for r in cost.get("by_pool") or []]
    cost_rows += [("gpu", r) for r in cost.get("by_gpu") or []]
    for scope, r in cost_rows:
        if not r:
            continue
        where = {"scope": scope, "trust": ctrust}
        if scope == "pool":
            where["pool"] = str(r.get("pool") or "")
        if scope == "gpu":
            where |= {"node": str(r.get("node") or ""), "gpu": str(r.get("gpu") or "")}
        add("phaselens_energy_per_token_joules", r.get("j_per_input_token"), phase="prefill", **where)
        add("phaselens_energy_per_token_joules", r.get("j_per_output_token"), phase="decode", **where)
        add("phaselens_cost_per_million_tokens_dollars", r.get("usd_per_1m_input"), kind="input", **where)
        add("phaselens_cost_per_million_tokens_dollars", r.get("usd_per_1m_output"), kind="output", **where)
        add("phaselens_cost_per_million_tokens_dollars", r.get("usd_per_1m_tokens"), kind="all", **where)
        if scope == "fleet":
            add("phaselens_cost_per_request_dollars", r.get("usd_per_request"), **where)
    latency = parts.get("latency") or {}
    ltrust = _trust((latency.get("trust") or {}).get("labels") or [])
    if latency.get("requests"):
        for slo, v in (latency.get("attainment") or {}).items():
            if slo in ("both", "ttft", "tpot"):
                add("phaselens_slo_attainment_ratio", v, scope="fleet", slo=slo, trust=ltrust)
    gpu_time = overview.get("gpu_time") or {}
    gtrust = _trust(gpu_time.get("trust") or [])
    rows = [("fleet", "", gpu_time.get("shares") or {})]
    rows += [("pool", pool, shares) for pool, shares in (gpu_time.get("per_pool") or {}).items()]
    for scope, pool, shares in rows:
        for category, v in shares.items():
            add("phaselens_gpu_time_ratio", v, scope=scope, pool=pool, category=category, trust=gtrust)
    figures = overview.get("figures") or {}
    tps = figures.get("output_tokens_per_s") or {}
    add(
        "phaselens_output_tokens_per_second",
        tps.get("value"),
        scope="fleet",
        trust=_trust(tps.get("trust") or []),
    )
    return out


# (name, help) of every derived metric, for HELP lines
DERIVED_HELP = {
    "phaselens_phase_time_ratio": "Share of attributed GPU-time in each engine phase (prefill, decode, mixed, "
    "host_bound, idle) over the export window; GPUs without phaselens telemetry (dcgm-exporter under "
    "vLLM/SGLang/Dynamo) have estimated shares (trust label estimated; phase other_busy: busy, not engine work).",
    **{name: text for name, text in SHARES.values()},
    "phaselens_energy_per_token_joules": "Energy per token, J: phase=prefill per input token, phase=decode per "
    "output token (with the side's share of host-bound and idle energy).",
    "phaselens_cost_per_million_tokens_dollars": "All-in cost per 1M tokens, USD (GPU-hours at list price + "
    "energy x electricity x PUE), kind=input|output (the side's cost per token of that side) or all (all cost "
    "per input + output token: the one to compare layouts and periods by).",
    "phaselens_cost_per_request_dollars": "All-in cost of the export window per request finished in it, USD.",
    "phaselens_slo_attainment_ratio": "Share of the requests arrived in the export window meeting the SLO "
    "(slo=both|ttft|tpot); a failed, aborted or rejected request misses.",
    "phaselens_gpu_time_ratio": "Where the GPU-time goes (category=productive_prefill, productive_decode, "
    "stranded, host_bound, other_busy, idle, unsampled; they sum to 1), for the fleet and per pool.",
    "phaselens_output_tokens_per_second": "Output tokens generated per second, the window average (output "
    "tokens in the export window / the seconds of it its GPUs were observed; the Overview's and phaselens analyze's headline), all GPUs.",
}


class MetricsExporter(PromCollector):
    """The ``/metrics`` exposition: a thread recomputes the derived figures; ``collect()`` (a
    scrape) only renders the last snapshot and the collector's counters."""

    def __init__(
        self,
        collector: Any,
        overviews: Any,
        *,
        window_s: float | None = None,
        interval_s: float | None = None,
    ) -> None:
        settings = collector.settings
        self.collector = collector
        self.overviews = overviews
        self.window_s = float(
            window_s if window_s is not None else getattr(settings, "metrics_window_s", 300.0)
        )
        self.interval_s = float(
            interval_s if interval_s is not None else getattr(settings, "metrics_interval_s", 15.0)
        )
        self.snapshot = Snapshot(window_s=self.window_s)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._kick = threading.Event()  # a scrape wakes an idle refresh thread
        self._last_scrape_s: float | None = None
        self._thread: threading.Thread | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    # -- the computation ---------------------------------------------------------------------------

    def refresh(self) -> bool:
        """Recompute the derived figures now (the thread's step); False when it failed."""
        end = time.time()
        params = {"dataset": "live", "start_s": end - self.window_s, "end_s": end}
        t = time.perf_counter()
        try:
            got = self.overviews.get(params)
            samples = derived_samples(got.current, got.overview)
        except Exception as e:  # counted and exported; the previous figures stay
            with self._lock:
                s = self.snapshot
                s.error_total += 1
                s.last_error = f"{type(e).__name__}: {e}"
                s.up = False
                s.last_compute_s = time.perf_counter() - t
            log.warning("derived metrics not refreshed: %s", e)
            return False
        with self._lock:
            s = self.snapshot
            s.samples = samples
            w = got.current.get("window") or {}
            s.window = (float(w.get("start_s", params["start_s"])), float(w.get("end_s", end)))
            s.ok_total += 1
            s.last_success_s = time.time()
            s.last_compute_s = time.perf_counter() - t
            s.last_error = None
            s.up = True
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
            samples = list(s.samples)
            state = (s.up, s.ok_total, s.error_total, s.last_success_s, s.last_compute_s)
            window = s.window
        families: dict[str, GaugeMetricFamily] = {}
        for sample in samples:
            fam = families.get(sample.name)
            if fam is None:
                fam = GaugeMetricFamily(
                    sample.name, DERIVED_HELP.get(sample.name, sample.name), labels=list(sample.labels)
                )
                families[sample.name] = fam
            fam.add_metric(list(sample.labels.values()), sample.value)
        yield from families.values()
        up, ok, err, last_s, compute_s = state
        yield GaugeMetricFamily(
            "phaselens_derived_up",
            "1 when the last computation of the derived figures succeeded, else 0 (also before the first).",
            value=int(up),
        )
        runs = CounterMetricFamily(
            "phaselens_derived_computations",
            "Computations of the derived figures, by result.",
            labels=["result"],
        )
        runs.add_metric(["ok"], ok)
        runs.add_metric(["error"], err)
        yield runs
        yield GaugeMetricFamily(
            "phaselens_derived_window_seconds",
            "Length of the live window the derived figures cover, s.",
            value=self.window_s,
        )
        if window is not None:
            yield GaugeMetricFamily(
                "phaselens_derived_window_start_timestamp_seconds",
                "Start of the window the exported derived figures cover, UTC epoch s.",
                value=window[0],
            )
            yield GaugeMetricFamily(
                "phaselens_derived_window_end_timestamp_seconds",
                "End of the window the exported derived figures cover, UTC epoch s.",
                value=window[1],
            )
        if last_s is not None:
            yield GaugeMetricFamily(
                "phaselens_derived_last_success_timestamp_seconds",
                "When the derived figures were last computed, UTC epoch s.",
                value=last_s,
            )
        if compute_s is not None:
            yield GaugeMetricFamily(
                "phaselens_derived_compute_seconds",
                "How long the last computation of the derived figures took, s.",
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
        """The derived figures and the collector's health, Prometheus text format 0.0.4."""
        return Response(exporter.render(), media_type=CONTENT_TYPE_PLAIN_0_0_4)
