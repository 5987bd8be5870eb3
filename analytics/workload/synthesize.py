"""A trace that follows an observed workload, and the same description measured back from it.

:func:`synthesize_trace` draws arrivals that follow the workload's rate curve (repeated when the
trace is longer than the window) and its burstiness — Gamma-distributed gaps of the observed CV in
rescaled time ``Λ`` (see :mod:`analytics.workload.arrivals`), mapped back through the curve — and
draws each request's (prompt, output) tokens from the joint length distribution. The same ``seed``
gives the same trace. :func:`describe_trace` observes a trace the way a window's requests are
observed, so the synthesized workload is shown (and stored) next to the observed one, figure by figure.
"""

from __future__ import annotations

import csv
import gc
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from analytics.trust import SIMULATED, Trust
from analytics.window import AnalyticsError, Window
from analytics.workload.model import BINS_PER_DOUBLING, TRACE, JointLengths, LengthStats, Workload, log_edges
from analytics.workload.observe import RETAINED_PAIRS, workload_from_arrivals
from serving.trace import AZURE_COLUMNS, TraceRequest

#: at most this many requests in one synthesized trace
MAX_REQUESTS = 2_000_000
#: the burstiness CV a synthesized trace follows is kept in this range
CV_RANGE = (0.05, 20.0)


def synthesize_trace(
    workload: Workload,
    *,
    duration_s: float | None = None,
    rate_scale: float = 1.0,
    seed: int = 0,
) -> list[TraceRequest]:
    """Requests over ``duration_s`` (default: the workload's window) with arrivals relative to its
    start, following the rate curve times ``rate_scale`` and the burstiness, lengths from the joint
    distribution. ValueError for a duration or scale that is not > 0, or a trace over
    :data:`MAX_REQUESTS`."""
    duration = workload.duration_s if duration_s is None else float(duration_s)
    for name, value in (("duration_s", duration), ("rate_scale", rate_scale)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    curve = workload.rate_curve
    n_int = max(1, math.ceil(duration / curve.interval_s - 1e-9))
    edges = np.minimum(curve.interval_s * np.arange(n_int + 1), duration)
    rps = np.asarray([curve.rps[k % len(curve.rps)] for k in range(n_int)]) * rate_scale
    lam = np.concatenate(([0.0], np.cumsum(rps * np.diff(edges))))
    expected = float(lam[-1])
    if expected > MAX_REQUESTS:
        raise ValueError(
            f"the trace would hold about {expected:,.0f} requests, more than {MAX_REQUESTS:,}; "
            "shorten duration_s or lower rate_scale"
        )
    rng = np.random.default_rng(seed)
    cv = workload.burstiness_cv if workload.burstiness_cv else 1.0
    shape = 1.0 / min(max(cv, CV_RANGE[0]), CV_RANGE[1]) ** 2
    u = _renewal(rng, shape, expected)
    times = np.interp(u, lam, edges)
    prompt, output = workload.lengths.sample(rng, len(times))
    columns = zip(times.tolist(), prompt.tolist(), output.tolist(), strict=True)
    collecting = gc.isenabled()
    gc.disable()  # a million small objects, none of them cyclic: the collector's passes cost 2/3 of the time
    try:
        return [TraceRequest(t, p, o) for t, p, o in columns]
    finally:
        if collecting:
            gc.enable()


def _renewal(rng: np.random.Generator, shape: float, until: float) -> np.ndarray:
    """Event times of a unit-rate renewal process with Gamma(shape) gaps in ``[0, until)``; the first
    gap is a uniform fraction of a gap (the process is already running when the trace starts)."""
    if until <= 0:
        return np.zeros(0)
    out: list[np.ndarray] = []
    t = 0.0
    first = True
    while t < until:
        gaps = rng.gamma(shape, 1.0 / shape, max(1024, int((until - t) * 1.1) + 16))
        if first:
            gaps[0] *= rng.uniform()
            first = False
        times = t + np.cumsum(gaps)
        out.append(times[times < until])
        t = float(times[-1])
    return np.concatenate(out)


def describe_trace(
    trace: Sequence[TraceRequest],
    *,
    start_s: float = 0.0,
    duration_s: float | None = None,
    dataset: str = "synthesized",
    trust: Trust | None = None,
    seed: int = 0,
) -> Workload:
    """The workload of a trace, measured as a window's requests are: arrivals at ``start_s`` +
    ``arrival_s`` over ``duration_s`` (default: up to just after the last arrival). Labelled
    ``simulated`` unless ``trust`` is given: a synthesized trace is a model's output."""
    if not trace:
        raise AnalyticsError("the trace has no requests: nothing to describe")
    times = start_s + np.asarray([r.arrival_s for r in trace], dtype=float)
    duration = duration_s if duration_s is not None else float(times.max() - start_s) + 1e-6
    window = Window(start_s, start_s + duration, dataset)
    keep = [r for r in trace if r.prompt_tokens > 0 and r.output_tokens > 0]
    prompt = np.asarray([r.prompt_tokens for r in keep], dtype=np.int64)
    output = np.asarray([r.output_tokens for r in keep], dtype=np.int64)
    pi = 1 + np.ceil(BINS_PER_DOUBLING * np.log2(np.maximum(prompt, 1))).astype(np.int64)
    oi = 1 + np.ceil(BINS_PER_DOUBLING * np.log2(np.maximum(output, 1))).astype(np.int64)
    keys, counts = np.unique(pi * 4096 + oi, return_counts=True)  # a bin index stays below 4096
    edges = log_edges(int(max(pi.max(initial=0), oi.max(initial=0))) + 2)
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(keep), size=min(RETAINED_PAIRS, len(keep)), replace=False) if keep else []
    lengths = JointLengths(
        edges,
        edges,
        [(k // 4096, k % 4096, float(c)) for k, c in zip(keys.tolist(), counts.tolist(), strict=True)],
        True,
        [(int(prompt[k]), int(output[k])) for k in pick],
    )
    label = trust or Trust().add(
        SIMULATED, "synthesized from the observed workload: a model, not a measurement"
    )
    return workload_from_arrivals(
        TRACE,
        window,
        np.sort(times),
        lengths,
        LengthStats.of(prompt),
        LengthStats.of(output),
        None,
        "not modelled: a synthesized trace carries no prefix sharing",
        label,
    )


def write_trace_csv(trace: Sequence[TraceRequest], path: str | Path, *, start_s: float = 0.0) -> int:
    """Write ``trace`` as an Azure LLM inference trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``,
    UTC times from ``start_s``), the format ``--trace`` of ``phaselens simulate`` / ``goodput`` /
    ``load`` reads; returns the rows written."""
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(AZURE_COLUMNS)
        for r in trace:
            at = start_s + r.arrival_s
            whole = math.floor(at)
            micros = min(round((at - whole) * 1e6), 999_999)
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(whole)) + f".{micros:06d}"
            w.writerow((stamp, r.prompt_tokens, r.output_tokens))
    return len(trace)
