"""``phaselens goodput``: the goodput search (:mod:`analytics.goodput`) over the simulator
(``--layout``) or a live stack (``--url``), its sweep printed and optionally written as JSON."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analytics.goodput import (
    DEFAULT_TARGET,
    Measurement,
    find_goodput,
    format_result,
    load_report_attainment,
)
from analytics.trust import EMULATED, HOST_BOUND, MEASURED, SIMULATED, Trust
from analytics.window import AnalyticsError


def add_goodput_command(subparsers: Any) -> None:
    """Register ``phaselens goodput`` on the CLI's subparsers."""
    from serving.loadgen import add_trace_arguments

    p = subparsers.add_parser(
        "goodput",
        help="goodput per GPU (DistServe): the highest request rate at which >= 90%% meet both SLOs",
        description=(
            "Sweep the request rate (bracketing, then bisection) and report the highest rate at which "
            "at least --target of the requests meet both the TTFT and the TPOT SLO, per GPU. With "
            "--layout the simulator serves each rate (simulated); with --url a live stack does (measured, "
            "or emulated when its GPUs are). A trace is scaled to each rate; --poisson RATE draws "
            "Poisson arrivals at each rate (RATE is the first rate tried)."
        ),
    )
    p.add_argument(
        "--layout", default=None, metavar="LAYOUT", help="simulate this layout, e.g. agg:2xh100-sxm"
    )
    p.add_argument("--url", default=None, help="a live stack's base URL (instead of the simulator)")
    p.add_argument(
        "--model",
        default=None,
        help="simulator: model shape (llama-3.1-8b); live: model name (default: first of GET /v1/models)",
    )
    p.add_argument("--slo-ttft-ms", type=float, default=2000.0, help="TTFT SLO, ms (2000)")
    p.add_argument("--slo-tpot-ms", type=float, default=100.0, help="TPOT SLO, ms (100)")
    p.add_argument("--target", type=float, default=DEFAULT_TARGET, help="attainment to hold, 0..1 (0.9)")
    p.add_argument("--initial-rate", type=float, default=None, help="first rate tried, req/s")
    p.add_argument("--min-rate", type=float, default=0.05, help="lowest rate tried, req/s (0.05)")
    p.add_argument("--max-rate", type=float, default=1000.0, help="highest rate tried, req/s (1000)")
    p.add_argument("--rel-tol", type=float, default=0.05, help="stop when the bracket is this narrow (0.05)")
    p.add_argument("--max-evals", type=int, default=16, help="at most this many runs (16)")
    p.add_argument("--gpus", type=int, default=None, help="live: GPUs serving the stack (default 1)")
    p.add_argument("--timeout", type=float, default=300.0, help="live: per request timeout, s (300)")
    add_trace_arguments(p)
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the result as JSON")
    p.set_defaults(func=cmd_goodput)


class _RunFailed(RuntimeError):
    """A run of the sweep could not be made (the live stack unreachable, ...)."""


def _error(message: str) -> int:
    print(f"phaselens goodput: error: {message}", file=sys.stderr)
    return 2


def _base_rate(requests: Sequence[Any]) -> float:
    span = requests[-1].arrival_s - requests[0].arrival_s
    return (len(requests) - 1) / span if span > 0 and len(requests) > 1 else float("nan")


def cmd_goodput(args: argparse.Namespace) -> int:
    """Run ``phaselens goodput``; 2 on bad input (said before anything runs), 1 when a run of the
    sweep fails (a live stack unreachable), else 0."""
    from serving.config import ConfigError, model_config_for
    from serving.loadgen import build_trace, trace_option_error
    from serving.sim.layout import check_layout, parse_layout
    from serving.sim.summary import slo_ms_error
    from serving.trace import TraceRequest, poisson_trace, scale_arrivals

    if (args.layout is None) == (args.url is None):
        return _error("give --layout LAYOUT (simulator) or --url URL (a live stack), one of them")
    for option, value in (("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-tpot-ms", args.slo_tpot_ms)):
        if (message := slo_ms_error(option, value)) is not None:
            return _error(message)
    message = trace_option_error(args)
    if message:
        return _error(message)
    layout = shape = None
    try:
        if args.layout is not None:
            layout = parse_layout(args.layout)
            shape = model_config_for(args.model or "llama-3.1-8b")
            check_layout(layout, shape)
        base, _, desc = build_trace(args)
    except (ConfigError, ValueError, OSError) as e:
        return _error(str(e))
    if len(base) < 2:
        return _error(f"{desc}: needs at least 2 requests to scale")
    base_rate = args.poisson if args.poisson is not None else _base_rate(base)
    if not base_rate > 0:
        return _error(f"{desc}: all requests arrive at once; cannot scale its rate")
    initial = args.initial_rate or base_rate
    initial = min(max(initial, args.min_rate), args.max_rate)
    gpus = layout.gpus if layout is not None else (args.gpus or 1)
    slo_ttft_s, slo_tpot_s = args.slo_ttft_ms / 1000.0, args.slo_tpot_ms / 1000.0

    def requests_at(rate: float) -> list[TraceRequest]:
        if args.poisson is not None:
            return poisson_trace(
                rate,
                len(base),
                prompt_tokens=args.prompt_tokens or (32, 512),
                output_tokens=args.output_tokens or (16, 128),
                seed=args.seed,
            )
        t0 = base[0].arrival_s
        shifted = [TraceRequest(r.arrival_s - t0, r.prompt_tokens, r.output_tokens) for r in base]
        return scale_arrivals(shifted, rate_scale=rate / base_rate)

    trust = Trust()
    if layout is not None:
        from serving.sim.simulator import Simulation
        from serving.sim.summary import SloSpec, summarize

        slo = SloSpec(ttft_s=slo_ttft_s, tpot_s=slo_tpot_s)
        trust.add(SIMULATED, "simulator: virtual time and the GPU model")

        def measure(rate: float) -> Measurement:
            result = Simulation(
                layout, shape, requests_at(rate), on_batch=lambda b: None, columnar=True
            ).run()
            s = summarize(result, slo)
            return Measurement(
                rate,
                s.slo_attainment,
                {
                    "requests": s.requests,
                    "failed": s.failed,
                    "ttft_p90_ms": s.ttft_p90_s * 1000,
                    "tpot_p90_ms": s.tpot_p90_s * 1000,
                    "output_tokens_per_s_per_gpu": s.output_tokens_per_s_per_gpu,
                },
            )
    else:
        from serving.loadgen import LoadGenError, run_load

        def measure(rate: float) -> Measurement:
            try:
                report = run_load(
                    args.url, requests_at(rate), model=args.model, timeout_s=args.timeout, progress=False
                )
            except LoadGenError as e:
                raise _RunFailed(f"{args.url}: {e}") from e
            m = load_report_attainment(report, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s)
            return Measurement(rate, m.attainment, m.details)

    print(
        f"goodput sweep: {desc}, {len(base)} requests per run, TTFT ≤ {args.slo_ttft_ms:g} ms, "
        f"TPOT ≤ {args.slo_tpot_ms:g} ms, target {args.target:.0%}",
        file=sys.stderr,
    )
    try:
        result = find_goodput(
            measure,
            initial_rate_rps=initial,
            min_rate_rps=args.min_rate,
            max_rate_rps=args.max_rate,
            target=args.target,
            rel_tol=args.rel_tol,
            max_evals=args.max_evals,
            gpus=gpus,
        )
    except _RunFailed as e:
        print(f"phaselens goodput: error: a run failed: {e}", file=sys.stderr)
        return 1
    except AnalyticsError as e:
        return _error(str(e))
    if layout is None:
        emulated = [m for m in result.sweep if m.details.get("emulated_workers")]
        trust.add(EMULATED if emulated else MEASURED)
        if emulated:
            trust.notes.append("the stack's GPUs are emulated (GET /v1/devices): modeled device timing")
        if any(m.details.get("host_bound_fraction", 0) > 0 for m in result.sweep):
            trust.add(HOST_BOUND, "some runs' iterations lagged their modeled time (host-bound emulation)")
        if args.gpus is None:
            trust.notes.append("--gpus not given: per GPU assumes 1 GPU")
    result.trust = trust.merge([result.trust])
    print(format_result(result, label=args.layout or args.url))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result.to_dict(), indent=1) + "\n")
    return 0
