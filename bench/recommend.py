"""Time to recommend a layout over 1 h of traffic: ``phaselens recommend``'s search
(analytics.recommend.recommend) on the Azure 2023 conversation trace hour (``serving.trace.SHARED_TRACE``;
the vendored 2,000-request slice where it is absent), llama-3.1-70b on 8 H100s (current layout
``agg:8xh100-sxm:tp2``), TTFT <= 1 s, TPOT <= 30 ms, 90 %. Baseline in the same run: the unpruned
search — every candidate of the same grid (every structure at every GPU count up to the budget,
every engine setting: ``candidates.all_settings``) simulated once on the whole hour (no goodput
search, so the baseline is cheaper than a real unpruned search and the ratio is a lower bound) —
timed on ``--baseline-sample`` candidates spread over the grid and extrapolated by count.

    PYTHONPATH=. .venv/bin/python bench/recommend.py [--workers 2] [--baseline-sample 4]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics.recommend import RecommendInputs, SearchOptions, SloTarget, recommend
from analytics.recommend.candidates import all_settings, structures
from analytics.recommend.evaluate import evaluation_of, run_slice, simulate
from analytics.recommend.inputs import min_gpus
from serving.config import preset
from serving.sim.layout import parse_layout
from serving.trace import SHARED_TRACE, load_azure_trace, vendored_trace_path

FLIP = (
    "2p1d:h100-sxm:prefill.tp=2:decode.tp=4",
    "agg:8xh100-sxm:tp4",
    "agg:8xh100-sxm:tp4:max_num_batched_tokens=256",
)


def _cpu_s() -> float:
    """CPU seconds of this process and of its finished children (the search's worker processes)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--layout", default="agg:8xh100-sxm:tp2")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--baseline-sample", type=int, default=4)
    ap.add_argument("--table", action="store_true", help="print the candidate table")
    args = ap.parse_args()
    path = SHARED_TRACE if SHARED_TRACE.is_file() else vendored_trace_path()
    trace = load_azure_trace(path, duration_s=args.duration)
    shape = preset("llama-3.1-70b")
    slo = SloTarget(1.0, 0.03)
    print(
        f"trace {path.name}: {len(trace):,} requests over {trace[-1].arrival_s:.0f} s; host {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    )
    t0 = time.perf_counter()
    cpu0 = _cpu_s()
    rec = recommend(
        RecommendInputs(trace, "llama-3.1-70b", args.layout, slo, trace_desc=path.name),
        SearchOptions(workers=args.workers),
        progress=lambda m: print(" ", m, flush=True),
    )
    wall = time.perf_counter() - t0
    print(
        f"recommend: {wall:.1f} s wall, {_cpu_s() - cpu0:.1f} s CPU (with its worker processes), {rec.result.sims} simulations"
    )
    print(f"  proposed: {rec.proposed.layout} (stay: {rec.stay})\n  {rec.rationale}")
    print(f"  same budget: {rec.result.same_budget.layout if rec.result.same_budget else None}")
    print(f"  least budget: {rec.result.least_budget.layout if rec.result.least_budget else None}")
    if args.table:
        from analytics.recommend.records import recommendation_row
        from analytics.recommend.text import format_recommendation

        print(format_recommendation(recommendation_row(rec, node="bench"), all_candidates=True))
    # the check: the verdict on disaggregation flips with the aggregated layout's chunk size
    first = load_azure_trace(path, limit=300)
    g = {
        text: run_slice(
            text, shape, first, slo, rec.inputs.prices, rel_tol=0.05, max_evals=9
        ).goodput_rps_per_gpu
        for text in FLIP
    }
    d, big, small = (g[t] for t in FLIP)
    print(
        f"verdict on disaggregation, the first 300 requests: {FLIP[0]} carries {d / big:.2f}x the goodput per GPU of "
        f"{FLIP[1]} and {d / small:.2f}x that of {FLIP[2]} ({d:.3f} / {big:.3f} / {small:.3f} req/s per GPU)"
    )
    grid = [
        c.layout
        for n in range(min_gpus(shape, ["h100-sxm"]) or 1, 9)
        for st in structures(shape, ["h100-sxm"], n)
        for c in all_settings(st)
    ]
    step = max(1, len(grid) // max(1, args.baseline_sample))
    sample = grid[::step][: args.baseline_sample]
    t1, c1 = time.perf_counter(), _cpu_s()
    for text in sample:
        evaluation_of(simulate(parse_layout(text), shape, trace), slo, rec.inputs.prices)
    per = (time.perf_counter() - t1) / len(sample)
    per_cpu = (_cpu_s() - c1) / len(sample)
    base = per * len(grid)
    print(
        f"baseline (unpruned): {len(grid)} candidates x the whole trace; {len(sample)} timed, {per:.1f} s each -> "
        f"{base:.0f} s extrapolated; ratio {base / wall:.1f}x (the pruned search: {wall:.1f} s, target < 60 s); "
        f"CPU {per_cpu:.1f} s each -> {per_cpu * len(grid):.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
