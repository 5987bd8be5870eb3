"""Goodput (DistServe, OSDI 2024): the highest request rate at which at least 90 % of requests meet
both the TTFT and the TPOT SLO, per GPU.

:func:`find_goodput` searches rates for any ``measure(rate_rps) -> attainment``: bracketing (double
the rate while attainment holds, halve it while it does not) then bisection between the highest rate
that met the target and the lowest that missed it, until they are within ``rel_tol`` of each other.
It assumes attainment falls as the rate rises (DistServe's curves do; a noisy run can break that —
the sweep table shows every point measured).

``phaselens goodput`` measures attainment with the simulator (``--layout``; every figure simulated)
or against a live stack (``--url``; measured, or emulated when its GPUs are), for a trace scaled to
each rate (``scale_arrivals``) or Poisson arrivals at it, and prints the sweep and the goodput per GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analytics.trust import EMULATED, HOST_BOUND, MEASURED, SIMULATED, Trust
from analytics.window import AnalyticsError

DEFAULT_TARGET = 0.9


@dataclass(frozen=True, slots=True)
class Measurement:
    """One point of a sweep: the offered rate, the share of requests meeting both SLOs and what else
    the backend reports (requests, failed, percentiles)."""

    rate_rps: float
    attainment: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class GoodputResult:
    """``goodput_rps`` (0.0 when even ``min_rate_rps`` misses the target; ``bounded`` False when
    ``max_rate_rps`` still meets it, so the goodput is at least that), per GPU, the sweep (by rate)."""

    goodput_rps: float
    target: float
    sweep: list[Measurement]
    gpus: int = 1
    bounded: bool = True
    rel_tol: float = 0.05
    trust: Trust = field(default_factory=Trust)

    @property
    def goodput_rps_per_gpu(self) -> float:
        return self.goodput_rps / self.gpus

    def to_dict(self) -> dict[str, Any]:
        return {
            "goodput_rps": self.goodput_rps,
            "goodput_rps_per_gpu": self.goodput_rps_per_gpu,
            "gpus": self.gpus,
            "target": self.target,
            "bounded": self.bounded,
            "rel_tol": self.rel_tol,
            "sweep": [
                {"rate_rps": m.rate_rps, "attainment": _finite(m.attainment), **_clean(m.details)}
                for m in self.sweep
            ],
            "trust": self.trust.to_dict(),
        }


def find_goodput(
    measure: Callable[[float], float | Measurement],
    *,
    initial_rate_rps: float = 1.0,
    min_rate_rps: float = 0.01,
    max_rate_rps: float = 1e4,
    target: float = DEFAULT_TARGET,
    rel_tol: float = 0.05,
    max_evals: int = 30,
    gpus: int = 1,
) -> GoodputResult:
    """The highest rate in ``[min_rate_rps, max_rate_rps]`` at which ``measure(rate)`` ≥ ``target``,
    to within ``rel_tol`` (relative) or ``max_evals`` evaluations. ``measure`` returns the attainment
    (0..1) or a :class:`Measurement`. A NaN attainment (no request finished) counts as a miss."""
    if not 0 < target <= 1:
        raise AnalyticsError(f"target attainment must be in (0, 1], got {target!r}")
    if not (0 < min_rate_rps <= initial_rate_rps <= max_rate_rps and math.isfinite(max_rate_rps)):
        raise AnalyticsError(
            "rates must satisfy 0 < min_rate_rps <= initial_rate_rps <= max_rate_rps (finite), got "
            f"{min_rate_rps!r}, {initial_rate_rps!r}, {max_rate_rps!r}"
        )
    if not 0 < rel_tol < 1:
        raise AnalyticsError(f"rel_tol must be in (0, 1), got {rel_tol!r}")
    if max_evals < 2:
        raise AnalyticsError(f"max_evals must be >= 2, got {max_evals!r}")
    if gpus < 1:
        raise AnalyticsError(f"gpus must be >= 1, got {gpus!r}")
    seen: dict[float, Measurement] = {}

    def ok(rate: float) -> bool:
        if rate not in seen:
            got = measure(rate)
            m = got if isinstance(got, Measurement) else Measurement(rate, float(got))
            seen[rate] = Measurement(rate, float(m.attainment), dict(m.details))
        a = seen[rate].attainment
        return a == a and a >= target

    trust = Trust()
    lo: float | None = None  # highest rate known to meet the target
    hi: float | None = None  # lowest rate known to miss it
    rate = initial_rate_rps
    bounded = True  # False: the highest rate tried still met the target
    if ok(rate):
        lo = rate
        while hi is None:
            if lo >= max_rate_rps or len(seen) >= max_evals:
                break
            rate = min(lo * 2.0, max_rate_rps)
            if ok(rate):
                lo = rate
            else:
                hi = rate
        if hi is None:
            bounded = False
            trust.notes.append(
                f"attainment still ≥ {target:.0%} at {lo:g} req/s (the highest rate tried): goodput ≥ that"
            )
    else:
        hi = rate
        while lo is None:
            if hi <= min_rate_rps or len(seen) >= max_evals:
                break
            rate = max(hi / 2.0, min_rate_rps)
            if ok(rate):
                lo = rate
            else:
                hi = rate
        if lo is None:
            trust.notes.append(
                f"attainment < {target:.0%} even at {hi:g} req/s: goodput below the lowest rate"
            )
    if lo is not None and hi is not None:
        while (hi - lo) > rel_tol * lo and len(seen) < max_evals:
            mid = math.sqrt(lo * hi) if hi / lo > 4 else (lo + hi) / 2.0
            if ok(mid):
                lo = mid
            else:
                hi = mid
        if (hi - lo) > rel_tol * lo:
            trust.notes.append(f"stopped after {max_evals} evaluations: goodput in [{lo:g}, {hi:g}) req/s")
    sweep = sorted(seen.values(), key=lambda m: m.rate_rps)
    return GoodputResult(
        goodput_rps=lo if lo is not None else 0.0,
        target=target,
        sweep=sweep,
        gpus=gpus,
        bounded=bounded,
        rel_tol=rel_tol,
        trust=trust,
    )


# -- attainment of one run ----------------------------------------------------------------------------


def attainment_of(
    ttft_s: Sequence[float | None],
    tpot_s: Sequence[float | None],
    ok: Sequence[bool],
    *,
    slo_ttft_s: float,
    slo_tpot_s: float,
) -> float:
    """Share of requests meeting both SLOs: ok, TTFT ≤ slo, TPOT ≤ slo (a None TPOT — one output
    token — meets it). Not-ok requests (failed, aborted, rejected) miss. NaN with no requests.
    :func:`serving.sim.summary.slo_meets` and :func:`~serving.sim.summary.slo_attainment`, the
    simulator's definition, on per-request lists."""
    import numpy as np

    from serving.sim.summary import SloSpec, slo_attainment, slo_meets

    if not len(ttft_s) == len(tpot_s) == len(ok):
        raise ValueError("ttft_s, tpot_s and ok must be of one length")
    nan = float("nan")
    meets = slo_meets(
        np.array([nan if t is None else t for t in ttft_s], dtype=float),
        np.array([nan if p is None else p for p in tpot_s], dtype=float),
        np.array(ok, dtype=bool),
        SloSpec(ttft_s=slo_ttft_s, tpot_s=slo_tpot_s),
    )
    return slo_attainment(int(meets.sum()), len(ok))


def load_report_attainment(report: Any, *, slo_ttft_s: float, slo_tpot_s: float) -> Measurement:
    """Attainment of a :class:`serving.loadgen.LoadReport`: TPOT = (e2e − TTFT) / (completion
    tokens − 1) per ok request."""
    from serving.loadgen import percentile

    ttft, tpot, ok = [], [], []
    for r in report.results:
        ttft.append(r.ttft_s)
        tpot.append(
            (r.e2e_s - r.ttft_s) / (r.completion_tokens - 1)
            if r.ok and r.e2e_s is not None and r.ttft_s is not None and r.completion_tokens > 1
            else None
        )
        ok.append(r.ok)
    a = attainment_of(ttft, tpot, ok, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s)
    emulation = report.emulation or []
    tpots = [x for x in tpot if x is not None]
    return Measurement(
        0.0,
        a,
        {
            "requests": report.n_requests,
            "failed": report.n_failed,
            "ttft_p90_ms": report.ttft.p90_ms,
            "tpot_p90_ms": percentile(tpots, 90) * 1000 if tpots else float("nan"),
            "e2e_p50_ms": report.e2e.p50_ms,
            "output_tokens_per_s": report.output_tokens_per_s,
            "emulated_workers": len(emulation),
            "host_bound_fraction": max((e["host_bound_fraction"] for e in emulation), default=0.0),
        },
    )


# -- the command --------------------------------------------------------------------------------------


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
    from serving.trace import TraceRequest, poisson_trace, scale_arrivals

    if (args.layout is None) == (args.url is None):
        return _error("give --layout LAYOUT (simulator) or --url URL (a live stack), one of them")
    if args.slo_ttft_ms <= 0 or args.slo_tpot_ms <= 0:
        return _error("--slo-ttft-ms and --slo-tpot-ms must be > 0")
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
            result = Simulation(layout, shape, requests_at(rate), on_batch=lambda b: None).run()
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


def format_result(result: GoodputResult, *, label: str | None = None) -> str:
    """The sweep table and the goodput line, labelled with the trust labels."""
    labels = str(result.trust).upper()
    lines = [f"{labels}: goodput sweep" + (f" — {label}" if label else "")]
    header = (
        f"{'rate req/s':>11}  {'attainment':>10}  {'meets':>5}  {'requests':>8}  {'failed':>6}  "
        f"{'TTFT p90 ms':>11}  {'TPOT p90 ms':>11}"
    )
    lines += [header, "-" * len(header)]
    for m in result.sweep:
        met = m.attainment == m.attainment and m.attainment >= result.target
        a = "—" if m.attainment != m.attainment else f"{m.attainment:.1%}"
        lines.append(
            f"{m.rate_rps:>11.3f}  {a:>10}  {'yes' if met else 'no':>5}  "
            f"{m.details.get('requests', '—')!s:>8}  {m.details.get('failed', '—')!s:>6}  "
            f"{_ms(m.details.get('ttft_p90_ms')):>11}  {_ms(m.details.get('tpot_p90_ms')):>11}"
        )
    bound = "" if result.bounded else "≥ "
    lines.append(
        f"goodput ({result.target:.0%} of requests meet both SLOs): {bound}{result.goodput_rps:.3f} req/s on "
        f"{result.gpus} GPU(s) = {bound}{result.goodput_rps_per_gpu:.3f} req/s per GPU [{result.trust}]"
    )
    lines += [f"  note: {n}" for n in result.trust.notes]
    return "\n".join(lines)


def _ms(x: float | None) -> str:
    if x is None or x != x:
        return "—"
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def _finite(x: float) -> float | None:
    return x if isinstance(x, int | float) and math.isfinite(x) else None


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (_finite(v) if isinstance(v, float) else v) for k, v in d.items()}
