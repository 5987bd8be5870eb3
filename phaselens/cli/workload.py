"""``phaselens workload``: the workload of a window — observed from the requests (or an external
fleet's engine histograms) and synthesized into a trace that follows it — side by side, through the
running collector or on a store file; ``--save`` stores both, ``--trace-out`` writes the trace as an
Azure CSV that ``phaselens simulate / goodput / load --trace`` replay."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from analytics.text_tables import grid_lines
from analytics.window import AnalyticsError, utc
from phaselens.cli.data_access import api_error_message, control_headers, open_store_file


class WorkloadError(Exception):
    """The command cannot run as asked; the message says why and what to do."""


def add_workload_command(sub: Any) -> None:
    """Register ``phaselens workload`` on the CLI's subparsers."""
    p = sub.add_parser(
        "workload",
        help="the observed workload of a window next to a synthesized trace that follows it",
        description=(
            "Observe a window's workload (arrival rate over time, burstiness, the joint prompt/output "
            "length distribution, prefix reuse where known) from the bundled stack's requests or an "
            "external fleet's engine histograms, synthesize a trace that follows it, and show both."
        ),
    )
    p.add_argument(
        "--since",
        default=None,
        help="the window before now, e.g. 30m, 1h (default on live data: 1h); on a "
        "scenario: before its end (default: the whole scenario)",
    )
    p.add_argument("--dataset", default="live", help="live, a scenario id, or latest (the newest scenario)")
    p.add_argument("--node", action="append", default=None, help="only this node's rows (repeatable; live)")
    p.add_argument(
        "--source",
        default="auto",
        choices=("auto", "requests", "engine_histograms"),
        help="what to observe (auto: the requests where the window has any, else engine histograms)",
    )
    p.add_argument("--seed", default="0", help="the synthesized trace's seed (0)")
    p.add_argument("--rate-scale", default=None, metavar="X", help="multiply the synthesized rate (1)")
    p.add_argument(
        "--duration", default=None, metavar="S", help="seconds of synthesized trace (default: the window's)"
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--db", default=None, help="read (and with --save write) this store file directly")
    where.add_argument(
        "--collector",
        default=os.environ.get("PHASELENS_API_URL") or "http://127.0.0.1:8900",
        metavar="URL",
        help="the running collector (default: $PHASELENS_API_URL or http://127.0.0.1:8900)",
    )
    p.add_argument("--token", default=None, help="the collector's control token, for --save")
    p.add_argument("--save", action="store_true", help="store both descriptions in the workloads table")
    p.add_argument(
        "--trace-out", default=None, metavar="FILE.csv", help="write the synthesized trace (Azure CSV) here"
    )
    p.add_argument("--json", action="store_true", help="print the JSON answer instead of the table")
    p.set_defaults(func=cmd_workload)


def _params(args: argparse.Namespace) -> dict[str, Any]:
    since = args.since if args.since is not None or args.dataset != "live" else "1h"
    params: dict[str, Any] = {"dataset": args.dataset, "source": args.source, "seed": args.seed}
    for key, value in (("since", since), ("rate_scale", args.rate_scale), ("duration_s", args.duration)):
        if value is not None:
            params[key] = value
    if args.node:
        params["node"] = args.node
    return params


def cmd_workload(args: argparse.Namespace) -> int:
    """Run ``phaselens workload``: 0, or 2 with the reason on bad input or an empty window."""
    if args.trace_out:
        out = Path(args.trace_out)
        if out.is_dir() or not out.resolve().parent.is_dir():
            return _error(f"--trace-out {out}: give a file in an existing folder, e.g. trace.csv")
    params = _params(args)
    try:
        if args.db:
            result = _on_file(args.db, params, save=args.save)
        else:
            result = _through(args.collector, params, args.token, save=args.save)
    except (WorkloadError, AnalyticsError) as e:
        return _error(str(e))
    written = None
    if args.trace_out:
        written = _write_trace(result, Path(args.trace_out))
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print("\n".join(text_lines(result)))
    if written is not None:
        print(
            f"trace: {written} requests written to {args.trace_out} (Azure CSV; replay it with "
            f"`phaselens simulate --trace {args.trace_out} --layout ...` or `phaselens goodput --trace ...`)"
        )
    return 0


def _error(message: str) -> int:
    print(f"phaselens workload: error: {message}", file=sys.stderr)
    return 2


def _on_file(db: str, params: dict[str, Any], *, save: bool) -> dict[str, Any]:
    import socket

    from phaselens.workload_api import run_workload, save_workload

    store = open_store_file(
        db, WorkloadError, "drop --db to read it through the collector", read_only=not save
    )
    try:
        with store.reader() as cur:
            result = run_workload(cur, params)
        if save:
            result |= save_workload(store, result, socket.gethostname())
        return result
    finally:
        store.close()


def _through(url: str, params: dict[str, Any], token: str | None, *, save: bool) -> dict[str, Any]:
    import httpx

    base = url.rstrip("/")
    headers = control_headers(token)
    try:
        with httpx.Client(base_url=base, timeout=httpx.Timeout(600.0, connect=5.0), headers=headers) as c:
            r = c.post("/api/v1/workload", json=params) if save else c.get("/api/v1/workload", params=params)
    except httpx.HTTPError as e:
        raise WorkloadError(
            f"cannot reach the collector at {base} ({e}); start `phaselens collect`, or pass --db FILE for a "
            "store no collector holds"
        ) from e
    if r.status_code in (401, 403):
        raise WorkloadError(
            f"{base}/api/v1/workload answered {r.status_code}: {api_error_message(r)}. --save needs the collector's "
            "control token: --token TOKEN or $PHASELENS_CONTROL_TOKEN"
        )
    if r.status_code != 200:
        raise WorkloadError(f"{base}/api/v1/workload answered {r.status_code}: {api_error_message(r)}")
    return r.json()


def _write_trace(result: dict[str, Any], path: Path) -> int:
    """The synthesized trace, made again from the observed workload with the same parameters (the same
    seed gives the same trace), written as an Azure CSV."""
    from analytics.workload import Workload, synthesize_trace, write_trace_csv

    observed = Workload.from_dict(result["observed"])
    s = result["synthesis"]
    trace = synthesize_trace(observed, duration_s=s["duration_s"], rate_scale=s["rate_scale"], seed=s["seed"])
    try:
        return write_trace_csv(trace, path, start_s=observed.start_s)
    except OSError as e:
        raise SystemExit(f"phaselens workload: error: writing {path} failed: {e}") from e


def _num(x: Any, fmt: str = "{:.3g}") -> str:
    return "—" if x is None else fmt.format(x)


def _spread(w: dict[str, Any]) -> str:
    rps = sorted(w["rate_curve"]["rps"])
    if not rps:
        return "—"
    return " / ".join(_num(x) for x in (rps[0], rps[len(rps) // 2], rps[-1]))


def _busiest(w: dict[str, Any]) -> str:
    hours = [(r, h) for h, r in enumerate(w["hourly_rps"]) if r is not None]
    if not hours:
        return "—"
    rate, hour = max(hours)
    return f"{hour:02d}:00 {_num(rate)}"


def _lengths(w: dict[str, Any], axis: str) -> str:
    s = w[f"{axis}_tokens"]
    return (
        " / ".join(_num(s[k], "{:,.0f}") for k in ("p50", "p90", "p99"))
        + f"  (mean {_num(s['mean'], '{:,.0f}')})"
    )


def text_lines(result: dict[str, Any]) -> list[str]:
    """The observed and the synthesized workload side by side, trust labels and match."""
    o, s = result["observed"], result["synthesized"]
    win = o["window"]
    curve_s = o["rate_curve"]["interval_s"]
    rows = [
        ["requests", f"{o['request_count']:,}", f"{s['request_count']:,}"],
        ["mean rate, req/s", _num(o["mean_rps"]), _num(s["mean_rps"])],
        [f"rate per {curve_s:g} s: min / median / max", _spread(o), _spread(s)],
        ["busiest UTC hour, req/s", _busiest(o), _busiest(s)],
        ["inter-arrival CV (Poisson 1)", _num(o["interarrival_cv"]), _num(s["interarrival_cv"])],
        ["burstiness CV (rate curve out)", _num(o["burstiness_cv"]), _num(s["burstiness_cv"])],
        ["Gamma shape of the gaps", _num(o["gamma_shape"]), _num(s["gamma_shape"])],
        ["index of dispersion", _num(o["dispersion_index"]), _num(s["dispersion_index"])],
        ["prompt tokens p50 / p90 / p99", _lengths(o, "prompt"), _lengths(s, "prompt")],
        ["output tokens p50 / p90 / p99", _lengths(o, "output"), _lengths(s, "output")],
        [
            "prefix reuse",
            _num(o["prefix_reuse_ratio"], "{:.1%}") if o["prefix_reuse_ratio"] is not None else "not known",
            "not modelled",
        ],
        ["trust", ", ".join(o["trust"]["labels"]), ", ".join(s["trust"]["labels"])],
    ]
    m = result["match"]
    lines = [
        f"workload of {win['dataset']}, {utc(win['start_s'])} – {utc(win['end_s'], same_day_as=win['start_s'])} "
        f"({win['end_s'] - win['start_s']:,.0f} s), observed from {o['source'].replace('_', ' ')}",
        "",
        *grid_lines(["", "observed", "synthesized"], rows, rule=True),
        "",
        f"match: {'no' if m['stale'] else 'yes'} (drift score {m['score']:.2f}; 1 or more would make a "
        "recommendation on the observed workload stale for the synthesized one)",
        *(f"  - {r}" for r in m["reasons"]),
        f"prefix reuse: {o['prefix_reuse_note']}",
    ]
    if not o["lengths"]["joint"]:
        lines.append(
            "lengths: the engines export two marginals, no joint: prompt and output taken as independent"
        )
    notes = o["trust"]["notes"] + s["trust"]["notes"]
    lines += [f"note: {n}" for n in dict.fromkeys(notes)]
    if "observed_id" in result:
        lines.append(f"stored: observed {result['observed_id']}, synthesized {result['synthesized_id']}")
    return lines
