"""Overload: 429 rate, goodput and latency at 1x and 2x the sustainable rate, on a live emulated stack.

Starts ``phaselens serve`` (``serving.testing.start_server``, as ``bench/sim_vs_live.py`` does):
one aggregated worker on ``emulated:h100-sxm`` modeling ``llama-3.1-70b`` (decode iterations paced to
the modeled GPU time), ``--max-num-seqs`` 32, the default admission bound (one batch: 32 waiting).
Every request has a ~64-token prompt and 64 output tokens (``ignore_eos``, greedy), sent
non-streaming so that the client stays light on a shared host; latency is the client's end-to-end
time. Then, in one run:

1. **unloaded**: three requests one at a time: their median end-to-end latency; the SLO is
   end-to-end latency <= ``--slo-factor`` (3) x that.
2. **sustainable rate**: a closed loop of ``max_num_seqs`` clients, each sending its next request as
   soon as the last one is answered, for ``--calib-s`` seconds: the rate they sustain, by Little's
   law ``max_num_seqs`` / mean end-to-end latency (the first round left out).
3. **1x and 2x**: open-loop Poisson arrivals at 1x and 2x that rate for ``--seconds`` each (seeded):
   offered rate, the share answered 429, goodput (requests answered 200 within the SLO, per second
   from the first request sent to the last answer: the queue's drain after the window counts), p50 / p99 end-to-end latency of the admitted (200) requests, any other
   failures, and the share of emulated iterations the host could not pace (host-bound).

Figures are **emulated** (a modeled H100 GPU; the model math on this host's CPU), host-bound where
that share is not ~0.

    PYTHONPATH=. .venv/bin/python bench/overload.py [--seconds 30] [--calib-s 15] [--slo-factor 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from serving.devices.cpu import cpu_model_name  # noqa: E402
from serving.loadgen import emulation_during, fetch_emulation, percentile, synthetic_prompt  # noqa: E402
from serving.testing import start_server, stop_server  # noqa: E402

EMULATED = ("--device", "emulated:h100-sxm", "--emulate-shape", "llama-3.1-70b", "--max-model-len", "512")
PROMPT_CHARS, OUTPUT_TOKENS = 63, 64  # 64 prompt tokens with BOS


@dataclass(slots=True)
class Outcome:
    status: int | None  # HTTP status; None: no answer (timeout, connection error)
    e2e_s: float


@dataclass(slots=True)
class Phase:
    name: str
    offered_rps: float
    window_s: float  # sending window
    elapsed_s: float  # first request sent to last answer
    outcomes: list[Outcome] = field(default_factory=list)
    host_bound: float = 0.0

    def figures(self, slo_s: float) -> dict[str, Any]:
        n = len(self.outcomes)
        ok = [o.e2e_s for o in self.outcomes if o.status == 200]
        rejected = sum(o.status == 429 for o in self.outcomes)
        return {
            "phase": self.name,
            "offered_rps": self.offered_rps,
            "sent": n,
            "sent_rps": n / self.window_s,
            "rejected_429_pct": 100 * rejected / n if n else 0.0,
            "other_failures": n - len(ok) - rejected,
            "admitted": len(ok),
            "goodput_rps": sum(e <= slo_s for e in ok) / self.elapsed_s,
            "admitted_within_slo_pct": 100 * sum(e <= slo_s for e in ok) / len(ok) if ok else 0.0,
            "p50_s": percentile(ok, 50),
            "p99_s": percentile(ok, 99),
            "host_bound_pct": 100 * self.host_bound,
        }


def body(i: int) -> dict[str, Any]:
    return {
        "prompt": synthetic_prompt(PROMPT_CHARS, i),
        "max_tokens": OUTPUT_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
    }


async def send(client: httpx.AsyncClient, i: int) -> Outcome:
    t = time.perf_counter()
    try:
        r = await client.post("/v1/completions", json=body(i))
        return Outcome(r.status_code, time.perf_counter() - t)
    except httpx.HTTPError:
        return Outcome(None, time.perf_counter() - t)


async def host_bound_during(client: httpx.AsyncClient, url: str, run: Any) -> tuple[Any, float]:
    """Run the coroutine `run`; return its result and the share of emulated iterations that lagged."""
    before = await fetch_emulation(client, url)
    result = await run
    during = emulation_during(before, await fetch_emulation(client, url)) or []
    iterations = sum(d["iterations"] for d in during)
    return result, (sum(d["lagged_iterations"] for d in during) / iterations if iterations else 0.0)


async def closed_loop(client: httpx.AsyncClient, clients: int, seconds: float) -> float:
    """The rate `clients` back-to-back clients sustain for `seconds`: by Little's law, `clients`
    requests always in flight / their mean end-to-end latency (robust to the clients finishing in
    waves, which a count of completions in a short window is not). The first round (all prompts
    arriving at once) is left out."""
    end = time.perf_counter() + seconds
    e2e_s: list[float] = []
    counter = iter(range(10**9))

    async def one_client() -> None:
        first = True
        while time.perf_counter() < end:
            o = await send(client, next(counter))
            if o.status != 200:
                raise RuntimeError(f"closed-loop request answered {o.status}")
            if not first:
                e2e_s.append(o.e2e_s)
            first = False

    await asyncio.gather(*(one_client() for _ in range(clients)))
    if not e2e_s:
        raise RuntimeError(f"no request after the first round within {seconds} s: raise --calib-s")
    return clients / statistics.fmean(e2e_s)


async def open_loop(
    client: httpx.AsyncClient, rate_rps: float, seconds: float, seed: int
) -> tuple[list[Outcome], float]:
    """Poisson arrivals at `rate_rps` for `seconds`; the outcomes and the time until the last answer."""
    rng = random.Random(seed)
    t0, at, tasks = time.perf_counter(), 0.0, []
    while at < seconds:
        await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
        tasks.append(asyncio.create_task(send(client, len(tasks) + 10**6 * seed)))
        at += rng.expovariate(rate_rps)
    outcomes = list(await asyncio.gather(*tasks))
    return outcomes, time.perf_counter() - t0


async def run(url: str, args: argparse.Namespace) -> tuple[float, float, list[Phase]]:
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        await asyncio.gather(*(send(client, -1 - i) for i in range(4)))  # warm-up
        unloaded = [(await send(client, -10 - i)).e2e_s for i in range(3)]
        slo_s = args.slo_factor * statistics.median(unloaded)
        print(
            f"unloaded e2e: median {statistics.median(unloaded):.3f} s -> SLO e2e <= {slo_s:.2f} s",
            flush=True,
        )
        capacity, lag = await host_bound_during(
            client, url, closed_loop(client, args.max_num_seqs, args.calib_s)
        )
        print(f"sustainable rate (closed loop, {args.max_num_seqs} clients): {capacity:.2f} req/s "
              f"(host-bound {lag:.1%})", flush=True)  # fmt: skip
        phases = []
        for k, factor in enumerate((1.0, 2.0)):
            await asyncio.sleep(args.settle_s)
            rate = factor * capacity
            (outcomes, elapsed_s), lag = await host_bound_during(
                client, url, open_loop(client, rate, args.seconds, args.seed + k)
            )
            phases.append(Phase(f"{factor:g}x", rate, args.seconds, elapsed_s, outcomes, lag))
            print(f"{factor:g}x done: {len(outcomes)} requests", flush=True)
    return slo_s, capacity, phases


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=30.0, help="sending window of each open-loop run (30)")
    p.add_argument("--calib-s", type=float, default=20.0, help="closed-loop window for the rate (20)")
    p.add_argument("--slo-factor", type=float, default=3.0, help="SLO: e2e <= this x unloaded e2e (3)")
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-waiting-requests", type=int, default=None, help="(default: the server's)")
    p.add_argument("--settle-s", type=float, default=5.0, help="pause before each open-loop run (5)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    serve = [*EMULATED, "--workers", "1", "--max-num-seqs", str(args.max_num_seqs), "--kv-cache-mb", "64"]
    if args.max_waiting_requests is not None:
        serve += ["--max-waiting-requests", str(args.max_waiting_requests)]
    print(f"overload  {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC  {os.cpu_count()} cores "
          f"({cpu_model_name()}), load average {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    print("serve " + " ".join(serve), flush=True)
    server = start_server(*serve)
    try:
        slo_s, capacity, phases = asyncio.run(run(server.url, args))
        metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    finally:
        stop_server(server)
    rejected = [line for line in metrics.splitlines() if line.startswith("phaselens:requests_rejected_total")]
    print()
    print(f"SLO: end-to-end latency <= {slo_s:.2f} s ({args.slo_factor:g} x unloaded); "
          f"sustainable rate {capacity:.2f} req/s; figures emulated")  # fmt: skip
    head = (
        f"{'load':<5} {'offered/s':>9} {'sent':>5} {'sent/s':>6} {'429 %':>6} {'other':>5} {'goodput/s':>9} "
    )
    head += f"{'in SLO %':>8} {'p50 s':>6} {'p99 s':>6} {'host-bound':>10}"
    print(head)
    for ph in phases:
        f = ph.figures(slo_s)
        print(
            f"{f['phase']:<5} {f['offered_rps']:>9.2f} {f['sent']:>5} {f['sent_rps']:>6.2f} "
            f"{f['rejected_429_pct']:>6.1f} "
            f"{f['other_failures']:>5} {f['goodput_rps']:>9.2f} {f['admitted_within_slo_pct']:>8.1f} "
            f"{f['p50_s']:>6.2f} {f['p99_s']:>6.2f} {f['host_bound_pct']:>9.1f}%"
        )
    print("\n".join(rejected))
    return 0


if __name__ == "__main__":
    sys.exit(main())
