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

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from analytics.trust import Trust
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
