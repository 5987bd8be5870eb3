"""One candidate layout, simulated: the recommendation's METRICS, the bottleneck, the goodput.

:func:`simulate` runs ``serving.sim.simulator.Simulation`` in memory (telemetry dropped,
``on_batch=lambda b: None``) and :func:`evaluation_of` turns the result into an :class:`Evaluation`:
``serving.sim.summary.summarize`` (TTFT/TPOT percentiles with queueing, attainment over every
request, the GPUs' modeled energy), dollars from ``analytics.prices`` (GPU-hours at the table's
$/GPU-hour plus the energy at $/kWh × PUE: the all-in total ``analytics.cost_pricing.price_usage``
makes of the same GPU-seconds and joules), and the bottleneck: which SLO the misses are of (TTFT:
prefill queueing; TPOT: decode batch / KV) and how busy each pool was. :func:`goodput` is
``analytics.goodput.find_goodput`` over a trace scaled to each rate (``scale_arrivals``).
Every figure is simulated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analytics.cost_pricing import HOURS_PER_YEAR
from analytics.goodput import GoodputResult, Measurement, find_goodput
from analytics.prices import PriceTable
from analytics.recommend.inputs import SloTarget
from serving.config import ModelConfig
from serving.sim.layout import Layout, parse_layout
from serving.sim.simulator import SimResult, Simulation
from serving.sim.summary import SimSummary, SloSpec, summarize
from serving.trace import TraceRequest, scale_arrivals

METRICS = (
    "goodput_rps_per_gpu",
    "output_tokens_per_s_per_gpu",
    "output_tokens_per_s_per_user",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "tpot_p99_s",
    "slo_attainment",
    "usd_per_1m_tokens",
    "j_per_token",
    "usd_per_year",
)
BOTTLENECKS = ("prefill", "decode", "mixed", "none")


@dataclass(slots=True)
class Evaluation:
    """A simulated run of one layout over one trace, reduced to what the recommendation needs."""

    layout: str
    gpus: int
    requests: int
    duration_s: float
    summary: dict[str, Any]
    usd_per_h: float
    usd_per_1m_tokens: float
    ttft_miss_share: float  # of all requests: TTFT over the SLO (or failed)
    tpot_miss_share: float
    busy_share: dict[str, float]  # per role: GPU-busy time / (wall × replicas)
    kv_peak_share: dict[str, float]  # per role: the most KV in use / the KV cache
    bottleneck: str
    bottleneck_text: str
    wall_s: float
    output_tokens_per_s: float
    peak_in_flight_per_replica: float = (
        0.0  # the most requests in the system at once ÷ replicas that batch them
    )

    @property
    def attainment(self) -> float:
        return float(self.summary["slo_attainment"])

    def meets(self, target: float) -> bool:
        a = self.attainment
        return a == a and a >= target


def simulate(
    layout: Layout, shape: ModelConfig, trace: Sequence[TraceRequest], *, dispatch_delay_s: float = 0.0
) -> SimResult:
    """Run ``trace`` on ``layout`` in virtual time, telemetry dropped; ``dispatch_delay_s``: the
    live front end's delay before each arrival reaches the engine (``Simulation``'s)."""
    return Simulation(
        layout, shape, trace, on_batch=lambda b: None, dispatch_delay_s=dispatch_delay_s, columnar=True
    ).run()


def _request_arrays(result: SimResult) -> tuple[np.ndarray, np.ndarray]:
    st = result.stats
    arrival, first, finish = (
        np.frombuffer(a, dtype=np.float64) for a in (st.arrival_s, st.first_token_s, st.finish_s)
    )
    out = np.frombuffer(st.output_tokens, dtype=np.int64)
    ttft = first - arrival
    tpot = np.full(len(out), np.nan)
    multi = out > 1
    tpot[multi] = (finish[multi] - first[multi]) / (out[multi] - 1)
    return ttft, tpot


def usd_per_hour(
    layout: Layout, gpu_name: str, energy_j: float, duration_s: float, prices: PriceTable
) -> float:
    """All-in dollars an hour: the GPUs at the price table's $/GPU-hour plus the energy over the run
    (J → kWh × PUE × $/kWh) spread over its hours; NaN when the GPU has no price."""
    price = prices.gpu_price(gpu_name)
    if price is None or duration_s <= 0:
        return float("nan")
    return layout.gpus * price + prices.energy_usd(energy_j) * 3600.0 / duration_s


def evaluation_of(result: SimResult, slo: SloTarget, prices: PriceTable) -> Evaluation:
    """Reduce a run (see the module docstring)."""
    s: SimSummary = summarize(result, SloSpec(ttft_s=slo.ttft_s, tpot_s=slo.tpot_s))
    layout = result.layout
    ttft, tpot = _request_arrays(result)
    n = max(result.requests, 1)
    ttft_miss = (int((ttft > slo.ttft_s).sum()) + result.failed) / n
    tpot_miss = int((tpot > slo.tpot_s).sum()) / n
    wall = max(result.duration_s, 1e-9)
    busy: dict[str, float] = {}
    kv: dict[str, float] = {}
    kv_per_token = result.shape.kv_bytes_per_token(2)
    for pool in layout.pools:
        reps = [r for r in result.replicas if r.role == pool.role]
        spent = sum(
            float((np.frombuffer(r.intervals.end_s) - np.frombuffer(r.intervals.start_s)).sum()) for r in reps
        )
        busy[pool.role] = spent / (wall * len(reps))
        peak = max((max(r.intervals.kv_bytes, default=0) for r in reps), default=0)
        cache = reps[0].engine_cfg.num_blocks * reps[0].engine_cfg.block_size
        kv[pool.role] = peak * pool.tp / kv_per_token / cache if cache else float("nan")
    usd_h = usd_per_hour(layout, result.gpu_name, s.energy_j, wall, prices)
    tokens = s.input_tokens + s.output_tokens
    usd_1m = usd_h * wall / 3600.0 / tokens * 1e6 if tokens else float("nan")
    bottleneck, text = _bottleneck(layout, s, slo, ttft_miss, tpot_miss, busy, kv)
    return Evaluation(
        layout=layout.name,
        gpus=layout.gpus,
        requests=result.requests,
        duration_s=result.duration_s,
        summary=s.to_dict(),
        usd_per_h=usd_h,
        usd_per_1m_tokens=usd_1m,
        ttft_miss_share=ttft_miss,
        tpot_miss_share=tpot_miss,
        busy_share=busy,
        kv_peak_share=kv,
        bottleneck=bottleneck,
        bottleneck_text=text,
        wall_s=result.wall_s,
        output_tokens_per_s=s.output_tokens_per_s,
        peak_in_flight_per_replica=_peak_in_flight(result)
        / max(1, sum(p.replicas for p in layout.pools if p.role != "prefill")),
    )


def _peak_in_flight(result: SimResult) -> int:
    """The most requests between arrival and finish at once (the ok ones)."""
    st = result.stats
    start, end = np.frombuffer(st.arrival_s, dtype=np.float64), np.frombuffer(st.finish_s, dtype=np.float64)
    if not len(start):
        return 0
    times = np.concatenate([start, end])
    steps = np.concatenate([np.ones(len(start)), -np.ones(len(end))])
    order = np.lexsort((steps, times))  # at equal times a finish (-1) goes before an arrival
    return int(np.cumsum(steps[order]).max())


def _bottleneck(
    layout: Layout,
    s: SimSummary,
    slo: SloTarget,
    ttft_miss: float,
    tpot_miss: float,
    busy: dict[str, float],
    kv: dict[str, float],
) -> tuple[str, str]:
    """``prefill`` when the misses are TTFT misses (queueing before the first token), ``decode``
    when they are TPOT misses (decode batch / KV), ``mixed`` when both weigh, ``none`` when the SLOs
    are met; the text names the pool and its load."""
    loads = ", ".join(
        f"{role} busy {share:.0%}" + (f", KV peak {kv[role]:.0%}" if role != "prefill" else "")
        for role, share in busy.items()
    )
    if s.slo_attainment == s.slo_attainment and s.slo_attainment >= slo.target:
        busiest = max(busy, key=lambda r: busy[r])
        return "none", f"meets the SLOs at this load; busiest: the {busiest} pool ({loads})"
    agg = layout.mode == "aggregated"
    if ttft_miss >= 2 * tpot_miss:
        where = "prefill chunks queue on the mixed replicas" if agg else "the prefill pool queues"
        return "prefill", (
            f"TTFT: {ttft_miss:.0%} of requests miss {slo.ttft_s * 1e3:g} ms (p90 {s.ttft_p90_s * 1e3:,.0f} ms): "
            f"{where} ({loads})"
        )
    if tpot_miss >= 2 * ttft_miss:
        where = (
            "decode steps slowed by their batch and the prefill chunks riding in it"
            if agg
            else "the decode pool's batch / KV"
        )
        return "decode", (
            f"TPOT: {tpot_miss:.0%} of requests miss {slo.tpot_s * 1e3:g} ms (p90 {s.tpot_p90_s * 1e3:.1f} ms): "
            f"{where} ({loads})"
        )
    both = f"TTFT misses {ttft_miss:.0%}, TPOT misses {tpot_miss:.0%} of requests"
    if not agg:  # both SLOs miss: the saturated pool is the cause (a full decode pool holds back hand-offs)
        p = busy.get("prefill", 0.0)
        d = max(busy.get("decode", 0.0), kv.get("decode", 0.0))
        if d - p > 0.3:
            return (
                "decode",
                f"{both}: the decode pool is saturated (batch / KV) and holds back hand-offs ({loads})",
            )
        if p - d > 0.3:
            return "prefill", f"{both}: the prefill pool is saturated and queues ({loads})"
    return "mixed", f"both: {both} ({loads})"


def metrics(
    ev: Evaluation, *, goodput_rps_per_gpu: float | None, fleet_copies: float
) -> dict[str, float | None]:
    """The contract's METRICS of one evaluation (None where undefined). ``fleet_copies``: how many
    copies of the layout the fleet runs (fleet GPUs / the current layout's GPUs)."""
    s = ev.summary
    tpot50 = s["tpot_p50_s"]
    out: dict[str, Any] = {
        "goodput_rps_per_gpu": goodput_rps_per_gpu,
        "output_tokens_per_s_per_gpu": s["output_tokens_per_s_per_gpu"],
        # a user's decode speed (InferenceMAX's tokens/s/user): 1 / the median TPOT
        "output_tokens_per_s_per_user": 1.0 / tpot50 if tpot50 and tpot50 == tpot50 else None,
        **{
            k: s[k]
            for k in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s")
        },
        "slo_attainment": s["slo_attainment"],
        "usd_per_1m_tokens": ev.usd_per_1m_tokens,
        "j_per_token": s["j_per_token"],
        "usd_per_year": ev.usd_per_h * HOURS_PER_YEAR * fleet_copies,
    }
    return {k: _finite(out[k]) for k in METRICS}


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else None


# -- goodput ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class SliceRun:
    """A candidate on the search slice: the run at the slice's own rate and the goodput search."""

    layout: str
    at_load: Evaluation
    goodput: GoodputResult | None = None
    runs: int = 1
    notes: list[str] = field(default_factory=list)

    @property
    def goodput_rps_per_gpu(self) -> float | None:
        return self.goodput.goodput_rps_per_gpu if self.goodput is not None else None


def rebase(trace: Sequence[TraceRequest]) -> list[TraceRequest]:
    """``trace`` with its first arrival at 0."""
    t0 = trace[0].arrival_s
    return [TraceRequest(r.arrival_s - t0, r.prompt_tokens, r.output_tokens) for r in trace]


def run_slice(
    layout_text: str,
    shape: ModelConfig,
    trace: Sequence[TraceRequest],
    slo: SloTarget,
    prices: PriceTable,
    *,
    with_goodput: bool = True,
    max_evals: int = 7,
    rel_tol: float = 0.1,
    max_rate_rps: float | None = None,
    dispatch_delay_s: float = 0.0,
) -> SliceRun:
    """Simulate ``trace`` (a slice, from 0) on the layout at its own rate, then (``with_goodput``)
    search the goodput by scaling it: the first point of the sweep is that run. ``max_rate_rps``
    caps the rates tried (the layout's capacity bound: above it a finite slice can pass only
    because its requests end before the queue builds). ``dispatch_delay_s``: :func:`simulate`'s."""
    layout = parse_layout(layout_text)
    base_rate = (len(trace) - 1) / (trace[-1].arrival_s - trace[0].arrival_s)
    first = evaluation_of(simulate(layout, shape, trace, dispatch_delay_s=dispatch_delay_s), slo, prices)
    run = SliceRun(layout_text, first)
    if not with_goodput:
        return run
    if not first.meets(slo.target):
        # its goodput is under the slice's own rate: it cannot be the best, so no search for it
        run.notes.append(f"goodput < {base_rate:.3g} req/s (misses the SLOs at the slice's own rate)")
        return run

    def measure(rate: float) -> Measurement:
        if rate == base_rate:
            return Measurement(rate, first.attainment)
        run.runs += 1
        scaled = scale_arrivals(trace, rate_scale=rate / base_rate)
        result = simulate(layout, shape, scaled, dispatch_delay_s=dispatch_delay_s)
        s = summarize(result, SloSpec(ttft_s=slo.ttft_s, tpot_s=slo.tpot_s))
        return Measurement(rate, s.slo_attainment)

    run.goodput = find_goodput(
        measure,
        initial_rate_rps=base_rate,
        min_rate_rps=base_rate / 8,
        max_rate_rps=max(base_rate, min(base_rate * 64, max_rate_rps or float("inf"))),
        target=slo.target,
        rel_tol=rel_tol,
        max_evals=max_evals,
        gpus=layout.gpus,
    )
    return run
