"""``phaselens load``: its options (:func:`add_load_arguments`) and its run (:func:`main_load`)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from serving.loadgen.report import LoadGenError, LoadReport, format_report
from serving.loadgen.runner import run_load
from serving.loadgen.trace_options import (
    _POS_FLOAT,
    _POS_INT,
    add_trace_arguments,
    build_trace,
    trace_option_error,
)

DEFAULT_URL = "http://127.0.0.1:8000"


def _fraction(text: str) -> float:
    """Parse a share in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``phaselens load`` options to ``parser`` (call :func:`main_load` with the result)."""
    parser.add_argument("--url", default=DEFAULT_URL, help=f"server base URL (default {DEFAULT_URL})")
    parser.add_argument("--model", default=None, help="model name (default: first of GET /v1/models)")
    add_trace_arguments(parser)
    parser.add_argument(
        "--max-concurrency", metavar="N", type=_POS_INT, default=None, help="cap requests in flight"
    )
    parser.add_argument("--timeout", type=_POS_FLOAT, default=300.0, metavar="S", help="per request (300)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the report as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--max-failure-rate",
        type=_fraction,
        default=0.0,
        metavar="F",
        help="exit 0 when at most this share of requests failed, 0..1 (0: any failure exits 1)",
    )
    parser.set_defaults(_load_parser=parser)


def main_load(args: argparse.Namespace) -> int:
    """Run ``phaselens load``; 1 when more than ``--max-failure-rate`` of the requests failed (by
    default: any) or none succeeded, 2 on bad options, else 0."""
    message = trace_option_error(args)
    if message:
        parser = getattr(args, "_load_parser", None)
        if parser is not None:
            parser.error(message)  # exits with status 2
        print(f"phaselens load: error: {message}", file=sys.stderr)
        return 2
    try:
        requests, clipped, source = build_trace(args)
    except (OSError, ValueError) as e:
        print(f"phaselens load: error: {e}", file=sys.stderr)
        return 2
    span = requests[-1].arrival_s if requests else 0.0
    print(
        f"{source}: {len(requests)} requests over {span:.1f} s, "
        f"{clipped} clipped to --max-prompt-tokens/--max-output-tokens",
        file=sys.stderr,
    )
    try:
        report = run_load(
            args.url,
            requests,
            model=args.model,
            max_concurrency=args.max_concurrency,
            timeout_s=args.timeout,
            progress=not args.no_progress,
            seed=args.seed,
            clipped=clipped,
        )
    except LoadGenError as e:
        print(f"phaselens load: error: {e}", file=sys.stderr)
        return 1
    print(format_report(report))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        print(f"report written to {args.json}", file=sys.stderr)
    return _exit_code(report, getattr(args, "max_failure_rate", 0.0))


def _exit_code(report: LoadReport, max_failure_rate: float) -> int:
    """1 (with a line on stderr) when the run failed more requests than allowed, else 0."""
    if not report.n_requests or not report.n_failed:
        return 0
    share = report.n_failed / report.n_requests
    if report.n_ok and share <= max_failure_rate:
        return 0
    print(
        f"phaselens load: {report.n_failed} of {report.n_requests} requests failed ({share:.1%}); "
        f"allowed: {max_failure_rate:.1%} (--max-failure-rate)",
        file=sys.stderr,
    )
    return 1
