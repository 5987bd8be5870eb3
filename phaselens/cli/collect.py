"""``phaselens collect``: the service process (the collector, the DuckDB store's only writer, with
its HTTP API, report scheduler and Prometheus export: :func:`phaselens.api.create_service_app`)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import TYPE_CHECKING

from collector.report_limits import (
    DEFAULT_MAX_REPORT_MIB,
    DEFAULT_MAX_REPORTS,
    DEFAULT_REPORT_BURST,
    DEFAULT_REPORTS_PER_MIN,
    ReportLimits,
)

if TYPE_CHECKING:
    from collector.service import CollectorSettings


def add_collect_command(sub: argparse._SubParsersAction) -> None:
    """Register ``phaselens collect`` on the CLI's subparsers."""
    collect = sub.add_parser("collect", help="run the collector service (the DuckDB store's only writer)")
    _add_collect_arguments(collect)
    collect.set_defaults(func=cmd_collect)


def _add_collect_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default="phaselens.duckdb", help="DuckDB file (this process is its only writer)")
    p.add_argument("--host", default="127.0.0.1", help="bind address of the API (default: localhost only)")
    p.add_argument("--port", type=int, default=8900)
    p.add_argument("--node", default=None, help="node name stored with every row (default: hostname)")
    p.add_argument("--serving", action="append", default=[], metavar="URL", help="a bundled phaselens stack")
    p.add_argument("--dcgm", action="append", default=[], metavar="URL", help="a dcgm-exporter /metrics URL")
    p.add_argument(
        "--engine", action="append", default=[], metavar="URL", help="a vLLM/SGLang/Dynamo /metrics URL"
    )
    p.add_argument("--prometheus", default=None, metavar="URL", help="a Prometheus-compatible query API")
    p.add_argument("--no-nvml", action="store_true", help="do not sample this host's NVIDIA GPUs")
    p.add_argument(
        "--gpu-interval",
        type=float,
        default=0.1,
        help="GPU sampling period, s: this host's GPUs and a --serving stack read per worker (a batched "
        "read has the router's --device-sample-interval-s)",
    )
    p.add_argument(
        "--serving-read",
        choices=("auto", "per-worker"),  # collector.sources.serving_batch.SERVING_READS
        default="auto",
        help="how a --serving stack is read: auto (one GET /v1/collect every 0.5 s where the router "
        "offers it, its devices sampled by the router every --device-sample-interval-s; else the "
        "per-worker reads) or per-worker (GET /v1/devices every --gpu-interval, /v1/telemetry every 0.5 s)",
    )
    p.add_argument(
        "--dcgm-interval-s",
        type=float,
        default=1.0,
        help="dcgm-exporter scrape period, s (the exporter refreshes every 30 s by default; "
        "unchanged refreshes are not stored again)",
    )
    p.add_argument(
        "--scrape-timeout-s",
        type=float,
        default=5.0,
        help="deadline of one dcgm/engine scrape, s: connect, headers and the whole page (default 5)",
    )
    p.add_argument(
        "--max-page-bytes",
        type=int,
        default=4 * 1024 * 1024,
        help="largest dcgm/engine page read (default 4 MiB); a larger one is dropped, counted "
        "(pages_too_large) and its source reads degraded",
    )
    p.add_argument(
        "--max-backoff-s",
        type=float,
        default=10.0,
        help="longest wait before a failed source is tried again, s (1, 2, 4, 8 ... up to this; default 10)",
    )
    p.add_argument(
        "--flush-interval", type=float, default=1.0, help="store flush period, s (max loss on kill -9)"
    )
    p.add_argument(
        "--max-held-rows",
        type=int,
        default=None,
        help="rows the writer holds while the disk refuses writes (no space left, ...), retried each "
        "flush; past it the oldest sample rows are dropped and recorded as gaps (default: 2 write "
        "buffers, 983,040 rows)",
    )
    p.add_argument(
        "--raw-days", type=float, default=7.0, help="keep raw GPU samples this long, then 10 s rollups"
    )
    p.add_argument("--rollup-days", type=float, default=365.0, help="keep 10 s rollups this long")
    p.add_argument(
        "--retention-interval-s",
        type=float,
        default=600.0,
        help="apply the retention (roll up and delete) at start and then every this many s",
    )
    p.add_argument(
        "--control-token",
        default=None,
        metavar="TOKEN",
        help="bearer token of the control endpoints (POST /api/v1/import, and POST /api/v1/reports when set; "
        "default: $PHASELENS_CONTROL_TOKEN; without one the import answers 403 and reports are open, rate-limited)",
    )
    p.add_argument(
        "--metrics-window-s",
        type=float,
        default=300.0,
        help="GET /metrics counts at most this many s of live data per step (a backlog is caught up in "
        "steps of it; default 300)",
    )
    p.add_argument(
        "--metrics-interval-s",
        type=float,
        default=15.0,
        help="GET /metrics counts the settled live data one step every this many s (default 15)",
    )
    p.add_argument(
        "--metrics-settle-s",
        type=float,
        default=30.0,
        help="GET /metrics counts live data once it is this many s old (telemetry and samples still "
        "arriving; default 30)",
    )
    p.add_argument(
        "--report-schedule",
        action="append",
        default=None,
        metavar="NAME=CRON",
        help="a scheduled efficiency report, cron syntax in UTC: five fields, or six with seconds first "
        "('often=*/30 * * * * *') (repeatable; default: 'hourly=0 * * * *' "
        "and 'daily=0 6 * * *'; 'off': none). Misfire policy: docs in phaselens/reports.py",
    )
    p.add_argument(
        "--report-max-count",
        type=int,
        default=DEFAULT_MAX_REPORTS,
        help=f"keep at most this many reports, the oldest pruned first (default {DEFAULT_MAX_REPORTS})",
    )
    p.add_argument(
        "--report-max-mib",
        type=float,
        default=DEFAULT_MAX_REPORT_MIB,
        help=f"keep at most this many MiB of reports, the oldest pruned first (default {DEFAULT_MAX_REPORT_MIB:g})",
    )
    p.add_argument(
        "--report-burst",
        type=int,
        default=DEFAULT_REPORT_BURST,
        help=f"POST /api/v1/reports: this many at once (default {DEFAULT_REPORT_BURST}), then --report-rate-per-min",
    )
    p.add_argument(
        "--report-rate-per-min",
        type=float,
        default=DEFAULT_REPORTS_PER_MIN,
        help=f"POST /api/v1/reports: this many a minute after a burst (default {DEFAULT_REPORTS_PER_MIN:g}; "
        "beyond: 429 with Retry-After)",
    )
    from phaselens.apply.policy import add_auto_apply_arguments

    add_auto_apply_arguments(p)
    p.add_argument(
        "--no-summary-warm",
        action="store_true",
        help="do not compute the newest scenario's Overview ahead, at start and after each import (the "
        "first page load computes it instead; phaselens/summary_warm.py). Also off with "
        "$PHASELENS_SUMMARY_WARM=off (0, false, no), as the tests' collectors run",
    )
    p.add_argument(
        "--power-guard-window-s",
        type=float,
        default=30.0,
        help="the runtime power guard (with --serving and a control token): every this many s, release the "
        "knob of each lane of an applied power recommendation that breaches its SLO (30; 0: off; docs/POWER.md)",
    )


def _report_max_bytes(mib: float) -> int:
    """``--report-max-mib`` in bytes; ValueError naming the flag and its range."""
    if not (math.isfinite(mib) and 0.01 <= mib <= 2**20):
        raise ValueError(f"--report-max-mib must be in [0.01, 1048576] MiB, got {mib:g}")
    return round(mib * 2**20)


def collect_settings(args: argparse.Namespace) -> CollectorSettings:
    """The collector's settings from `phaselens collect` arguments; ValueError naming a bad one."""
    from collector.service import CollectorSettings
    from collector.store import RetentionPolicy, StoreError
    from collector.store.scenarios import is_simulated_node
    from phaselens.reports import DEFAULT_SCHEDULES, ReportError, parse_schedules

    try:
        retention = RetentionPolicy(raw_days=args.raw_days, rollup_days=args.rollup_days)
    except StoreError as e:
        raise ValueError(str(e)) from e
    schedules = tuple(args.report_schedule) if args.report_schedule else DEFAULT_SCHEDULES
    try:
        parse_schedules(list(schedules))
    except ReportError as e:
        raise ValueError(f"--report-schedule: {e}") from e
    settings = CollectorSettings(
        db_path=args.db,
        host=args.host,
        port=args.port,
        serving_urls=args.serving,
        dcgm_urls=args.dcgm,
        engine_urls=args.engine,
        prometheus_url=args.prometheus,
        nvml=not args.no_nvml,
        gpu_interval_s=args.gpu_interval,
        serving_read=args.serving_read,
        dcgm_interval_s=args.dcgm_interval_s,
        scrape_timeout_s=args.scrape_timeout_s,
        max_page_bytes=args.max_page_bytes,
        max_backoff_s=args.max_backoff_s,
        flush_interval_s=args.flush_interval,
        max_held_rows=args.max_held_rows,
        retention=retention,
        retention_interval_s=args.retention_interval_s,
        control_token=args.control_token or os.environ.get("PHASELENS_CONTROL_TOKEN") or None,
        metrics_window_s=args.metrics_window_s,
        metrics_interval_s=args.metrics_interval_s,
        metrics_settle_s=args.metrics_settle_s,
        report_schedules=() if [x.strip().lower() for x in schedules] == ["off"] else schedules,
        report_limits=ReportLimits(
            max_count=args.report_max_count,
            max_bytes=_report_max_bytes(args.report_max_mib),
            burst=args.report_burst,
            per_min=args.report_rate_per_min,
        ),
    )
    if args.node:
        settings.node = args.node
    if is_simulated_node(settings.node):
        raise ValueError(
            f"--node {settings.node!r}: node names starting with 'sim:' mark simulated scenarios' rows; "
            "a collector stores measured rows, so give it another name"
        )
    if not 10 <= settings.metrics_window_s <= 86_400:
        raise ValueError(f"--metrics-window-s must be in [10, 86400] s, got {settings.metrics_window_s:g}")
    if not 1 <= settings.metrics_interval_s <= 3600:
        raise ValueError(f"--metrics-interval-s must be in [1, 3600] s, got {settings.metrics_interval_s:g}")
    if not 0 <= settings.metrics_settle_s <= 3600:
        raise ValueError(f"--metrics-settle-s must be in [0, 3600] s, got {settings.metrics_settle_s:g}")
    if not 0.01 <= settings.gpu_interval_s <= 60 or not 0.05 <= settings.flush_interval_s <= 60:
        raise ValueError("--gpu-interval must be in [0.01, 60] s and --flush-interval in [0.05, 60] s")
    if not 0.1 <= settings.scrape_timeout_s <= 300:
        raise ValueError(f"--scrape-timeout-s must be in [0.1, 300] s, got {settings.scrape_timeout_s:g}")
    if not 1024 <= settings.max_page_bytes <= 1024**3:
        raise ValueError(
            f"--max-page-bytes must be in [1024, 1073741824] (1 KiB to 1 GiB), got {settings.max_page_bytes}"
        )
    if not 1.0 <= settings.max_backoff_s <= 3600:
        raise ValueError(f"--max-backoff-s must be in [1, 3600] s, got {settings.max_backoff_s:g}")
    if settings.max_held_rows is not None and settings.max_held_rows < 0:
        raise ValueError(
            f"--max-held-rows must be a non-negative number of rows, got {settings.max_held_rows}"
        )
    if not 1.0 <= settings.retention_interval_s <= 7 * 86_400:
        raise ValueError(
            f"--retention-interval-s must be in [1, 604800] s (1 s to a week), got {settings.retention_interval_s:g}"
        )
    return settings


def cmd_collect(args: argparse.Namespace) -> int:
    import uvicorn

    from collector.service import Collector
    from collector.store import WRITER_BUFFER_ROWS, Store, StoreError
    from phaselens.api import create_service_app
    from phaselens.apply.policy import auto_apply_policy
    from phaselens.apply_api import enable_auto_apply, enable_power_guard
    from phaselens.summary_warm import warm_enabled

    try:
        settings = collect_settings(args)
        policy = auto_apply_policy(args)
        guard_s = args.power_guard_window_s
        summary_warm = warm_enabled(args.no_summary_warm)
        if guard_s != 0 and not (math.isfinite(guard_s) and 1 <= guard_s <= 3600):
            raise ValueError(f"--power-guard-window-s must be 0 (off) or in [1, 3600] s, got {guard_s:g}")
    except ValueError as e:
        print(f"phaselens collect: error: {e}", file=sys.stderr)
        return 2
    if not 0.1 <= settings.dcgm_interval_s <= 300:
        print(
            f"phaselens collect: error: --dcgm-interval-s must be in [0.1, 300] s, got {settings.dcgm_interval_s}",
            file=sys.stderr,
        )
        return 2
    try:
        store = Store.open(  # and the writer flushes each interval
            settings.db_path, buffer_rows=WRITER_BUFFER_ROWS, max_held_rows=settings.max_held_rows
        )
    except StoreError as e:
        print(f"phaselens collect: error: {e}", file=sys.stderr)
        return 2
    collector = Collector(settings, store)
    names = ", ".join(s.name for s in collector.sources) or "none"
    control = "on (bearer token)" if settings.control_token else "off (no --control-token)"
    print(
        f"phaselens collect: writing {settings.db_path}; API on http://{settings.host}:{settings.port}; "
        f"sources: {names}; control endpoints {control}",
        file=sys.stderr,
        flush=True,
    )
    for note in collector.notes():
        print(f"phaselens collect: note: {note}", file=sys.stderr, flush=True)
    app = create_service_app(collector, summary_warm=summary_warm)
    if guard_s and enable_power_guard(app, collector, guard_s) is not None:
        print(
            f"phaselens collect: runtime power guard on: every {guard_s:g} s over applied power recommendations",
            file=sys.stderr,
            flush=True,
        )
    if policy is not None:
        from phaselens.recommend_window import window_recommender

        enable_auto_apply(app, collector, policy, recommend=window_recommender(collector, policy))
        print(f"phaselens collect: auto-apply on: {policy.describe()}", file=sys.stderr, flush=True)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")
    return 0
