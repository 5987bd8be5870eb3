"""The simulator against the live serving stack: the same requests, live and in virtual time.

(a) **Emulated GPU, paced — a plumbing check, not a validation of the GPU model.** The live emulated
device paces each iteration to the same ``predict_iteration`` the simulator uses, so (a) compares the
model with itself: what it checks is everything around the model (the router's admission and
routing, the scheduler and block manager live and simulated, token timing, telemetry, the device's
energy counters). Agreement here says nothing about how close the model is to a real GPU: that is
docs/FIDELITY.md (published figures, leave-one-out) and docs/gpu (this project's H200). A live ``phaselens serve`` on ``emulated:h200`` modeling
``llama-3.1-70b`` (its modeled iterations, ≥ 37 ms, are longer than this host's tiny-model CPU step,
so every iteration is paced to the GPU model: lag ≈ 0, shown) serves a Poisson workload; then
:class:`~serving.sim.simulator.Simulation` runs the requests the router saw (its arrival times, prompt
and output tokens) on the matching layout
(``agg:1xh200:max_num_seqs=64:max_num_batched_tokens=4096:chunked_prefill=off:kv_blocks=<the live
engine's>``). Compared: TTFT and ITL p50/p90, output throughput, and the GPU energy over the same
window (the live device's ``energy_mj`` delta between two ``GET /v1/devices`` samples vs the
simulated GPU's counters over the same span; the GPU sat at true idle before the first request in
both). Target: within 10 %.

(b) **Real CPU executor.** A ``cpu`` device model (:class:`~serving.sim.device_model.FittedDeviceModel`)
is fitted on one live ``--device cpu`` run's iteration telemetry (Poisson rate R1), then predicts a
run at another rate R2 (and, with ``--two-workers``, a 2-worker layout at R2: two worker processes
share this host's cores, which the model fitted on one worker does not know); the prediction is
measured live. Target: within 15 %.

With ``--pd``, (a) also runs 1P1D (one prefill, one decode worker). The simulated (b) figures use the
fit plus resampled calibration residuals (:meth:`FittedDeviceModel.jittered`); the plain fit's are
printed beside them. Every figure is printed: live, simulated, relative error, the host-bound
(lagged) share of the live emulated iterations, the host's load average, and the host time the live
stack adds outside the modeled iterations. Results: docs/BENCHMARKS.md, "sim_vs_live".

    PYTHONPATH=. .venv/bin/python bench/sim_vs_live.py                # (a) and (b), ~3 min on 2 cores
    PYTHONPATH=. .venv/bin/python bench/sim_vs_live.py --n 60 --rate 2 --r1 10 --r2 5 --two-workers --pd
    PYTHONPATH=. .venv/bin/python bench/sim_vs_live.py --only a --n 40
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from serving.sim.device_model import FittedDeviceModel, measured_dispatch_delay_s  # noqa: E402
from serving.sim.live_compare import (  # noqa: E402
    FIGURES,
    LABELS,
    Comparison,
    compare_emulated,
    compare_fitted,
    device_model_check,
    drift_note,
    host_jitter_note,
    kv_blocks_of,
    latency_figures,
    poisson,
    rel_error,
    run_live,
    serve_args_emulated,
    warm_up,
)
from serving.testing import start_server, stop_server  # noqa: E402


def case_a(n: int, rate: float, seed: int, repeats: int = 2, *, pd: bool = False) -> list[Comparison]:
    """Case (a): the same Poisson trace ``repeats`` times on one live emulated server (live-vs-live
    spread: the live stack's own repeatability), each compared with its simulation. ``pd``: 1P1D
    (one prefill and one decode worker, KV handed off over localhost TCP) instead of 1 worker."""
    server = start_server(*serve_args_emulated(disaggregated=pd))
    out = []
    try:
        warm_up(server.url)
        blocks = kv_blocks_of(server.url)
        runs = []
        for k in range(repeats):
            load = os.getloadavg()[0]
            run = run_live(server.url, poisson(rate, n, seed), settle_s=2.5)
            if not run.ok:
                raise RuntimeError(f"live run failed: {run.report.errors[:3]}")
            runs.append(run)
            c = compare_emulated(
                run,
                blocks,
                mode="1p1d:" if pd else "agg:1x",
                label=f"(a) plumbing check (the GPU model against itself): {'1P1D 2' if pd else 'agg 1'} x emulated H200 / llama-3.1-70b, Poisson {rate:g} req/s, {n} requests, "
                f"live run {k + 1}/{repeats}",
            )
            c.notes.append(f"host load average (1 min) before the run: {load:.2f} on {os.cpu_count()} cores")
            c.notes.append(host_jitter_note(run))
            out.append(c)
        if len(runs) > 1:
            first, second = (latency_figures(r.requests) for r in runs[:2])
            spread = ", ".join(
                f"{LABELS[k][0]} {rel_error(second[k], first[k]):+.1%}" for k in FIGURES if k in first
            )
            out[-1].notes.append(f"live run 2 vs live run 1 (same trace): {spread}")
    finally:
        stop_server(server)
    return out


def case_b(
    n: int, rate1: float, rate2: float, seed: int, two_workers: bool
) -> tuple[FittedDeviceModel, list[Comparison]]:
    """Case (b): fit a cpu device model on a live run at ``rate1``, predict runs at ``rate2``."""
    out = []
    server = start_server("--mode", "aggregated", "--workers", "1", "--device", "cpu")
    try:
        warm_up(server.url)
        blocks = kv_blocks_of(server.url)
        load1 = os.getloadavg()[0]
        calib = run_live(server.url, poisson(rate1, n, seed))
        model = FittedDeviceModel.fit(calib.iterations)
        dispatch = measured_dispatch_delay_s(calib.requests, calib.iterations) or 0.0
        c = compare_fitted(
            model,
            calib,
            blocks,
            dispatch_s=dispatch,
            label=f"(b) cpu 1 worker, calibration run R1={rate1:g} req/s (in-sample)",
        )
        c.notes.append(f"host load average before the run: {load1:.2f} on {os.cpu_count()} cores")
        out.append(c)
        load2 = os.getloadavg()[0]
        held = run_live(server.url, poisson(rate2, n, seed + 1))
        c = compare_fitted(
            model,
            held,
            blocks,
            dispatch_s=dispatch,
            label=f"(b) cpu 1 worker, predicted R2={rate2:g} req/s (held out)",
        )
        c.notes += [
            f"host load average before the run: {load2:.2f} on {os.cpu_count()} cores",
            device_model_check(model, held),
            drift_note(calib, held),
        ]
        out.append(c)
    finally:
        stop_server(server)
    if two_workers:
        server = start_server("--mode", "aggregated", "--workers", "2", "--device", "cpu")
        try:
            warm_up(server.url)
            run = run_live(server.url, poisson(rate2, n, seed + 2))
            c = compare_fitted(
                model,
                run,
                blocks,
                replicas=2,
                dispatch_s=dispatch,
                label=f"(b) cpu 2 workers (2 processes on the 2 shared cores), predicted R2={rate2:g} req/s",
            )
            c.notes.append(device_model_check(model, run))
            out.append(c)
        finally:
            stop_server(server)
    return model, out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=("a", "b"), default=None)
    p.add_argument("--n", type=int, default=32, help="requests per run (32)")
    p.add_argument("--rate", type=float, default=2.0, help="(a): Poisson req/s (2)")
    p.add_argument("--r1", type=float, default=2.0, help="(b): calibration rate, req/s (2)")
    p.add_argument("--r2", type=float, default=5.0, help="(b): predicted rate, req/s (5)")
    p.add_argument("--two-workers", action="store_true", help="(b): also predict a 2-worker layout")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2, help="(a): live runs of the same trace (2)")
    p.add_argument("--pd", action="store_true", help="(a): also a 1P1D layout (one run)")
    args = p.parse_args(argv)
    print(f"sim_vs_live  {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC")
    if args.only in (None, "a"):
        for c in case_a(args.n, args.rate, args.seed, args.repeats):
            print(c.table(), flush=True)
        if args.pd:
            for c in case_a(args.n, args.rate, args.seed, 1, pd=True):
                print(c.table(), flush=True)
    if args.only in (None, "b"):
        model, comps = case_b(args.n, args.r1, args.r2, args.seed, args.two_workers)
        print(model.describe())
        for c in comps:
            print(c.table(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
