"""Scrape sources of the collector: dcgm-exporter, serving-engine ``/metrics``, the Prometheus query API.

Every source has ``name``, ``available()`` (cached discovery), ``poll()`` → :class:`SourceResult`
(rows per table plus counted :class:`IngestError` s; never raises) and ``health()`` →
:class:`SourceHealth`. Every HTTP fetch has one deadline and a size limit (``collector/sources/http.py``);
unreachable endpoints are retried with exponential backoff capped at 10 s.
"""

from collector.sources.backoff import Backoff
from collector.sources.base import (
    TABLE_ENGINE_METRICS,
    TABLE_GPU_SAMPLES,
    IngestError,
    Source,
    SourceHealth,
    SourceResult,
    SourceUnavailable,
)
from collector.sources.dcgm import DCGM_FIELDS, GPU_ROW_COLUMNS, DcgmSource
from collector.sources.prometheus import ENGINE_METRICS, ENGINE_ROW_COLUMNS, EngineScrapeSource
from collector.sources.prometheus_query import PrometheusQuerySource

__all__ = [
    "DCGM_FIELDS",
    "ENGINE_METRICS",
    "ENGINE_ROW_COLUMNS",
    "GPU_ROW_COLUMNS",
    "TABLE_ENGINE_METRICS",
    "TABLE_GPU_SAMPLES",
    "Backoff",
    "DcgmSource",
    "EngineScrapeSource",
    "IngestError",
    "PrometheusQuerySource",
    "Source",
    "SourceHealth",
    "SourceResult",
    "SourceUnavailable",
]
