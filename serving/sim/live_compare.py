"""The simulator against the live serving stack, the parts tests and bench/sim_vs_live.py share:
replay a trace on a live ``phaselens serve`` and collect what it left (:func:`run_live`), simulate the
same requests (:class:`~serving.sim.simulator.Simulation`) and compare the figures
(:func:`compare_emulated`: the paced emulated GPU, a plumbing check of everything around the GPU
model; :func:`compare_fitted`: a cpu device model fitted on one live run). bench/sim_vs_live.py runs
the cases at size (its docstring has the method; figures in docs/BENCHMARKS.md, "sim_vs_live");
tests/serving/sim/test_vs_live.py runs them small.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from serving.config import preset
from serving.devices.gpu_specs import gpu_spec
from serving.loadgen import LoadReport, run_load
from serving.sim.device_model import (
    FittedDeviceModel,
    back_to_back_gaps_s,
    iteration_events,
    measured_dispatch_delay_s,
)
from serving.sim.layout import parse_layout
from serving.sim.samples import CumulativeCounters
from serving.sim.simulator import SimResult, Simulation
from serving.telemetry import TelemetryReader
from serving.trace import TraceRequest, poisson_trace

EMULATED_GPU, EMULATED_SHAPE = "h200", "llama-3.1-70b"
# 70B bf16 (141.1 GB) fits one H200 (150.8 GB) only above the default 0.9 memory utilization
ENGINE_OPTIONS = "max_num_seqs=64:max_num_batched_tokens=4096:chunked_prefill=off"  # serve's defaults
LABELS = {
    "ttft_p50_s": ("TTFT p50 (ms)", 1e3),
    "ttft_p90_s": ("TTFT p90 (ms)", 1e3),
    "itl_p50_s": ("ITL p50 (ms)", 1e3),
    "itl_p90_s": ("ITL p90 (ms)", 1e3),
    "output_tokens_per_s": ("output tok/s", 1.0),
    "energy_j": ("GPU energy (J)", 1.0),
}
FIGURES = ("ttft_p50_s", "ttft_p90_s", "itl_p50_s", "itl_p90_s", "output_tokens_per_s")


# ------------------------------------------------------------------------------------------ live side


@dataclass
class LiveRun:
    """What a live run left: the router's request events, the workers' iteration events, and the
    devices' samples just before the first request and just after the last."""

    report: LoadReport
    requests: list[dict[str, Any]]
    iterations: list[dict[str, Any]]
    before: dict[str, dict[str, Any]]  # worker -> GET /v1/devices item
    after: dict[str, dict[str, Any]]
    engine: dict[str, Any] = field(default_factory=dict)  # worker-0's resolved EngineConfig

    @property
    def ok(self) -> bool:
        return self.report.n_failed == 0 and len(self.requests) == self.report.n_ok > 0


def devices(url: str) -> dict[str, dict[str, Any]]:
    """``GET /v1/devices`` by worker."""
    body = httpx.get(f"{url}/v1/devices", timeout=30).json()
    return {d["worker"]: d for d in body["devices"]}


def fetch_telemetry(url: str, reader: TelemetryReader | None = None) -> list[dict[str, Any]]:
    """Every telemetry batch the router holds after ``reader``'s cursors (all, with a fresh reader)."""
    reader = reader or TelemetryReader()
    out: list[dict[str, Any]] = []
    while True:
        params = {"limit": 1000}
        if reader.cursors:
            params["after"] = reader.query_param()
        fresh = reader.accept(httpx.get(f"{url}/v1/telemetry", params=params, timeout=30).json())
        if not fresh:
            return out
        out.extend(fresh)


def run_live(url: str, trace: Sequence[TraceRequest], *, settle_s: float = 0.0) -> LiveRun:
    """Replay ``trace`` against ``url``; collect the telemetry it produced and the device samples
    around it. ``settle_s``: wait first (an emulated GPU falls back to true idle ~2 s after its
    last kernel, so the window starts from the state a simulated GPU starts in)."""
    reader = TelemetryReader()
    time.sleep(max(settle_s, 0.6))  # earlier runs' (warm-up's) last telemetry is flushed by then
    fetch_telemetry(url, reader)  # skip it
    before = devices(url)
    since = min(d["sample"]["ts_s"] for d in before.values())
    report = run_load(url, list(trace), progress=False)
    after = devices(url)
    time.sleep(0.6)  # the workers flush telemetry every 0.25 s
    batches = fetch_telemetry(url, reader)
    events = [ev for b in batches for ev in b["events"]]
    requests = sorted(
        (
            ev
            for ev in events
            if ev["type"] == "request" and ev["status"] == "ok" and ev["arrival_s"] >= since
        ),
        key=lambda e: e["arrival_s"],
    )
    its = [ev for ev in iteration_events(batches) if ev["start_s"] >= since]
    return LiveRun(report, requests, its, before, after)


def warm_up(url: str, n: int = 4) -> None:
    """A few requests so torch's first iterations (slow, unpaced) fall before the measured run."""
    run_load(url, poisson_trace(20.0, n, prompt_tokens=(32, 256), output_tokens=8, seed=99), progress=False)


def trace_from_live(run: LiveRun) -> tuple[list[TraceRequest], float]:
    """The requests the router saw, as a trace from 0 (its first arrival), and that arrival's epoch s."""
    t0 = run.requests[0]["arrival_s"]
    return [
        TraceRequest(ev["arrival_s"] - t0, ev["prompt_tokens"], ev["output_tokens"]) for ev in run.requests
    ], t0


def emulation_share(run: LiveRun) -> dict[str, float]:
    """Host-bound share of the run's emulated iterations: from the device counters (Δ over the run)
    and from the iteration events' ``lag_s``."""
    iters = lagged = 0
    lag_s = 0.0
    for wid, now in run.after.items():
        was = run.before.get(wid, {}).get("emulation") or {}
        emu = now.get("emulation") or {}
        iters += emu.get("iterations", 0) - was.get("iterations", 0)
        lagged += emu.get("lagged_iterations", 0) - was.get("lagged_iterations", 0)
        lag_s += (emu.get("lag_s_total") or 0.0) - (was.get("lag_s_total") or 0.0)
    ev_lag = [ev.get("lag_s") or 0.0 for ev in run.iterations]
    modeled = sum(ev.get("modeled_s") or 0.0 for ev in run.iterations)
    return {
        "iterations": iters,
        "lagged_iterations": lagged,
        "host_bound_share": lagged / iters if iters else float("nan"),
        "lag_s": lag_s,
        "lag_share_of_modeled": (sum(ev_lag) / modeled) if modeled else float("nan"),
        "event_lagged": sum(1 for x in ev_lag if x > 0),
    }


def live_energy_j(run: LiveRun) -> tuple[float, float, float]:
    """(energy J summed over the workers' devices, window start, window end epoch s) between the
    samples taken before and after the run."""
    energy = 0.0
    t_start = min(d["sample"]["ts_s"] for d in run.before.values())
    t_end = max(d["sample"]["ts_s"] for d in run.after.values())
    for wid, now in run.after.items():
        energy += (now["sample"]["energy_mj"] - run.before[wid]["sample"]["energy_mj"]) / 1000.0
    return energy, t_start, t_end


# ------------------------------------------------------------------------------------------ figures


def latency_figures(request_events: Sequence[dict[str, Any]]) -> dict[str, float]:
    """TTFT and ITL p50/p90, output tokens/s over first arrival → last finish (live or simulated)."""
    ok = [ev for ev in request_events if ev["status"] == "ok" and ev["token_ts_s"]]
    ttft = np.asarray([ev["token_ts_s"][0] - ev["arrival_s"] for ev in ok])
    itl = np.concatenate(
        [np.diff(ev["token_ts_s"]) for ev in ok if len(ev["token_ts_s"]) > 1] or [np.zeros(0)]
    )
    span = max(ev["finish_s"] for ev in ok) - min(ev["arrival_s"] for ev in ok)
    out_tokens = sum(len(ev["token_ts_s"]) for ev in ok)
    return {
        "ttft_p50_s": float(np.percentile(ttft, 50)),
        "ttft_p90_s": float(np.percentile(ttft, 90)),
        "itl_p50_s": float(np.percentile(itl, 50)) if len(itl) else float("nan"),
        "itl_p90_s": float(np.percentile(itl, 90)) if len(itl) else float("nan"),
        "output_tokens_per_s": out_tokens / span if span > 0 else float("nan"),
        "requests": float(len(ok)),
        "output_tokens": float(out_tokens),
    }


def sim_request_events(result: SimResult) -> list[dict[str, Any]]:
    return [ev for b in result.batches for ev in b["events"] if ev["type"] == "request"]


def sim_energy_j(result: SimResult, t_from_s: float, t_to_s: float) -> float:
    """The simulated GPUs' energy from virtual ``t_from_s`` to ``t_to_s`` (seconds from the first
    arrival; before 0 the GPU is at true idle, after the last iteration the gap model applies)."""
    spec = gpu_spec(result.layout.gpu)
    energy = 0.0
    for replica in result.replicas:
        locked = replica.pool.sm_clock_mhz
        cum = CumulativeCounters(replica.intervals, spec, locked[1] if locked else None)
        hi = float(cum.at(np.asarray([max(0.0, t_to_s)]))["energy"][0])
        lo = float(cum.at(np.asarray([max(0.0, t_from_s)]))["energy"][0])
        idle_before = spec.idle_w * max(0.0, -t_from_s)
        energy += (hi - lo + idle_before) * len(replica.gpus)
    return energy


def rel_error(sim: float, live: float) -> float:
    return (sim - live) / live if live else float("nan")


@dataclass
class Comparison:
    """One case: the live and simulated figures and their relative errors (sim − live) / live."""

    label: str
    live: dict[str, float]
    sim: dict[str, float]
    target: float
    notes: list[str] = field(default_factory=list)

    def errors(self) -> dict[str, float]:
        return {
            k: rel_error(self.sim[k], self.live[k])
            for k in self.live
            if k in self.sim and k in (*FIGURES, "energy_j")
        }

    def worst(self) -> float:
        return max(abs(e) for e in self.errors().values())

    def met(self) -> bool:
        return self.worst() <= self.target

    def table(self) -> str:
        lines = [f"{self.label}  (target |error| <= {self.target:.0%})"]
        lines.append(f"  {'figure':<22}{'live':>12}{'simulated':>12}{'error':>9}")
        for k, err in self.errors().items():
            name, scale = LABELS[k]
            lines.append(f"  {name:<22}{self.live[k] * scale:>12.2f}{self.sim[k] * scale:>12.2f}{err:>+9.1%}")
        lines += [f"  {n}" for n in self.notes]
        lines.append(f"  worst |error| {self.worst():.1%}: {'MET' if self.met() else 'NOT MET'}")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------ cases


def _simulate(layout: str, shape: str, run: LiveRun, **kw: Any) -> tuple[SimResult, dict[str, float]]:
    trace, t0 = trace_from_live(run)
    result = Simulation(parse_layout(layout), preset(shape), trace, start_s=t0, **kw).run()
    return result, latency_figures(sim_request_events(result))


def _ttft_note(live: dict[str, float], sim: dict[str, float], what: str) -> str:
    return (
        f"{what}: TTFT p50 {sim['ttft_p50_s'] * 1e3:.2f} ms ({rel_error(sim['ttft_p50_s'], live['ttft_p50_s']):+.1%}), "
        f"p90 {sim['ttft_p90_s'] * 1e3:.2f} ms ({rel_error(sim['ttft_p90_s'], live['ttft_p90_s']):+.1%})"
    )


def compare_emulated(
    run: LiveRun, kv_blocks: int, *, label: str, mode: str = "agg:1x", dispatch_s: float | None = None
) -> Comparison:
    """Case (a): simulate ``run``'s requests on the matching emulated layout; compare.

    ``dispatch_s``: the front end's dispatch delay (default: measured on ``run``'s idle arrivals).
    """
    layout = f"{mode}{EMULATED_GPU}:{ENGINE_OPTIONS}:kv_blocks={kv_blocks}:gpu_memory_utilization=0.96"
    if dispatch_s is None:
        dispatch_s = measured_dispatch_delay_s(run.requests, run.iterations) or 0.0
    result, sim = _simulate(layout, EMULATED_SHAPE, run, dispatch_delay_s=dispatch_s)
    _, bare = _simulate(layout, EMULATED_SHAPE, run)
    live = latency_figures(run.requests)
    t0 = run.requests[0]["arrival_s"]
    live_e, w0, w1 = live_energy_j(run)
    live["energy_j"], sim["energy_j"] = live_e, sim_energy_j(result, w0 - t0, w1 - t0)
    share = emulation_share(run)
    notes = [
        f"layout {layout}; dispatch delay {dispatch_s * 1e3:.2f} ms (router → worker, measured on this "
        "run's requests that found the engine idle)",
        _ttft_note(live, bare, "without the dispatch delay (GPU model only)"),
        f"requests {int(live['requests'])} live / {int(sim['requests'])} simulated, output tokens "
        f"{int(live['output_tokens'])} / {int(sim['output_tokens'])}; iterations {len(run.iterations)} "
        f"live / {result.iterations} simulated; energy window {w1 - w0:.2f} s",
        f"host-bound (lagged) iterations: {share['lagged_iterations']}/{share['iterations']} = "
        f"{share['host_bound_share']:.1%}; lag {share['lag_s'] * 1e3:.1f} ms = "
        f"{share['lag_share_of_modeled']:.2%} of the modeled time",
        f"live loop time between paced iterations (median end → next start): {between_s(run) * 1e3:.2f} ms",
    ]
    return Comparison(label, live, sim, 0.10, notes)


def between_s(run: LiveRun) -> float:
    """Median gap from an iteration's end to the next one's start on the same worker (< 5 ms)."""
    by: dict[str, list[tuple[float, float]]] = {}
    for ev in run.iterations:
        by.setdefault(ev["worker"], []).append((ev["start_s"], ev["end_s"]))
    gaps = back_to_back_gaps_s(by.values())
    return float(np.median(gaps)) if gaps else float("nan")


def compare_fitted(
    model: FittedDeviceModel,
    run: LiveRun,
    kv_blocks: int,
    *,
    label: str,
    dispatch_s: float,
    replicas: int = 1,
) -> Comparison:
    """Case (b): simulate ``run``'s requests with the fitted cpu model; compare latency figures."""
    layout = f"agg:{replicas}xh200:{ENGINE_OPTIONS}:kv_blocks={kv_blocks}"
    result, sim = _simulate(
        layout, "tiny", run, iteration_model=model.jittered(0), dispatch_delay_s=dispatch_s
    )
    _, mean = _simulate(layout, "tiny", run, iteration_model=model, dispatch_delay_s=dispatch_s)
    live = latency_figures(run.requests)
    notes = [
        f"simulated with the fit plus resampled calibration residuals (seed 0); dispatch delay "
        f"{dispatch_s * 1e3:.2f} ms (from the calibration run)",
        "the fit without residuals: "
        + ", ".join(f"{LABELS[k][0]} {rel_error(mean[k], live[k]):+.1%}" for k in FIGURES),
        f"requests {int(live['requests'])}, output tokens {int(live['output_tokens'])} / "
        f"{int(sim['output_tokens'])}; iterations {len(run.iterations)} live / {result.iterations} simulated; "
        f"mean live iteration {np.mean([e['end_s'] - e['start_s'] for e in run.iterations]) * 1e3:.2f} ms, "
        f"mean batch {np.mean([e['batch_size'] for e in run.iterations]):.1f}",
    ]
    return Comparison(label, live, sim, 0.15, notes)


def serve_args_emulated(workers: int = 1, *, disaggregated: bool = False) -> list[str]:
    layout = (
        ["--mode", "disaggregated"] if disaggregated else ["--mode", "aggregated", "--workers", str(workers)]
    )
    return [
        *layout,
        "--device",
        f"emulated:{EMULATED_GPU}",
        "--emulate-shape",
        EMULATED_SHAPE,
    ]


def kv_blocks_of(url: str, timeout_s: float = 5.0) -> int:
    """The live engine's KV block count, from its iteration events (call after a warm-up; the
    workers flush telemetry every 0.25 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for ev in iteration_events(fetch_telemetry(url)):
            return int(ev["kv_blocks_total"])
        if time.monotonic() > deadline:
            raise RuntimeError(f"no iteration event within {timeout_s:g} s: warm the server up first")
        time.sleep(0.25)


def host_jitter_note(run: LiveRun) -> str:
    """How far the live emulated iterations ran past their modeled time: pacing overshoot
    (end − start − modeled, the sleep waking late) and the loop gap before the next iteration."""
    over = np.asarray([ev["end_s"] - ev["start_s"] - (ev.get("modeled_s") or 0.0) for ev in run.iterations])
    by: dict[str, list[tuple[float, float]]] = {}
    for ev in run.iterations:
        by.setdefault(ev["worker"], []).append((ev["start_s"], ev["end_s"]))
    gaps = np.asarray(back_to_back_gaps_s(by.values(), back_to_back_s=0.05))
    p = lambda x, q: float(np.percentile(x, q)) * 1e3 if len(x) else float("nan")  # noqa: E731
    return (
        f"live host time beyond the modeled iteration: pacing overshoot p50 {p(over, 50):.2f} / p90 "
        f"{p(over, 90):.2f} ms, loop gap to the next iteration p50 {p(gaps, 50):.2f} / p90 {p(gaps, 90):.2f} ms "
        "(the simulator has neither: they are this host's, not the GPU model's)"
    )


def poisson(rate: float, n: int, seed: int) -> list[TraceRequest]:
    return poisson_trace(rate, n, prompt_tokens=(32, 384), output_tokens=(16, 64), seed=seed)


def device_model_check(model: FittedDeviceModel, run: LiveRun) -> str:
    """The fitted model on a run's own iterations (no scheduling feedback): Σ predicted vs Σ measured
    iteration time, and the median per-iteration error."""
    meas = np.asarray([ev["end_s"] - ev["start_s"] for ev in run.iterations])
    pred = np.asarray(
        [
            model.iteration_s(ev["prefill_tokens"], ev["decode_seqs"], ev["context_tokens"], ev["batch_size"])
            for ev in run.iterations
        ]
    )
    return (
        f"device model on this run's {len(meas)} iterations: Σ predicted {pred.sum():.3f} s vs Σ measured "
        f"{meas.sum():.3f} s ({rel_error(pred.sum(), meas.sum()):+.1%}); median |error| per iteration "
        f"{np.median(np.abs(pred - meas) / meas):.1%}"
    )


def drift_note(calib: LiveRun, other: LiveRun) -> str:
    """The same work in two runs: median duration of decode-only iterations per batch size, ratio."""
    parts = []
    for lo, hi in ((1, 1), (2, 3), (4, 7), (8, 15)):

        def med(run: LiveRun, lo: int = lo, hi: int = hi) -> float | None:
            d = [
                ev["end_s"] - ev["start_s"]
                for ev in run.iterations
                if ev["phase"] == "decode" and lo <= ev["batch_size"] <= hi
            ]
            return float(np.median(d)) if len(d) >= 5 else None

        a, b = med(calib), med(other)
        if a and b:
            parts.append(f"batch {lo}-{hi}: {a * 1e3:.2f} → {b * 1e3:.2f} ms ({b / a - 1:+.0%})")
    return "same work, calibration run → this run (decode-only iterations, median): " + (
        "; ".join(parts) or "none in common"
    )
