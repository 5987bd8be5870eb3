"""What the ``/metrics`` counters cost the collector: one counting step against what the window gauges
cost before them.

A step (``phaselens/metrics_counters.py``'s ``count_step``: two summaries from one start, the step's
requests, its control actions) over ``--step-s`` of a synthetic 64-GPU store (100 ms samples,
``collector/store/synthetic.py``), in the middle of ``--minutes`` of data. **Baseline**, same run and
store: the computation the exporter ran every interval before (the overview of the last
``--window-s``: the summary of the window and of the one before it, ``phaselens/overview.py``'s
``compute_overview``). Printed: CPU seconds per computation (best of ``--repeats``), the ratio, and
the share of a core at one computation every ``--interval-s``.

    .venv/bin/python bench/metrics_export.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collector.store import Store  # noqa: E402
from collector.store.synthetic import GPUS, PERIOD_S, build  # noqa: E402
from phaselens.metrics_counters import count_step  # noqa: E402
from phaselens.overview import compute_overview  # noqa: E402

T0 = 1_796_000_000.0


def _best_cpu_s(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="data in the store (64 GPUs, 100 ms samples)")
    p.add_argument("--step-s", type=float, default=15.0, help="one counting step (the default interval)")
    p.add_argument("--window-s", type=float, default=300.0, help="the old gauges' window")
    p.add_argument("--interval-s", type=float, default=15.0, help="computations are this far apart")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    span_s = args.minutes * 60.0
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.duckdb"
        t = time.perf_counter()
        build(db, samples=int(span_s / PERIOD_S) * GPUS, requests=int(span_s * 30), t0=T0)
        print(
            f"store: {GPUS} GPUs x {args.minutes:g} min of 100 ms samples, built in {time.perf_counter() - t:.1f} s"
        )
        end = T0 + span_s * 0.9
        with Store.open(db, read_only=True) as store, store.reader() as cur:
            step = _best_cpu_s(lambda: count_step(cur, end - args.step_s, end), args.repeats)
            old = _best_cpu_s(
                lambda: compute_overview(cur, {"start_s": end - args.window_s, "end_s": end}), args.repeats
            )
    print(
        f"counting step of {args.step_s:g} s:           {step:.3f} CPU s ({100 * step / args.interval_s:.1f} % of a core)"
    )
    print(
        f"baseline, overview of {args.window_s:g} s (old):  {old:.3f} CPU s ({100 * old / args.interval_s:.1f} % of a core)"
    )
    print(f"ratio step / baseline: {step / old:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
