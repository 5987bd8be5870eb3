"""Time the full analytics summary (``phaselens analyze``'s path) over a fleet-sized store.

The store (``bench/analytics_data.py``: 10 M GPU samples of 64 GPUs, ~18 M iterations, 1 M
requests, ~20 M tokens, synthesised in DuckDB to the store's schema) is built once and cached
next to the given path. Timed: ``analytics.reads.run_summary`` — the window resolved, every part
computed (phase attribution with the per-GPU power fits, idle split, bimodality, cost, latency)
and turned into the JSON the CLI and the collector's API return — on a read-only connection to the
file, the way ``phaselens analyze --db`` reads it (wall time, and the process's CPU time, which a
loaded host disturbs less). Baseline in the same run: one plain DuckDB scan
aggregating every gpu_samples row per GPU (count, mean power and SM activity, max energy counter),
the floor any analysis of those rows pays. Peak memory is the process's maximum RSS (the DuckDB connection included).

    PYTHONPATH=. .venv/bin/python bench/analytics.py [/tmp/phaselens-bench.duckdb] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import duckdb  # noqa: E402
from analytics_data import GPUS, PERIOD_S, SAMPLES, T0, ensure  # noqa: E402

from analytics.reads import run_summary  # noqa: E402

TARGET_S = 5.0
STRETCH_S = 2.0


def _cpu_s() -> float:
    """CPU seconds this process has used (user + system, every thread)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?", type=Path, default=Path("/tmp/phaselens-bench.duckdb"))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    t = time.perf_counter()
    counts = ensure(args.path)
    print(f"store {args.path}: {counts} (ready in {time.perf_counter() - t:.1f} s)")
    end_s = T0 + (SAMPLES // GPUS) * PERIOD_S + 1
    params = {"dataset": "live", "start_s": T0, "end_s": end_s}
    con = duckdb.connect(str(args.path), read_only=True)
    con.execute("SET enable_progress_bar = false")
    t = time.perf_counter()
    con.execute(
        'SELECT node, device, "index", count(*), avg(power_w), avg(sm_active_pct), max(energy_mj) '
        "FROM gpu_samples GROUP BY ALL"
    ).fetchall()
    scan_s = time.perf_counter() - t
    times, cpus = [], []
    for _ in range(args.repeats):
        t, c = time.perf_counter(), _cpu_s()
        summary = run_summary(con.cursor(), params)
        times.append(time.perf_counter() - t)
        cpus.append(_cpu_s() - c)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    best, worst = min(times), max(times)
    print(f"host {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print(
        f"baseline: one grouped scan of gpu_samples (per GPU: count, avg power and SM activity, max energy): {scan_s:.2f} s"
    )
    print(
        f"full summary (run_summary, every part): best {best:.2f} s, worst {worst:.2f} s over {args.repeats} runs "
        f"= {best / scan_s:.1f}x the scan; target < {TARGET_S:g} s {'met' if best < TARGET_S else 'NOT met'}, "
        f"stretch < {STRETCH_S:g} s {'met' if best < STRETCH_S else 'not met'}"
    )
    print(
        f"  process CPU (all threads): best {min(cpus):.2f} s, worst {max(cpus):.2f} s "
        "(steadier than wall time on a loaded host)"
    )
    print("  parts (last run): " + ", ".join(f"{k} {v:.2f} s" for k, v in summary["seconds"].items()))
    missing = summary["missing"]
    print(
        f"  missing: {len(missing)} notes" + (f" (first: {next(iter(missing.values()))})" if missing else "")
    )
    print(f"peak RSS {rss_mb:,.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
