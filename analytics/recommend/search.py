"""The pruned search: which candidates are simulated, on what, and in which order.

Stages (docs/RECOMMENDATIONS.md, "Search and confidence"):

1. **Bound** every structure (``candidates.structures``, every GPU count up to the budget, every
   allowed GPU) at its coarse settings with :func:`analytics.recommend.bounds.layout_bound`: drop
   those that cannot meet an SLO unloaded or cannot carry the trace's mean rate.
2. **Slice**: the busiest window of the trace (:func:`busiest_slice`, ``slice_requests`` requests),
   rebased to 0. At the budget, candidates in order of their bound per GPU are simulated on it at
   its own rate and their goodput searched by scaling it (``find_goodput``, ±10 %, ≤ 7 runs; rates
   capped at the bound × ``BOUND_SLACK`` and where the slice still lasts ``STEADY_LIFETIMES`` request
   lifetimes (TTFT + output × TPOT at the SLOs); a candidate missing the SLOs at the slice's own
   rate gets no search: it cannot be the best);
   a candidate whose bound per GPU (× ``BOUND_SLACK``) is under the best goodput per GPU found is
   dominated and skipped. The settings of the best ``refine`` structures are then searched one
   knob at a time (``candidates.fine_settings``). Below the budget, GPU counts are tried from the
   cheapest up; each candidate is run once at the slice's rate, and the first count with a candidate
   meeting the SLOs is the least budget: those that meet have their goodput searched and their
   settings refined the same way (dominance judged within that GPU count), the best goodput wins.
3. **Hour**: the current layout, the best at the budget and the least budget are simulated on the
   whole trace; a finalist that misses the SLOs there gives way to the next (``max_hour_runs``).

Approximations: the slice stands for the whole trace (its peak, so SLOs met there are met at the
mean load; its queueing is a window's, not an hour's); the goodput is the slice's mix scaled in rate;
the settings are searched one knob at a time from the coarse best, not jointly.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from analytics.prices import PriceTable
from analytics.recommend.bounds import BOUND_SLACK, Bound, WorkloadStats, layout_bound
from analytics.recommend.candidates import (
    Candidate,
    coarse,
    fine_settings,
    layout_wide_options,
    structures,
)
from analytics.recommend.evaluate import Evaluation, SliceRun, evaluation_of, rebase, run_slice, simulate
from analytics.recommend.inputs import RecommendInputs, SloTarget, min_gpus
from serving.config import ModelConfig
from serving.sim.layout import Layout, parse_layout
from serving.trace import TraceRequest

#: the goodput search's rates keep the slice at least this many request lifetimes long
STEADY_LIFETIMES = 3.0


@dataclass(frozen=True, slots=True)
class SearchOptions:
    """How hard to search. ``workers`` > 1 runs the hour's finalists (and batches of slice runs)
    in that many processes."""

    slice_requests: int = 300
    refine: int = 2
    max_hour_runs: int = 4
    workers: int = 1
    min_gain_pct: float = 10.0
    goodput_rel_tol: float = 0.1
    goodput_max_evals: int = 7


@dataclass(slots=True)
class Scored:
    """One candidate as far as the search took it."""

    candidate: Candidate | None  # None: the current layout, given as a string
    layout: str
    gpus: int
    gpu: str
    mode: str
    bound: Bound | None = None
    pruned: str | None = None
    slice_run: SliceRun | None = None
    hour: Evaluation | None = None
    stage: str = "bound"

    @property
    def goodput_rps_per_gpu(self) -> float | None:
        return self.slice_run.goodput_rps_per_gpu if self.slice_run else None

    @property
    def best_eval(self) -> Evaluation | None:
        return self.hour or (self.slice_run.at_load if self.slice_run else None)

    def meets(self, target: float) -> bool | None:
        ev = self.best_eval
        return None if ev is None else ev.meets(target)


@dataclass(slots=True)
class SearchResult:
    current: Scored
    same_budget: Scored | None
    least_budget: Scored | None
    scored: list[Scored]
    slice_desc: str
    sims: int = 0
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)


def same_key(layout: Layout) -> str:
    """What makes two layouts the same deployment: ``Layout.describe()`` without the name."""
    d = layout.describe()
    d.pop("name", None)
    return json.dumps(d, sort_keys=True)


def busiest_slice(trace: Sequence[TraceRequest], n: int) -> list[TraceRequest]:
    """The ``n`` consecutive requests that arrive over the shortest time (the peak), from 0."""
    reqs = sorted(trace, key=lambda r: r.arrival_s)
    if len(reqs) <= n:
        return rebase(reqs)
    best, start = float("inf"), 0
    for i in range(len(reqs) - n + 1):
        span = reqs[i + n - 1].arrival_s - reqs[i].arrival_s
        if span < best:
            best, start = span, i
    out = reqs[start : start + n]
    if out[-1].arrival_s - out[0].arrival_s <= 0:
        return rebase(reqs[:n])
    return rebase(out)


def _hour(args: tuple[str, ModelConfig, Sequence[TraceRequest], SloTarget, PriceTable, float]) -> Evaluation:
    layout_text, shape, trace, slo, prices, delay_s = args
    return evaluation_of(
        simulate(parse_layout(layout_text), shape, trace, dispatch_delay_s=delay_s), slo, prices
    )


def _slice(args: tuple[Any, ...]) -> SliceRun:
    layout_text, shape, trace, slo, prices, with_goodput, rel_tol, max_evals, max_rate, delay_s = args
    return run_slice(
        layout_text,
        shape,
        trace,
        slo,
        prices,
        with_goodput=with_goodput,
        rel_tol=rel_tol,
        max_evals=max_evals,
        max_rate_rps=max_rate,
        dispatch_delay_s=delay_s,
    )


def _map(fn: Callable[[Any], Any], items: list[Any], workers: int) -> list[Any]:
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=min(workers, len(items)), mp_context=ctx) as pool:
        return list(pool.map(fn, items))


class _Search:
    def __init__(
        self, inputs: RecommendInputs, options: SearchOptions, progress: Callable[[str], None] | None
    ) -> None:
        self.inputs = inputs
        self.opt = options
        self.shape: ModelConfig = inputs.shape  # type: ignore[assignment]
        self.slo = inputs.slo
        self.say = progress or (lambda m: None)
        self.workload = WorkloadStats.of(inputs.trace, quantile=inputs.slo.target)
        self.slice = busiest_slice(inputs.trace, options.slice_requests)
        self.extra = layout_wide_options(inputs.current_layout)  # type: ignore[arg-type]
        self.gmu = inputs.current_layout.gpu_memory_utilization  # type: ignore[union-attr]
        # the slice is a steady state only while it lasts several request lifetimes (TTFT + output × TPOT
        # at the SLOs): faster, every request is in flight at once and a finite slice passes any layout
        life_s = self.slo.ttft_s + self.workload.output_mean * self.slo.tpot_s
        self.max_rate_rps = len(self.slice) / (STEADY_LIFETIMES * life_s)
        self.scored: dict[str, Scored] = {}
        self.keys: set[str] = set()
        self.sims = 0
        self.best_goodput = 0.0

    # -- one candidate ------------------------------------------------------------------------------

    def consider(self, c: Candidate) -> Scored | None:
        """Bound ``c``; None when it was seen or is pruned (recorded with the reason)."""
        text = c.layout
        layout = parse_layout(text)
        key = same_key(layout)
        if text in self.scored or key in self.keys:  # the same deployment under another spelling
            return None
        self.keys.add(key)
        sc = Scored(c, text, layout.gpus, layout.gpu, layout.mode)
        self.scored[text] = sc
        b = sc.bound = layout_bound(layout, self.shape, self.workload, self.slo.tpot_s, self.slo.ttft_s)
        if b.infeasible:
            sc.pruned = "cannot meet the SLOs at any load: " + "; ".join(b.infeasible)
        elif b.rate_rps < self.workload.rate_rps:
            sc.pruned = (
                f"cannot carry the load: at most {b.rate_rps:.2f} req/s by the GPU model's capacity bound, "
                f"the trace brings {self.workload.rate_rps:.2f}"
            )
        return None if sc.pruned else sc

    def run(self, items: list[Scored], *, goodput: bool) -> None:
        o = self.opt
        args = [
            (
                s.layout,
                self.shape,
                self.slice,
                self.slo,
                self.inputs.prices,
                goodput,
                o.goodput_rel_tol,
                o.goodput_max_evals,
                min(s.bound.rate_rps * BOUND_SLACK if s.bound else float("inf"), self.max_rate_rps),
                self.inputs.dispatch_delay_s,
            )
            for s in items
        ]
        for s, r in zip(items, _map(_slice, args, self.opt.workers), strict=True):
            s.slice_run, s.stage = r, "slice"
            self.sims += r.runs
            g = r.goodput_rps_per_gpu
            if g is not None and r.at_load.meets(self.slo.target):
                self.best_goodput = max(self.best_goodput, g)

    def run_bounded(self, items: Iterable[Scored]) -> None:
        """Goodput-search ``items`` in order of their bound per GPU, skipping the dominated."""
        todo = sorted(items, key=lambda s: -s.bound.rate_rps_per_gpu)  # type: ignore[union-attr]
        step = max(1, self.opt.workers)
        while todo:
            batch, todo = todo[:step], todo[step:]
            live = []
            for s in batch:
                if s.bound.rate_rps_per_gpu * BOUND_SLACK < self.best_goodput:  # type: ignore[union-attr]
                    s.pruned = (
                        f"dominated: its capacity bound ({s.bound.rate_rps_per_gpu:.3f} req/s per GPU) is under the "  # type: ignore[union-attr]
                        f"best goodput found ({self.best_goodput:.3f})"
                    )
                else:
                    live.append(s)
            self.run(live, goodput=True)

    def refine(self, group: list[Scored], *, goodput: bool) -> None:
        """Fine settings around the best ``refine`` structures of ``group``."""
        ranked = sorted((s for s in group if s.slice_run), key=lambda s: self._rank(s, goodput), reverse=True)
        seen_structures = []
        for s in ranked:
            if s.candidate is None or s.candidate.structure in seen_structures:
                continue
            seen_structures.append(s.candidate.structure)
            if len(seen_structures) > self.opt.refine:
                break
            peak = s.slice_run.at_load.peak_in_flight_per_replica  # type: ignore[union-attr]
            fresh = [x for c in fine_settings(s.candidate, peak) if (x := self.consider(c))]
            self.say(f"  refining {s.candidate.structure.text()}: {len(fresh)} settings")
            if goodput:
                self.run_bounded(fresh)
            else:
                self.run(fresh, goodput=False)
            group.extend(fresh)

    def _rank(self, s: Scored, goodput: bool) -> tuple[float, ...]:
        ev = s.slice_run.at_load  # type: ignore[union-attr]
        meets = 1.0 if ev.meets(self.slo.target) else 0.0
        cost = -(ev.usd_per_1m_tokens if ev.usd_per_1m_tokens == ev.usd_per_1m_tokens else 1e18)
        attained = ev.attainment if ev.attainment == ev.attainment else 0.0
        if goodput:  # ties (the goodput is known to ±rel_tol) go to the higher attainment, then the cheaper
            return (meets, s.goodput_rps_per_gpu or 0.0, attained, cost)
        return (meets, attained, cost)

    # -- the stages ---------------------------------------------------------------------------------

    def at_budget(self) -> Scored | None:
        budget = self.inputs.gpu_budget
        group = [
            x
            for st in structures(
                self.shape,
                self.inputs.allowed_gpus,
                budget,
                extra=self.extra,
                gpu_memory_utilization=self.gmu,
            )  # type: ignore[arg-type]
            for c in coarse(st)
            if (x := self.consider(c))
        ]
        self.say(f"at {budget} GPUs: {len(group)} candidates after the capacity bound")
        self.run_bounded(group)
        self.refine(group, goodput=True)
        done = [s for s in group if s.slice_run]
        return max(done, key=lambda s: self._rank(s, True)) if done else None

    def least(self) -> Scored | None:
        budget = self.inputs.gpu_budget
        lo = min_gpus(self.shape, self.inputs.allowed_gpus, self.gmu) or budget
        counts = sorted(
            (
                (n * (self.inputs.prices.gpu_price(_gpu_name(g)) or 1.0), n, g)
                for g in self.inputs.allowed_gpus
                for n in range(lo, budget)
            ),  # type: ignore[arg-type]
        )
        for _, n, gpu in counts:
            group = [
                x
                for st in structures(self.shape, [gpu], n, extra=self.extra, gpu_memory_utilization=self.gmu)
                for c in coarse(st)
                if (x := self.consider(c))
            ]
            if not group:
                continue
            self.say(f"at {n} {gpu}: {len(group)} candidates after the capacity bound")
            self.run(group, goodput=False)
            meeting = [s for s in group if s.slice_run.at_load.meets(self.slo.target)]  # type: ignore[union-attr]
            if meeting:
                # the goodput of those that meet the SLOs ranks them; dominance only within this GPU count
                saved, self.best_goodput = self.best_goodput, 0.0
                self.run(meeting, goodput=True)
                self.refine(group, goodput=True)
                self.best_goodput = saved
                return max((s for s in group if s.slice_run), key=lambda s: self._rank(s, True))
        return None

    def current(self) -> Scored:
        layout = self.inputs.current_layout
        sc = Scored(None, self.inputs.current, layout.gpus, layout.gpu, layout.mode)  # type: ignore[union-attr]
        sc.bound = layout_bound(layout, self.shape, self.workload, self.slo.tpot_s, self.slo.ttft_s)  # type: ignore[arg-type]
        self.keys.add(same_key(layout))  # type: ignore[arg-type]
        self.run([sc], goodput=True)
        return sc

    def hour(self, items: list[Scored]) -> None:
        items = [s for s in items if s.hour is None]
        args = [
            (
                s.layout,
                self.shape,
                self.inputs.trace,
                self.slo,
                self.inputs.prices,
                self.inputs.dispatch_delay_s,
            )
            for s in items
        ]
        for s, ev in zip(items, _map(_hour, args, self.opt.workers), strict=True):
            s.hour, s.stage = ev, "hour"
            self.sims += 1


def _gpu_name(key: str) -> str:
    from serving.devices.gpu_specs import gpu_spec

    return gpu_spec(key).name


def search(
    inputs: RecommendInputs,
    options: SearchOptions | None = None,
    progress: Callable[[str], None] | None = None,
) -> SearchResult:
    """Run the staged search (module docstring) on checked ``inputs``."""
    opt = options or SearchOptions()
    t0 = time.perf_counter()
    s = _Search(inputs, opt, progress)
    target = inputs.slo.target
    sl = s.slice
    slice_desc = (
        f"the busiest {len(sl)} requests of {len(inputs.trace):,} ({sl[-1].arrival_s:.0f} s at "
        f"{(len(sl) - 1) / sl[-1].arrival_s:.2f} req/s; the trace's mean {s.workload.rate_rps:.2f} req/s)"
    )
    s.say(f"search slice: {slice_desc}")
    current = s.current()
    same = s.at_budget()
    least = s.least()
    # the hour: the current layout and the finalists; a finalist missing the SLOs gives way to the next
    ranked = sorted(
        (x for x in s.scored.values() if x.slice_run and x.gpus == inputs.gpu_budget),
        key=lambda x: s._rank(x, True),
        reverse=True,
    )
    first = [current] + [x for x in (same, least) if x is not None and x is not current]
    s.say(f"the whole trace on {len(first)} layouts")
    s.hour(first)
    runs = len(first)
    while same is not None and not same.hour.meets(target) and runs < opt.max_hour_runs:  # type: ignore[union-attr]
        nxt = next((x for x in ranked if x.hour is None and x.slice_run.at_load.meets(target)), None)  # type: ignore[union-attr]
        if nxt is None:
            break
        s.hour([nxt])
        runs += 1
        if nxt.hour.meets(target):  # type: ignore[union-attr]
            same = nxt
    if least is not None and least.hour is not None and not least.hour.meets(target):
        least = None
    if least is None and same is not None and same.hour is not None and same.hour.meets(target):
        least = same
    if least is not None and least.slice_run is not None and least.slice_run.goodput is None:
        s.run([least], goodput=True)
    out = SearchResult(
        current=current,
        same_budget=same,
        least_budget=least,
        scored=list(s.scored.values()),
        slice_desc=slice_desc,
        sims=s.sims,
        wall_s=time.perf_counter() - t0,
    )
    out.notes.append(
        "approximations: candidates are screened on the trace's busiest slice (its peak rate; its queueing "
        "is a window's), goodput is that slice's mix scaled in rate (±10 %), settings are searched one knob "
        "at a time from the coarse best; only the finalists run the whole trace"
    )
    return out
