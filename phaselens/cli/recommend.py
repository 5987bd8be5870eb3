"""``phaselens recommend``: the layout (and engine settings) that serves a trace best at the SLOs,
by simulation (:mod:`analytics.recommend`), printed as the candidate table, the chosen layout, its
predicted impact and the confidence (every figure simulated). Stored in the ``recommendations``
table through the running collector (``--collector URL``, which runs the search) or in a store file
(``--db FILE``, no collector holding it); without either, printed only."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from analytics.recommend.text import format_recommendation
from phaselens.cli.data_access import api_error_message, control_headers, open_store_file


def add_recommend_command(sub: Any) -> None:
    """Register ``phaselens recommend``."""
    from serving.loadgen import add_trace_arguments

    p = sub.add_parser(
        "recommend",
        help="recommend a serving layout and engine settings for a trace at the SLOs (simulated)",
        description=(
            "Search layouts (aggregated replicas x TP, xPyD with TP per pool, GPU type) and engine settings "
            "(chunk size, chunked prefill, max_num_seqs) by simulation for the trace and SLOs, at the GPU "
            "budget and at the least budget meeting the SLOs; print the candidates, the choice (or stay as "
            "is, and why) and the confidence. Every figure is simulated."
        ),
    )
    p.add_argument(
        "--layout",
        default=None,
        help="the current layout, e.g. agg:8xh100-sxm:tp2 (required with a trace option; from a stored "
        "window: read from the store unless given)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="model shape (llama-3.1-70b; from a stored window: the scenario's, or the shape the stack's "
        "emulated GPUs model)",
    )
    w = p.add_argument_group(
        "a stored window (instead of a trace option): its observed requests are the trace, its measured "
        "figures the confidence; the workload is stored and the layout, model and target read from the store"
    )
    w.add_argument(
        "--since", default=None, help="the window before now (live: 1h) or before a scenario's end"
    )
    w.add_argument("--dataset", default=None, help="live, a scenario id, or latest (the newest scenario)")
    w.add_argument("--node", action="append", default=None, help="only this node's rows (live; repeatable)")
    p.add_argument("--slo-ttft-ms", type=float, default=1000.0, help="TTFT SLO, ms (1000)")
    p.add_argument("--slo-tpot-ms", type=float, default=30.0, help="TPOT SLO, ms (30)")
    p.add_argument("--target", type=float, default=0.9, help="attainment to hold, (0, 1] (0.9)")
    p.add_argument("--gpu-budget", type=int, default=None, help="most GPUs (the current layout's)")
    p.add_argument(
        "--allow-gpu",
        action="append",
        default=None,
        metavar="GPU",
        help="a GPU type candidates may use (repeat)",
    )
    p.add_argument(
        "--fleet-gpus", type=int, default=None, help="fleet size for the annual $ (the layout's GPUs)"
    )
    p.add_argument("--min-gain-pct", type=float, default=10.0, help="a change must gain more than this (10)")
    p.add_argument(
        "--for", dest="target_name", default=None, help="what it is for: stack:URL, scenario:ID, fleet:NAME"
    )
    p.add_argument(
        "--measured",
        type=Path,
        default=None,
        metavar="FILE.json",
        help="figures measured on the current layout over the same window (ttft_p90_s, tpot_p90_s, output_tokens_per_s)",
    )
    p.add_argument(
        "--measure-url",
        default=None,
        metavar="URL",
        help="replay the trace on this running stack (the current layout) first and use what it measured",
    )
    p.add_argument("--slice-requests", type=int, default=300, help="requests in the screening slice (300)")
    p.add_argument("--workers", type=int, default=1, help="processes for the simulations (1)")
    add_trace_arguments(p)
    p.add_argument("--db", default=None, help="store it in this store file (no collector may hold it)")
    p.add_argument(
        "--collector",
        default=os.environ.get("PHASELENS_API_URL"),
        metavar="URL",
        help="the running collector that makes and stores it (default $PHASELENS_API_URL; unset: not stored)",
    )
    p.add_argument("--token", default=None, help="the collector's control token, if it has one")
    p.add_argument("--all", action="store_true", help="list the pruned candidates too")
    p.add_argument("--json", action="store_true", help="print the stored row (details included) as JSON")
    p.set_defaults(func=cmd_recommend)


def _error(message: str, code: int = 2) -> int:
    print(f"phaselens recommend: error: {message}", file=sys.stderr)
    return code


def _body(
    args: argparse.Namespace, trace: list[Any], desc: str, measured: dict[str, Any] | None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "layout": args.layout,
        "model": args.model or "llama-3.1-70b",
        "slo_ttft_ms": args.slo_ttft_ms,
        "slo_tpot_ms": args.slo_tpot_ms,
        "slo_target": args.target,
        "gpu_budget": args.gpu_budget,
        "allowed_gpus": args.allow_gpu or [],
        "fleet_gpus": args.fleet_gpus,
        "min_gain_pct": args.min_gain_pct,
        "target": args.target_name,
        "measured": measured,
        "requests": [[r.arrival_s, r.prompt_tokens, r.output_tokens] for r in trace],
        "trace_desc": desc,
    }
    return {k: v for k, v in body.items() if v is not None}


def cmd_recommend(args: argparse.Namespace) -> int:
    """Run ``phaselens recommend``; 2 on bad input, 1 when storing failed, else 0."""
    from analytics.recommend.inputs import RecommendError, inputs_from_body
    from serving.loadgen import build_trace, trace_option_error

    if args.db and args.collector:
        return _error("give --db FILE or --collector URL, not both")
    if args.since is not None or args.dataset is not None:
        return _from_window(args)
    if args.node:
        return _error("--node narrows a stored window: give --since or --dataset with it")
    if not args.layout:
        return _error(
            "give the current layout (--layout, e.g. agg:8xh100-sxm:tp2), or a stored window (--since / --dataset)"
        )
    message = trace_option_error(args)
    if message:
        return _error(message)
    try:
        trace, _, desc = build_trace(args)
    except (ValueError, OSError) as e:
        return _error(str(e))
    measured = None
    if args.measured is not None:
        try:
            measured = json.loads(args.measured.read_text())
        except (OSError, ValueError) as e:
            return _error(f"--measured {args.measured}: {e}")
    if args.measure_url:
        from analytics.recommend.confidence import measure_live

        print(
            f"replaying {len(trace)} requests on {args.measure_url} to measure the current layout ...",
            file=sys.stderr,
        )
        try:
            measured, label = measure_live(args.measure_url, trace)
        except Exception as e:  # the stack unreachable or failing
            return _error(f"--measure-url {args.measure_url}: {type(e).__name__}: {e}", 1)
        measured["trust"] = label
    body = _body(args, trace, desc, measured)
    try:
        if args.collector:
            row = _through(args.collector, body, args.token)
            where = f"stored by the collector: {args.collector.rstrip('/')}/api/v1/recommendations/{row['recommendation_id']}"
        else:
            row, where = _local(args, body, inputs_from_body)
    except RecommendError as e:
        return _error(str(e))
    except _StoreFailed as e:
        return _error(str(e), 1)
    _show(args, row, where)
    return 0


class _StoreFailed(RuntimeError):
    pass


def _local(
    args: argparse.Namespace, body: dict[str, Any], inputs_from_body: Any
) -> tuple[dict[str, Any], str]:
    import socket

    from analytics.recommend.choose import recommend
    from analytics.recommend.inputs import RecommendError
    from analytics.recommend.records import recommendation_row, save_recommendation
    from analytics.recommend.search import SearchOptions

    if args.db and not Path(args.db).is_file():
        raise RecommendError(f"--db {args.db}: no such store file")
    inputs, min_gain = inputs_from_body(body)
    rec = recommend(
        inputs,
        SearchOptions(
            min_gain_pct=min_gain, workers=max(1, args.workers), slice_requests=max(10, args.slice_requests)
        ),
        progress=lambda m: print(m, file=sys.stderr),
    )
    row = recommendation_row(rec, node=socket.gethostname())
    if not args.db:
        return row, "not stored (pass --db FILE or --collector URL to store it)"
    from collector.store import Store, StoreError, StoreLockedError

    try:
        store = Store.open(args.db)
    except StoreLockedError as e:
        raise _StoreFailed(f"{e}; a running collector holds it: use --collector URL") from e
    except StoreError as e:
        raise _StoreFailed(str(e)) from e
    try:
        rid = save_recommendation(store, row)
    finally:
        store.close()
    return row, f"stored in {args.db} as {rid}"


def _through(url: str, body: dict[str, Any], token: str | None) -> dict[str, Any]:
    import httpx

    from analytics.recommend.inputs import RecommendError

    headers = control_headers(token)
    base = url.rstrip("/")
    try:
        r = httpx.post(
            f"{base}/api/v1/recommendations",
            json=body,
            headers=headers,
            timeout=httpx.Timeout(900.0, connect=5.0),
        )
    except httpx.HTTPError as e:
        raise _StoreFailed(
            f"cannot reach the collector at {base} ({e}); pass --db FILE, or drop --collector"
        ) from e
    if r.status_code == 400:
        raise RecommendError(api_error_message(r))
    if r.status_code != 200:
        raise _StoreFailed(f"{base}/api/v1/recommendations answered {r.status_code}: {api_error_message(r)}")
    return r.json()


_TRACE_FLAGS = ("trace", "poisson", "duration", "num_requests", "limit")


def _from_window(args: argparse.Namespace) -> int:
    """``phaselens recommend --since/--dataset``: the recommendation of a stored window, made and
    stored through the collector (``--collector``) or on a store file (``--db``)."""
    from analytics.window import AnalyticsError

    if not (args.db or args.collector):
        return _error(
            "a stored window is read from --db FILE or through --collector URL (or $PHASELENS_API_URL)"
        )
    if args.measure_url:
        return _error(
            "--measure-url replays a trace; a stored window's measured figures are its own requests"
        )
    given = [f"--{k.replace('_', '-')}" for k in _TRACE_FLAGS if getattr(args, k, None) not in (None, False)]
    if given:
        return _error(f"give a stored window (--since/--dataset) or a trace ({given[0]}), not both")
    measured = None
    if args.measured is not None:
        try:
            measured = json.loads(args.measured.read_text())
        except (OSError, ValueError) as e:
            return _error(f"--measured {args.measured}: {e}")
    body: dict[str, Any] = {
        "since": args.since,
        "dataset": args.dataset,
        "node": args.node,
        "layout": args.layout,
        "model": args.model,
        "slo_ttft_ms": args.slo_ttft_ms,
        "slo_tpot_ms": args.slo_tpot_ms,
        "slo_target": args.target,
        "gpu_budget": args.gpu_budget,
        "allowed_gpus": args.allow_gpu,
        "fleet_gpus": args.fleet_gpus,
        "min_gain_pct": args.min_gain_pct,
        "target": args.target_name,
        "measured": measured,
    }
    body = {k: v for k, v in body.items() if v is not None}
    try:
        if args.collector:
            row = _through(args.collector, body, args.token)
            where = f"stored by the collector: {args.collector.rstrip('/')}/api/v1/recommendations/{row['recommendation_id']}"
        else:
            row = _window_on_file(args, body)
            where = f"stored in {args.db} as {row['recommendation_id']}"
    except AnalyticsError as e:
        return _error(str(e))
    except _StoreFailed as e:
        return _error(str(e), 1)
    _show(args, row, where, window=True)
    return 0


def _show(args: argparse.Namespace, row: dict[str, Any], where: str, *, window: bool = False) -> None:
    """The stored row as JSON (``--json``), else in words: its window (when made from one), the
    recommendation and where it was stored."""
    if args.json:
        print(json.dumps(row, indent=1))
        return
    if window:
        print(format_window(row))
    print(format_recommendation(row, all_candidates=args.all))
    print(where)


def format_window(row: dict[str, Any]) -> str:
    """Where a window's recommendation came from: the window, the stored workload, the layout."""
    from analytics.window import utc

    inputs = row["details"]["inputs"]
    how = inputs.get("from_window") or {}
    win = inputs.get("window") or {}
    lines = [
        f"window: {how.get('dataset', '?')}, {utc(win['start_s'])} – {utc(win['end_s'], same_day_as=win['start_s'])}"
        if win.get("start_s") is not None
        else "window: ?",
        f"trace: {how.get('trace', '?')} ({how.get('trace_trust', '?')})",
        f"workload stored: {inputs.get('workload_id')} (observed), {how.get('synthesized_workload_id')} (synthesized)",
        f"current layout: {inputs.get('current')} — {how.get('layout_from', '?')}",
        f"model: {inputs.get('model')} — {how.get('model_from', 'given')}",
    ]
    delay = inputs.get("dispatch_delay") or {}
    if inputs.get("dispatch_delay_s") is not None:
        lines.append(
            f"dispatch delay: {inputs['dispatch_delay_s'] * 1e3:.1f} ms — {delay.get('how', 'given')}"
        )
    if how.get("measured_note"):
        lines.append(how["measured_note"])
    return "\n".join(lines)


def _window_on_file(args: argparse.Namespace, body: dict[str, Any]) -> dict[str, Any]:
    from analytics.recommend.search import SearchOptions
    from phaselens.recommend_window import recommend_window

    store = open_store_file(args.db, _StoreFailed, "use --collector URL")
    try:
        return recommend_window(
            store,
            body,
            options=SearchOptions(workers=max(1, args.workers), slice_requests=max(10, args.slice_requests)),
            progress=lambda m: print(m, file=sys.stderr),
        )
    finally:
        store.close()
