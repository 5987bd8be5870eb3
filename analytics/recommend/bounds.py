"""An analytic capacity bound per layout, from the GPU model alone (no simulation), to prune.

Per pool, from :func:`serving.devices.gpu_model.predict_iteration` (the model every simulated
iteration uses) and the trace's mean prompt and output lengths:

* prefill throughput ``P`` (tokens/s per replica): one full batch of ``max_num_batched_tokens``
  prompt tokens (the whole prompt when chunking is off), divided by its iteration time;
* decode throughput ``D`` (tokens/s per replica): the largest decode batch ``b`` (≤ ``max_num_seqs``
  and the sequences the KV cache holds at the mean context) whose iteration fits the TPOT SLO, ``b / t(b)``;
* unloaded TPOT (a batch of one) and unloaded TTFT of the prompt at the attainment quantile.

The layout's request rate bound: xPyD ``min(x·P / prompt, y·D / output)``; aggregated replicas
time-share both phases, ``n / (prompt/P + output/D)``, times :data:`MIXED_MARGIN` because a
mixed batch overlaps the two (a decode step riding in a prefill batch costs less than alone).
It is an *upper* bound on what the layout carries with the SLOs met (queueing and bursts only lower
it), approximate in that the margin is a judgement: the search drops a candidate whose bound is
under the trace's mean rate (it cannot carry the load), whose unloaded TPOT or TTFT misses the SLO
(no load meets it), or whose bound per GPU is under the best goodput per GPU already simulated
(dominated: :data:`BOUND_SLACK` more room is left for the model's optimism).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from serving.config import ModelConfig
from serving.devices.base import IterationWork
from serving.devices.gpu_model import kv_capacity_tokens, kv_transfer_s, predict_iteration
from serving.sim.layout import Layout, PoolSpec
from serving.trace import TraceRequest

#: a mixed replica's bound over the time-sharing one (prefill and decode overlap in a batch)
MIXED_MARGIN = 1.25
#: a candidate is dominated when its bound per GPU × this is under the best goodput per GPU found
BOUND_SLACK = 1.2


@dataclass(frozen=True, slots=True)
class WorkloadStats:
    """The trace's figures the bound needs."""

    requests: int
    duration_s: float
    rate_rps: float
    prompt_mean: float
    output_mean: float
    prompt_q: float  # the prompt length at the attainment quantile

    @classmethod
    def of(cls, trace: Sequence[TraceRequest], quantile: float = 0.9) -> WorkloadStats:
        p = np.asarray([r.prompt_tokens for r in trace], dtype=float)
        o = np.asarray([r.output_tokens for r in trace], dtype=float)
        span = trace[-1].arrival_s - trace[0].arrival_s
        return cls(
            requests=len(trace),
            duration_s=span,
            rate_rps=(len(trace) - 1) / span if span > 0 else float("inf"),
            prompt_mean=float(p.mean()),
            output_mean=float(o.mean()),
            prompt_q=float(np.quantile(p, quantile)),
        )


@dataclass(slots=True)
class Bound:
    """A layout's analytic bound: ``rate_rps`` it could carry at most, per pool rates, and why it
    cannot meet the SLOs at all (``infeasible``, empty when it may)."""

    rate_rps: float
    gpus: int
    prefill_tokens_per_s: dict[str, float] = field(default_factory=dict)
    decode_tokens_per_s: dict[str, float] = field(default_factory=dict)
    unloaded_tpot_s: float = float("nan")
    unloaded_ttft_s: float = float("nan")
    infeasible: list[str] = field(default_factory=list)

    @property
    def rate_rps_per_gpu(self) -> float:
        return self.rate_rps / self.gpus


def _it(layout: Layout, shape: ModelConfig, pool: PoolSpec, work: IterationWork) -> float:
    return predict_iteration(
        layout.gpu,
        shape,
        work,
        power_limit_w=pool.power_limit_w,
        sm_clock_range=pool.sm_clock_mhz,
        tp=pool.tp,
        link=layout.tp_link,
        profile=layout.profile,
    ).time_s


def _prefill_s(layout: Layout, shape: ModelConfig, pool: PoolSpec, tokens: int, prompt: int) -> float:
    """One iteration prefilling ``tokens`` tokens of prompts of length ``prompt``."""
    seqs = max(1, round(tokens / max(prompt, 1)))
    n = max(1, tokens // seqs)
    work = IterationWork("prefill", tokens, 0, tokens, seqs, seqs * (n * (n + 1) // 2), seqs)
    return _it(layout, shape, pool, work)


def _decode_s(layout: Layout, shape: ModelConfig, pool: PoolSpec, batch: int, context: int) -> float:
    work = IterationWork("decode", 0, batch, batch * context, batch, batch * context, batch)
    return _it(layout, shape, pool, work)


def layout_bound(layout: Layout, shape: ModelConfig, w: WorkloadStats, tpot_s: float, ttft_s: float) -> Bound:
    """The analytic bound of ``layout`` for workload ``w`` under the SLOs (module docstring)."""
    prompt = max(1, round(w.prompt_mean))
    output = max(1.0, w.output_mean)
    context = max(1, round(w.prompt_mean + w.output_mean / 2))
    bound = Bound(rate_rps=0.0, gpus=layout.gpus)
    rates: dict[str, float] = {}
    for pool in layout.pools:
        chunk = (
            pool.max_num_batched_tokens if pool.chunked_prefill else max(prompt, pool.max_num_batched_tokens)
        )
        t_chunk = _prefill_s(layout, shape, pool, chunk, prompt)
        p_rate = chunk / t_chunk
        bound.prefill_tokens_per_s[pool.role] = p_rate
        if pool.role != "prefill":
            kv_tokens = kv_capacity_tokens(
                layout.gpu, shape, tp=pool.tp, gpu_memory_utilization=layout.gpu_memory_utilization
            )
            most = max(1, min(pool.max_num_seqs, kv_tokens // max(1, round(w.prompt_mean + w.output_mean))))
            t1 = _decode_s(layout, shape, pool, 1, context)
            bound.unloaded_tpot_s = (
                min(bound.unloaded_tpot_s, t1) if bound.unloaded_tpot_s == bound.unloaded_tpot_s else t1
            )
            lo, hi = 1, most  # the largest batch whose iteration fits the TPOT SLO (time rises with b)
            if t1 > tpot_s:
                b = 1
            else:
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if _decode_s(layout, shape, pool, mid, context) <= tpot_s:
                        lo = mid
                    else:
                        hi = mid - 1
                b = lo
            bound.decode_tokens_per_s[pool.role] = b / _decode_s(layout, shape, pool, b, context)
        # unloaded TTFT of the quantile prompt, chunk by chunk on this pool
        if pool.role != "decode":
            q = max(1, round(w.prompt_q))
            step = pool.max_num_batched_tokens if pool.chunked_prefill else q
            chunks = max(1, math.ceil(q / step))
            ttft = chunks * _prefill_s(layout, shape, pool, min(q, step), min(q, step))
            if pool.role == "prefill":
                ttft += kv_transfer_s(shape, q, layout.kv_link, tp=pool.tp)
            bound.unloaded_ttft_s = ttft
        if pool.role == "mixed":
            per = 1.0 / (prompt / p_rate + output / bound.decode_tokens_per_s["mixed"])
            rates["mixed"] = pool.replicas * per * MIXED_MARGIN
        elif pool.role == "prefill":
            rates["prefill"] = pool.replicas * p_rate / prompt
        else:
            rates["decode"] = pool.replicas * bound.decode_tokens_per_s["decode"] / output
    bound.rate_rps = min(rates.values())
    if bound.unloaded_tpot_s > tpot_s:
        bound.infeasible.append(
            f"a decode step alone takes {bound.unloaded_tpot_s * 1e3:.1f} ms > the TPOT SLO "
            f"{tpot_s * 1e3:g} ms (raise TP)"
        )
    if bound.unloaded_ttft_s > ttft_s:
        bound.infeasible.append(
            f"the prompt at the attainment quantile ({round(w.prompt_q)} tokens) takes "
            f"{bound.unloaded_ttft_s * 1e3:.0f} ms to its first token unloaded > the TTFT SLO {ttft_s * 1e3:g} ms"
        )
    return bound
