"""Speed of ``phaselens simulate``: simulated seconds per wall second, iterations per second.

Each case simulates the Azure 2023 conversation trace (Azure Public Dataset, CC-BY 4.0, Patel et al.,
Splitwise, ISCA 2024; the vendored 2,000-row slice if the full trace is absent) on a layout and
then writes everything the product stores into a fresh DuckDB store through the same code
``phaselens simulate --db`` runs (telemetry through ``Store.append_telemetry_batches``, GPU samples
every 100 ms, the scenario row), CHECKPOINT included. Printed per case: wall time of the
simulation and of the write, simulated s per wall s, iterations per wall s, rows written, and the
ratio against the targets (issue 21: 1 h on 8 GPUs in <= 10 s, 64 GPUs in <= 120 s, the write included;
the 3P1D case keeps the earlier < 60 s).

    PYTHONPATH=. .venv/bin/python bench/simulate.py                 # the three cases of the issue
    PYTHONPATH=. .venv/bin/python bench/simulate.py --duration 600  # a shorter slice
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from collector.store import Store  # noqa: E402
from phaselens.cli.simulate import WRITE_BUFFER_ROWS, ScenarioWriter  # noqa: E402
from serving.config import preset  # noqa: E402
from serving.sim.layout import parse_layout  # noqa: E402
from serving.sim.simulator import Simulation  # noqa: E402
from serving.trace import SHARED_TRACE as FULL_TRACE  # noqa: E402
from serving.trace import TraceRequest, load_azure_trace, vendored_trace_path  # noqa: E402

CASES = (
    # (label, layout, copies of the trace interleaved, target wall s)
    ("8 x H100, 70B TP2, aggregated", "agg:8xh100-sxm:tp2", 1, 10.0),
    ("8 x H100, 70B TP2, 3P1D", "3p1d:h100-sxm:tp2", 1, 60.0),
    ("64 x H100, 70B TP2, aggregated, the hour's traffic x8", "agg:64xh100-sxm:tp2", 8, 120.0),
)


def tile(requests: list[TraceRequest], copies: int) -> list[TraceRequest]:
    """``copies`` interleaved copies of a trace over the same hour (8x the requests per second,
    each copy shifted by a fraction of the mean gap), for a fleet 8x the size at the same load."""
    if copies == 1:
        return requests
    gap = (requests[-1].arrival_s - requests[0].arrival_s) / max(1, len(requests) - 1)
    out = [
        TraceRequest(r.arrival_s + k * gap / copies, r.prompt_tokens, r.output_tokens)
        for k in range(copies)
        for r in requests
    ]
    return sorted(out, key=lambda r: r.arrival_s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds of the trace (3600)")
    ap.add_argument("--model", default="llama-3.1-70b")
    ap.add_argument("--case", action="append", type=int, default=None, help="case numbers (0-based) to run")
    args = ap.parse_args()
    path = FULL_TRACE if FULL_TRACE.is_file() else vendored_trace_path()
    shape = preset(args.model)
    print(
        f"trace {path.name}, {args.duration:g} s; model {shape.name}; host {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    for i, (label, layout_text, copies, target_s) in enumerate(CASES):
        if args.case and i not in args.case:
            continue
        requests = tile(load_azure_trace(path, duration_s=args.duration), copies)
        layout = parse_layout(layout_text)
        with tempfile.TemporaryDirectory() as tmp:
            store = Store.open(Path(tmp) / "bench.duckdb", buffer_rows=WRITE_BUFFER_ROWS)
            writer = ScenarioWriter(store, f"bench{i}")
            t0, cpu0 = time.perf_counter(), time.process_time()
            sim = Simulation(
                layout,
                shape,
                requests,
                start_s=1.8e9,
                scenario=f"bench{i}",
                on_batch=writer.on_batch,
                columnar=True,
            )
            result = sim.run()
            counts = writer.finish(result)
            store.checkpoint()
            store.close()
            total = time.perf_counter() - t0
            cpu_s = time.process_time() - cpu0  # every thread of the process (the background flush too)
        write_s = writer.seconds
        sim_s = total - write_s
        rows = sum(counts.values())
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"{label} [{layout_text}]: {len(requests):,} requests, {result.duration_s:,.0f} s simulated, "
            f"{result.iterations:,} iterations\n"
            f"  simulate {sim_s:6.1f} s  ({result.duration_s / sim_s:,.0f} simulated s per wall s, "
            f"{result.iterations / sim_s:,.0f} iterations/s)\n"
            f"  store    {write_s:6.1f} s  ({rows:,} rows: {counts.get('tokens', 0):,} tokens, "
            f"{counts.get('iterations', 0):,} iterations, {counts.get('gpu_samples', 0):,} GPU samples; "
            f"{rows / write_s:,.0f} rows/s; telemetry streamed to the store during the run)\n"
            f"  total    {total:6.1f} s  ({cpu_s:.1f} s of CPU, every thread; wall time on a shared host "
            f"moves with its load, CPU time much less)\n"
            f"           = {total / target_s:.2f}x the {target_s:g} s target "
            f"({'met' if total <= target_s else 'NOT met'}); "
            f"peak RSS so far {rss_mb:,.0f} MB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
