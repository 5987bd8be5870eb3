"""``phaselens analyze``: the summary of a window, from a store file or through the collector's API
(the read itself is :func:`analytics.reads.run_summary`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from analytics.reads import PRICE_PARAMS, gpu_rows_of, no_data_hint, run_summary, summary_params
from analytics.window import LIVE, AnalyticsError, check_epoch_s


def add_analyze_command(sub: Any) -> None:
    """Register ``phaselens analyze`` on the CLI's subparsers."""
    p = sub.add_parser(
        "analyze",
        help="phase, idle, cost and latency breakdown of a window, with trust labels",
        description=(
            "Analyse a window of the store: GPU time and energy by phase, bimodal idle time, cost per "
            "token and latency/SLO attainment. Every figure says where it comes from (measured, "
            "emulated, simulated, host-bound, estimated)."
        ),
    )
    p.add_argument(
        "--since",
        default=None,
        help="the window: the last SPAN (90s, 30m, 1h, 2d; default 1h live, a scenario's whole span)",
    )
    p.add_argument(
        "--start-s", type=float, default=None, help="window start, UTC epoch s (instead of --since)"
    )
    p.add_argument("--end-s", type=float, default=None, help="window end, UTC epoch s (default: now)")
    p.add_argument(
        "--dataset",
        default=LIVE,
        help="'live' (measured and emulated rows), a simulated scenario id, or 'latest' (the newest scenario)",
    )
    p.add_argument("--node", action="append", default=None, help="live data of this node only (repeatable)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--db", default=None, help="read this store file (default phaselens.duckdb)")
    src.add_argument("--collector", default=None, metavar="URL", help="ask a running collector (its API)")
    p.add_argument("--prices", default=None, metavar="FILE", help="price table overrides (TOML or JSON)")
    p.add_argument("--slo-ttft-ms", type=float, default=None, help="TTFT SLO (default 2000)")
    p.add_argument("--slo-tpot-ms", type=float, default=None, help="TPOT SLO (default 100)")
    p.add_argument("--fleet-gpus", type=int, default=None, help="annualise the cost for a fleet of N GPUs")
    p.add_argument(
        "--gpu-usd-per-hour",
        type=float,
        default=None,
        help="price every GPU of the window at $X per GPU-hour",
    )
    p.add_argument("--electricity-usd-per-kwh", type=float, default=None, help="electricity price, $/kWh")
    p.add_argument("--pue", type=float, default=None, help="power usage effectiveness, 1..5")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--detail", action="store_true", help="also print every table of every part")
    p.add_argument(
        "--gpus",
        default=None,
        metavar="N|all",
        help="per-GPU rows of the unsampled-time, bimodality and power-model tables: the N most notable (default 12;"
        " 0: the pools only) or all (--json always has every GPU)",
    )
    p.set_defaults(func=cmd_analyze)


def _error(message: str) -> int:
    print(f"phaselens analyze: error: {message}", file=sys.stderr)
    return 2


def cmd_analyze(args: argparse.Namespace) -> int:
    """Run ``phaselens analyze``: 0 with the summary printed, 2 on bad input or an unreadable source."""
    from analytics.summary import format_summary
    from serving.sim.summary import slo_ms_error

    params = summary_params(
        dataset=args.dataset,
        since=args.since,
        start_s=args.start_s,
        end_s=args.end_s,
        nodes=args.node,
        slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms,
        fleet_gpus=args.fleet_gpus,
    )
    for name in PRICE_PARAMS:  # the same parameters, checked the same way, for a file or a collector
        if getattr(args, name) is not None:
            params[name] = getattr(args, name)
    for option, value in (("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-tpot-ms", args.slo_tpot_ms)):
        if value is not None and (message := slo_ms_error(option, value)) is not None:
            return _error(message)
    try:
        gpu_rows = gpu_rows_of(args.gpus)
        check_epoch_s("--start-s", args.start_s)
        check_epoch_s("--end-s", args.end_s)
        if args.collector:
            import httpx

            if args.prices:
                return _error("--prices applies to --db; a collector uses its own price table")
            try:
                resp = httpx.get(
                    args.collector.rstrip("/") + "/api/v1/analytics/summary", params=params, timeout=120
                )
            except httpx.HTTPError as e:
                return _error(f"cannot reach the collector at {args.collector}: {e}")
            if resp.status_code != 200:
                try:
                    message = resp.json()["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    message = resp.text[:300]
                return _error(f"{args.collector} answered {resp.status_code}: {message}")
            summary = resp.json()
        else:
            from collector.store import Store, StoreError, StoreLockedError

            db = args.db or "phaselens.duckdb"
            try:
                store = Store.open(db, read_only=True)
            except StoreLockedError as e:
                return _error(
                    f"{e}. A running collector holds {db}: pass --collector http://127.0.0.1:PORT (its --port; 8900 by default)"
                )
            except StoreError as e:
                return _error(str(e))
            with store, store.reader() as con:
                summary = run_summary(con, params, prices_path=args.prices)
                hint = no_data_hint(con, summary)
                if hint:  # first: it explains the rest
                    summary["missing"] = {"window": hint, **(summary.get("missing") or {})}
    except (AnalyticsError, ValueError) as e:
        return _error(str(e))
    print(
        json.dumps(summary, indent=1)
        if args.json
        else format_summary(summary, detail=args.detail, gpu_rows=gpu_rows)
    )
    return 0
