"""What the collector service samples and where it writes: :class:`CollectorSettings` (the
options of ``phaselens collect``) and the sources built from them (:meth:`~CollectorSettings.build_sources`).
The service itself (pollers, writer, jobs) is collector/service.py.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from collector.report_limits import DEFAULT_SCHEDULES, ReportLimits
from collector.sources.backoff import DEFAULT_MAX_BACKOFF_S, Backoff
from collector.sources.base import Source
from collector.sources.dcgm import DcgmSource
from collector.sources.http import DEFAULT_MAX_PAGE_BYTES, DEFAULT_SCRAPE_TIMEOUT_S
from collector.sources.local_gpus import LocalGpuSource
from collector.sources.prometheus import EngineScrapeSource
from collector.sources.prometheus_query import PrometheusQuerySource
from collector.sources.serving_batch import SERVING_READS, ServingStackSource
from collector.store import RetentionPolicy


@dataclass(slots=True)
class CollectorSettings:
    """What `phaselens collect` samples and where it writes."""

    db_path: str = "phaselens.duckdb"
    host: str = "127.0.0.1"
    port: int = 8900
    node: str = field(default_factory=socket.gethostname)
    serving_urls: list[str] = field(default_factory=list)
    dcgm_urls: list[str] = field(default_factory=list)
    engine_urls: list[str] = field(default_factory=list)
    prometheus_url: str | None = None
    nvml: bool = True  # sample this host's NVIDIA GPUs when NVML is there
    gpu_interval_s: float = 0.1
    telemetry_interval_s: float = 0.5
    serving_read: str = "auto"  # SERVING_READS: "auto" (GET /v1/collect where offered) | "per-worker"
    scrape_interval_s: float = 1.0
    dcgm_interval_s: float = 1.0  # dcgm-exporter scrape period (unchanged refreshes are not stored again)
    # one deadline per dcgm/engine scrape (connect + headers + body) and the largest page read; a
    # larger page is dropped and counted (pages_too_large), the source degraded
    scrape_timeout_s: float = DEFAULT_SCRAPE_TIMEOUT_S
    max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES
    max_backoff_s: float = DEFAULT_MAX_BACKOFF_S  # the longest wait before a failed source is retried
    flush_interval_s: float = 1.0  # commit (to DuckDB's WAL): the most a kill -9 can lose
    checkpoint_interval_s: float = 60.0  # fold the WAL into the file
    max_queue: int = 10_000  # poll results waiting for the writer; beyond it the oldest are dropped
    # rows the store holds while the disk refuses writes (None: its default, 2 write buffers)
    max_held_rows: int | None = None
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    retention_interval_s: float = 600.0  # how often raw samples past retention are rolled up (also at start)
    control_token: str | None = None  # bearer token of the control endpoints (POST /api/v1/import); None: off
    # scheduled reports, NAME=CRON (UTC; phaselens/reports.py); () for none
    report_schedules: tuple[str, ...] = DEFAULT_SCHEDULES
    # reports kept (count, bytes; the oldest pruned) and the rate of manual ones (collector/report_limits.py)
    report_limits: ReportLimits = field(default_factory=ReportLimits)
    # GET /metrics: counters of the live data, counted one step (at most metrics_window_s of data)
    # every metrics_interval_s (phaselens/metrics_export.py)
    metrics_window_s: float = 300.0
    metrics_interval_s: float = 15.0
    metrics_settle_s: float = 30.0  # data is counted once it is this old

    def build_sources(self) -> list[Source]:
        """One source per URL and kind (and this host's GPUs when NVML is there), each with its
        own back-off."""
        sources: list[Source] = []

        def backoff() -> Backoff:  # one per source: each has its own failures
            return Backoff(max_s=max(self.max_backoff_s, Backoff.base_s))

        if self.nvml:
            local = LocalGpuSource(node=self.node, interval_s=self.gpu_interval_s, backoff=backoff())
            if local.available():
                sources.append(local)
        if self.serving_urls and self.serving_read not in SERVING_READS:
            raise ValueError(f"serving_read {self.serving_read!r}; allowed: {', '.join(SERVING_READS)}")
        for url in self.serving_urls:
            sources.append(  # GET /v1/collect each telemetry interval, or the per-worker reads
                ServingStackSource(
                    url,
                    node=self.node,
                    interval_s=self.telemetry_interval_s,
                    gpu_interval_s=self.gpu_interval_s,
                    batched=None if self.serving_read == "auto" else False,
                    backoff=backoff(),
                )
            )
        page = {"timeout_s": self.scrape_timeout_s, "max_page_bytes": self.max_page_bytes}
        sources += [
            DcgmSource(u, node=self.node, interval_s=self.dcgm_interval_s, backoff=backoff(), **page)
            for u in self.dcgm_urls
        ]
        sources += [
            EngineScrapeSource(u, interval_s=self.scrape_interval_s, backoff=backoff(), **page)
            for u in self.engine_urls
        ]
        if self.prometheus_url:
            sources.append(PrometheusQuerySource(self.prometheus_url, interval_s=15.0, backoff=backoff()))
        return sources


__all__ = ["CollectorSettings"]
