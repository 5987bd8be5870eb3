"""The service process's HTTP API: the collector's app (collector/api.py: health, tables, scenarios,
the import) plus the reads composed here, over the layers below: time-range reads of every table,
latest values per device, the analytics (summary, histogram, overview), the efficiency reports
(phaselens/reports.py), the power calibrations (phaselens/power_api.py) and GET /metrics (phaselens/metrics_export.py). The report scheduler and the
metrics export run as the collector's jobs (:meth:`collector.service.Collector.add_job`), so they
start after its writer and stop before it.

The table reads live here, not in the collector, because every time parameter of every endpoint is
checked by one function, ``analytics.window.epoch_s`` (the same values accepted and refused as by
the CLI), and the collector imports nothing from the analytics layer above it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from collector.api import MAX_ROWS, create_collector_app, error_response, param_of, records
from collector.service import Collector
from collector.store import StoreError
from collector.store.tables import TABLES
from phaselens.apply_api import add_apply_routes
from phaselens.metrics_export import MetricsExporter, add_metrics_route
from phaselens.overview import OVERVIEW_PARAMS, OverviewService
from phaselens.power_api import add_power_routes
from phaselens.recommend_api import add_recommend_routes
from phaselens.reports import ReportScheduler, add_report_routes, parse_schedules
from phaselens.summary_cache import SummaryCache
from phaselens.summary_warm import SummaryWarmer
from phaselens.workload_api import add_workload_routes

_WINDOW_PARAMS = {"dataset", "since", "start_s", "end_s", "node"}
_PRICE_PARAMS = {"gpu_usd_per_hour", "electricity_usd_per_kwh", "pue"}
_SUMMARY_PARAMS = _WINDOW_PARAMS | _PRICE_PARAMS | {"slo_ttft_ms", "slo_tpot_ms", "fleet_gpus"}
_HISTOGRAM_PARAMS = _WINDOW_PARAMS | {"bin_pct"}
_GPU_SERIES_PARAMS = _WINDOW_PARAMS | {"max_points", "max_buckets"}


class _Closing:
    """A job that only closes when the service stops (the overview cache's refresher)."""

    def __init__(self, close: Callable[[], None]) -> None:
        self._close = close

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self._close()


def create_service_app(collector: Collector, *, summary_warm: bool = True) -> FastAPI:
    """The service's app: the collector's, its reads, the analytics, the reports (scheduled as the
    collector's settings say) and GET /metrics; everything runs for the app's lifetime.
    ``summary_warm``: compute the newest scenario's Overview ahead (phaselens/summary_warm.py)."""
    settings = collector.settings
    scheduler = ReportScheduler(
        parse_schedules(list(settings.report_schedules)),
        collector.store,
        settings.node,
        collector.submit,
        limits=settings.report_limits,
    )
    # one cache of summaries for the summary endpoint and the overview: a page load, several pages
    # and several users of one window compute its summary once (phaselens/summary_cache.py)
    summaries = SummaryCache(collector.store, lambda: collector.stats.imports)
    overviews = OverviewService(collector.store, lambda: collector.stats.imports, summaries)
    exporter = MetricsExporter(collector)
    # the newest scenario's Overview computed at start and after each import (phaselens/summary_warm.py)
    warmer = SummaryWarmer(collector.store, lambda: collector.stats.imports, overviews, enabled=summary_warm)
    # started in this order after the writer, stopped in reverse before it
    collector.add_job(scheduler, health_key="reports")
    collector.add_job(exporter)
    collector.add_job(_Closing(overviews.close))
    collector.add_job(_Closing(summaries.close))
    collector.add_job(warmer, health_key="summary_warm")
    app = create_collector_app(collector)

    # Reads are plain functions (FastAPI runs them on its thread pool): one waiting for the store
    # (an import holds its lock while it runs) does not stall the event loop, /health or the others.
    @app.get("/api/v1/latest")
    def latest(since_s: str | None = None) -> Any:
        """The newest sample of every GPU, from ``since_s`` (UTC epoch seconds) on when given."""
        from analytics.window import AnalyticsError, epoch_s

        try:
            since = epoch_s("since_s", since_s, earliest_s=0.0)
            return {"rows": records(collector.store.latest_per_device(since_s=since))}
        except AnalyticsError as e:
            return error_response(400, str(e), e.param)
        except StoreError as e:
            return error_response(400, str(e))

    @app.get("/api/v1/tables/{table}")
    def table_range(
        table: str,
        start: str | None = None,
        end: str | None = None,
        device: str | None = None,
        node: str | None = None,
        limit: int = 10_000,
    ) -> Any:
        """Rows of `table` with time in [start, end) (UTC epoch seconds from 0 to 9999), oldest first."""
        from analytics.window import AnalyticsError, epoch_s

        if table not in TABLES:
            return error_response(
                404, f"unknown table {table!r}; tables: {', '.join(sorted(TABLES))}", "table"
            )
        if not 1 <= limit <= MAX_ROWS:
            return error_response(400, f"limit must be in [1, {MAX_ROWS}], got {limit}", "limit")
        try:
            start_s = epoch_s("start", start, earliest_s=0.0)
            end_s = epoch_s("end", end, earliest_s=0.0)
        except AnalyticsError as e:
            return error_response(400, str(e), e.param)
        try:
            df = collector.store.range(table, start_s, end_s, device=device, node=node, limit=limit)
        except StoreError as e:
            return error_response(400, str(e))
        return {"table": table, "rows": records(df), "truncated": len(df) == limit}

    def analytics_params(request: Request, allowed: set[str]) -> dict[str, Any] | JSONResponse:
        """The query parameters of an analytics read (``node`` repeatable), or the 400 naming an
        unknown one."""
        q = request.query_params
        params: dict[str, Any] = {k: q.get(k) for k in q if k != "node"}
        if q.getlist("node"):
            params["node"] = q.getlist("node")
        unknown = set(params) - allowed
        if unknown:
            return error_response(
                400,
                f"unknown parameter(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(allowed))}",
                sorted(unknown)[0],
            )
        return params

    def analytics_read(request: Request, allowed: set[str], run: Any) -> Any:
        from analytics.window import AnalyticsError

        params = analytics_params(request, allowed)
        if isinstance(params, JSONResponse):
            return params
        try:
            with collector.store.reader() as cur:
                return run(cur, params)
        except (AnalyticsError, ValueError) as e:
            return error_response(400, str(e), param_of(e, allowed))
        except StoreError as e:
            return error_response(500, f"the analysis failed on the store: {e}")

    @app.get("/api/v1/analytics/summary")
    def analytics_summary(request: Request) -> Any:
        """The analytics summary of a window (``phaselens analyze``'s JSON): query parameters
        ``dataset`` (live | a scenario id | latest), ``since`` (e.g. 1h) or ``start_s``/``end_s``,
        ``node`` (repeatable), ``slo_ttft_ms``, ``slo_tpot_ms``, ``fleet_gpus``, and the prices
        ``gpu_usd_per_hour`` (every GPU of the window), ``electricity_usd_per_kwh``, ``pue``."""
        got = analytics_read(request, _SUMMARY_PARAMS, lambda cur, params: summaries.get(params, con=cur))
        if isinstance(got, JSONResponse):
            return got
        # half a megabyte of nested figures at 64 GPUs: json.dumps, not FastAPI's encoder walking it
        return Response(json.dumps(got, allow_nan=False), media_type="application/json")

    @app.get("/api/v1/analytics/histogram")
    def analytics_histogram(request: Request) -> Any:
        """SM activity and utilization % of the window's GPU samples, binned per pool (counts only,
        never the samples): the summary's window parameters plus ``bin_pct`` (1, 2, 2.5, 5 or 10)."""
        from analytics.reads import run_histogram

        return analytics_read(
            request,
            _HISTOGRAM_PARAMS,
            lambda cur, params: summaries.read("histogram", params, run_histogram, cur),
        )

    @app.get("/api/v1/analytics/gpu-series")
    def analytics_gpu_series(request: Request) -> Any:
        """Per-GPU means of SM / tensor / DRAM activity, utilization, memory used, temperature, SM
        clock, power and power limit per time bucket, computed in the store: the summary's window
        parameters plus ``max_points`` (values per metric, GPUs x buckets; 100 to 200,000, default
        6,000) and ``max_buckets`` (time buckets per GPU, 10 to 200,000; default: as many as
        ``max_points`` allows), which set the bucket width."""
        from analytics.reads import run_gpu_series

        got = analytics_read(request, _GPU_SERIES_PARAMS, run_gpu_series)
        if isinstance(got, JSONResponse):
            return got
        # tens of thousands of plain numbers: json.dumps, not FastAPI's encoder walking each one
        return Response(json.dumps(got, allow_nan=False), media_type="application/json")

    add_report_routes(app, collector, scheduler, error_response)
    add_apply_routes(app, collector)  # apply/rollback recommendations, the actions audit
    add_recommend_routes(app, collector, error_response)

    @app.get("/api/v1/analytics/overview")
    def analytics_overview(request: Request) -> Any:
        """Headline figures of a window and of the period before it (the dashboard's Overview):
        the query parameters of ``/api/v1/analytics/summary`` but the prices."""
        from analytics.window import AnalyticsError

        params = analytics_params(request, set(OVERVIEW_PARAMS))
        if isinstance(params, JSONResponse):
            return params
        try:
            got = overviews.get(params)
        except (AnalyticsError, ValueError) as e:
            return error_response(400, str(e), param_of(e, set(OVERVIEW_PARAMS)))
        except StoreError as e:
            return error_response(500, f"the analysis failed on the store: {e}")
        return got.overview | {"computed_at_s": got.computed_at_s, "compute_s": got.compute_s}

    add_metrics_route(app, exporter)
    add_workload_routes(app, collector, error_response)
    add_power_routes(app, collector, error_response)  # power calibrations (read-only)

    return app
