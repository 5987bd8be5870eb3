"""Emulation overhead and pacing accuracy: emulated decode on the ``tiny`` model, several worker processes.

Each worker is a real process (``multiprocessing`` spawn, ``torch.set_num_threads(1)``) that builds
``serving.engine.Engine`` with the ``tiny`` model (``serving.weights.load_model("tiny")``, fp32 on the
host CPU) on ``open_device("emulated:<gpu>", model_shape=preset(<shape>))``, queues ``--batch``
requests of ``--prompt`` tokens, runs their prefill, then times ``--iters`` decode iterations of the
whole batch (after ``--warmup`` untimed ones). The workers start decoding together (a barrier).

Per decode iteration it records

* ``step``: the wall time of ``engine.step()`` (start to end, ``time.perf_counter``);
* ``window``: the part the device paces -- from the engine's ``started_s`` to the return of
  ``device.on_iteration`` (wraps ``on_iteration``; excludes scheduling before and bookkeeping after);
* ``modeled``: the device's prediction for that iteration (``device.last_estimate.time_s``, the same
  ``predict_iteration`` under the device's knobs that ``on_iteration`` paced to);
* ``compute``: the host's own forward + sample time (the ``elapsed_s`` the engine passes);
* lag: the device's ``stats().lagged_iterations`` over the timed iterations (host overran the model).

Pacing error = ``|actual - modeled| / modeled``, reported for ``step`` (the whole step: the verdict
against the 5 % p99 target) and for ``window`` (what the device controls), p50 / p90 / p99 over all
workers' iterations, and for ``window`` over the non-lagged iterations only (the sleep-and-spin accuracy
itself). The same loop with ``pace=False`` runs first as the baseline: the CPU time per step that
pacing has to hide.

    python bench/emulation_overhead.py [--workers 2] [--batch 32] [--iters 300] [--gpu h100-sxm]
        [--shape llama-3.1-8b] [--prompt 128] [--profile vllm] [--json out.json]
    python bench/emulation_overhead.py --model-cost   # microseconds per predict_iteration call

``--model-cost`` times the pure model instead (``serving.devices.predict_iteration``, best of 5 runs
of 20,000 calls): decode and prefill, TP 1 and 4, unlocked, locked clock, and a binding power cap
(the only case that searches the clock).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import time
from typing import Any

TARGET_P99_PCT = 5.0


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100)."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _worker(idx: int, opts: dict[str, Any], pace: bool, barrier: Any, out: Any) -> None:
    """One worker process: prefill ``batch`` requests, then time ``iters`` decode iterations."""
    import torch

    torch.set_num_threads(1)
    from serving.config import EngineConfig, SamplingParams, preset
    from serving.devices import open_device
    from serving.engine import Engine
    from serving.weights import load_model

    model, _cfg = load_model("tiny", seed=idx)
    dev = open_device(
        f"emulated:{opts['gpu']}", model_shape=preset(opts["shape"]), pace=pace, profile=opts["profile"]
    )
    batch, prompt, iters, warmup = opts["batch"], opts["prompt"], opts["iters"], opts["warmup"]
    engine = Engine(
        model,
        EngineConfig(
            kv_cache_bytes=512 * 2**20,
            max_num_seqs=batch,
            max_num_batched_tokens=max(4096, prompt),
        ),
        dev,
        worker_id=f"w{idx}",
    )
    # (window s, modeled s, compute s, lagged) per on_iteration
    windows: list[tuple[float, float, float, bool]] = []
    inner = dev.on_iteration

    def on_iteration(work: Any, started_s: float, elapsed_s: float) -> float:
        lagged_before = dev.stats().lagged_iterations
        slept = inner(work, started_s, elapsed_s)
        end = time.time()
        est = dev.last_estimate
        lagged = dev.stats().lagged_iterations > lagged_before
        windows.append((end - started_s, est.time_s if est else float("nan"), elapsed_s, lagged))
        return slept

    dev.on_iteration = on_iteration  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=warmup + iters + 8, ignore_eos=True)
    for i in range(batch):
        ids = [(7 * i + 13 * j) % 256 for j in range(prompt)]
        engine.add_request(f"w{idx}-r{i}", ids, params)
    while engine.scheduler.waiting or any(s.in_prefill for s in engine.scheduler.running):
        engine.step()
    for _ in range(warmup):
        engine.step()
    barrier.wait()
    windows.clear()
    before = dev.stats()
    steps: list[float] = []
    t0 = time.perf_counter()
    for _ in range(iters):
        s = time.perf_counter()
        result = engine.step()
        steps.append(time.perf_counter() - s)
        if result.phase != "decode":
            raise RuntimeError(f"iteration was {result.phase!r}, not a pure decode")
    wall = time.perf_counter() - t0
    after = dev.stats()
    out.put(
        {
            "worker": idx,
            "pace": pace,
            "steps_s": steps,
            "window_s": [w[0] for w in windows],
            "modeled_s": [w[1] for w in windows],
            "compute_s": [w[2] for w in windows],
            "lagged_flags": [w[3] for w in windows],
            "iterations": after.iterations - before.iterations,
            "lagged": after.lagged_iterations - before.lagged_iterations,
            "lag_s_total": after.lag_s_total - before.lag_s_total,
            "wall_s": wall,
        }
    )


def run_phase(opts: dict[str, Any], pace: bool) -> dict[str, Any]:
    """Run ``opts['workers']`` worker processes together; collect and summarise their iterations."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(opts["workers"])
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(i, opts, pace, barrier, out)) for i in range(opts["workers"])]
    load_before = os.getloadavg()
    for p in procs:
        p.start()
    results = [out.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        if p.exitcode != 0:
            raise RuntimeError(f"worker process {p.pid} exited with {p.exitcode}")
    load_after = os.getloadavg()
    results.sort(key=lambda r: r["worker"])
    steps = [s for r in results for s in r["steps_s"]]
    windows = [s for r in results for s in r["window_s"]]
    modeled = [s for r in results for s in r["modeled_s"]]
    compute = [s for r in results for s in r["compute_s"]]
    flags = [f for r in results for f in r["lagged_flags"]]
    step_err = [abs(a - m) / m * 100.0 for a, m in zip(steps, modeled, strict=True)]
    win_err = [abs(a - m) / m * 100.0 for a, m in zip(windows, modeled, strict=True)]
    paced_err = [e for e, lagged in zip(win_err, flags, strict=True) if not lagged]
    iterations = sum(r["iterations"] for r in results)
    lagged = sum(r["lagged"] for r in results)

    def pct(xs: list[float]) -> dict[str, float]:
        return {f"p{q}": round(_percentile(xs, q), 3) for q in (50, 90, 99)}

    return {
        "pace": pace,
        "workers": len(results),
        "iterations": iterations,
        "lagged_iterations": lagged,
        "lagged_fraction": lagged / iterations if iterations else 0.0,
        "lag_ms_total": round(sum(r["lag_s_total"] for r in results) * 1e3, 3),
        "step_error_pct": pct(step_err),
        "window_error_pct": pct(win_err),
        "paced_only_window_error_pct": pct(paced_err),
        "paced_only_iterations": len(paced_err),
        "modeled_step_ms": {"median": round(statistics.median(modeled) * 1e3, 3), **_ms(pct, modeled)},
        "actual_step_ms": {"median": round(statistics.median(steps) * 1e3, 3), **_ms(pct, steps)},
        "window_ms": {"median": round(statistics.median(windows) * 1e3, 3), **_ms(pct, windows)},
        "cpu_compute_ms": {"median": round(statistics.median(compute) * 1e3, 3), **_ms(pct, compute)},
        "host_outside_window_ms_median": round(
            statistics.median(s - w for s, w in zip(steps, windows, strict=True)) * 1e3, 3
        ),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "per_worker_wall_s": [round(r["wall_s"], 3) for r in results],
    }


def _ms(pct: Any, xs_s: list[float]) -> dict[str, float]:
    return pct([x * 1e3 for x in xs_s])


def report(opts: dict[str, Any], base: dict[str, Any], paced: dict[str, Any]) -> str:
    p99 = paced["step_error_pct"]["p99"]
    verdict = "MET" if p99 < TARGET_P99_PCT else "NOT MET"
    lines = [
        f"emulated decode: {opts['workers']} workers x batch {opts['batch']}, prompt {opts['prompt']}, "
        f"{opts['iters']} timed iterations each; host model tiny (fp32, 1 thread), modeled "
        f"{opts['shape']} bf16 on {opts['gpu']}; {os.cpu_count()} CPUs",
        "",
        "| | baseline (pace=False) | paced |",
        "|---|---|---|",
        f"| iterations (all workers) | {base['iterations']} | {paced['iterations']} |",
        f"| lagged fraction (paced: host overran the model; baseline: host behind the modeled queue) | "
        f"{base['lagged_fraction']:.3f} | "
        f"{paced['lagged_fraction']:.3f} ({paced['lagged_iterations']}, {paced['lag_ms_total']:.1f} ms total) |",
        f"| modeled step ms (median) | {base['modeled_step_ms']['median']:.3f} | "
        f"{paced['modeled_step_ms']['median']:.3f} |",
        f"| actual step ms p50 / p90 / p99 | {_trio(base['actual_step_ms'])} | {_trio(paced['actual_step_ms'])} |",
        f"| paced window ms p50 / p90 / p99 | {_trio(base['window_ms'])} | {_trio(paced['window_ms'])} |",
        f"| CPU compute ms per step p50 / p90 / p99 | {_trio(base['cpu_compute_ms'])} | "
        f"{_trio(paced['cpu_compute_ms'])} |",
        f"| host time outside the paced window, ms (median) | {base['host_outside_window_ms_median']:.3f} | "
        f"{paced['host_outside_window_ms_median']:.3f} |",
        f"| pacing error, whole step, % p50 / p90 / p99 | — | {_trio(paced['step_error_pct'])} |",
        f"| pacing error, paced window, % p50 / p90 / p99 | — | {_trio(paced['window_error_pct'])} |",
        f"| pacing error, paced window, non-lagged iterations only ({paced['paced_only_iterations']}), "
        f"% p50 / p90 / p99 | — | {_trio(paced['paced_only_window_error_pct'])} |",
        f"| load average before / after (1 min) | {base['loadavg_before'][0]} / {base['loadavg_after'][0]} | "
        f"{paced['loadavg_before'][0]} / {paced['loadavg_after'][0]} |",
        "",
        f"target: p99 pacing error (whole step) < {TARGET_P99_PCT:g} % -> {verdict} (p99 {p99:.2f} %; "
        f"paced window p99 {paced['window_error_pct']['p99']:.2f} %)",
    ]
    return "\n".join(lines)


def _trio(d: dict[str, float]) -> str:
    return f"{d['p50']:.3f} / {d['p90']:.3f} / {d['p99']:.3f}"


def model_cost_us(calls: int = 20_000) -> dict[str, float]:
    """Microseconds per ``predict_iteration`` call (best of 5 runs of ``calls`` calls) by case."""
    import timeit

    from serving.config import preset
    from serving.devices import IterationWork, predict_iteration

    l8, l70 = preset("llama-3.1-8b"), preset("llama-3.1-70b")
    dec = IterationWork("decode", 0, 32, 32 * 1024, 32, attention_pairs=32 * 1024, sampled_seqs=32)
    pre = IterationWork("prefill", 4096, 0, 4096, 1, attention_pairs=4096 * 4097 // 2, sampled_seqs=1)
    cases = {
        "decode 8B, TP 1": lambda: predict_iteration("h100-sxm", l8, dec),
        "decode 70B, TP 4": lambda: predict_iteration("h100-sxm", l70, dec, tp=4),
        "prefill 8B 4096, TP 1": lambda: predict_iteration("h100-sxm", l8, pre),
        "decode 8B, clock locked 990 MHz": lambda: predict_iteration(
            "h100-sxm", l8, dec, sm_clock_range=(990, 990)
        ),
        "prefill 8B 4096, 350 W cap binds (clock search)": lambda: predict_iteration(
            "h100-sxm", l8, pre, power_limit_w=350
        ),
    }
    return {name: min(timeit.repeat(fn, number=calls, repeat=5)) / calls * 1e6 for name, fn in cases.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=5, help="untimed decode iterations before the timed ones")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens per request (decode context)")
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("--shape", default="llama-3.1-8b")
    ap.add_argument("--profile", default=None, help="engine profile of the emulated device (default: vllm)")
    ap.add_argument("--model-cost", action="store_true", help="only time predict_iteration (us per call)")
    ap.add_argument("--json", help="write the full results here")
    args = ap.parse_args(argv)
    if args.model_cost:
        for name, us in model_cost_us().items():
            print(f"{name}: {us:.1f} us/call")
        return
    opts = {
        k: getattr(args, k)
        for k in ("workers", "batch", "iters", "warmup", "prompt", "gpu", "shape", "profile")
    }
    base = run_phase(opts, pace=False)
    paced = run_phase(opts, pace=True)
    print(report(opts, base, paced))
    if args.json:
        env = {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}
        with open(args.json, "w") as f:
            json.dump({"options": opts, "env": env, "baseline": base, "paced": paced}, f, indent=1)


if __name__ == "__main__":
    main()
