"""A large store for ``bench/analytics.py``, synthesised in DuckDB to the store's own schema.

64 GPUs on one node (``bench``, emulated H100s: 32 aggregated ``mixed`` workers, 16 ``prefill`` and
16 ``decode``), sampled every 100 ms for 43.4 hours (10,000,000 ``gpu_samples``), one iteration
every 50 ms per GPU (alternating prefill/decode on mixed GPUs; ~20 M ``iterations``), 1,000,000
``requests`` with 1–39 output tokens each (their ``tokens``, ~20 M) — the volumes the issue names,
and the per-second rollup of the iterations the store's writer keeps (``iteration_seconds``),
with values shaped like serving (busy power and SM activity by phase, a monotonic energy counter).
The data is synthetic: it exercises the analytics' SQL at scale, its figures mean nothing. The builder
is collector/store/synthetic.py (tests build the same store small); this script sizes and caches it.

    PYTHONPATH=. .venv/bin/python bench/analytics_data.py /tmp/phaselens-bench.duckdb
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from collector.store import Store  # noqa: E402
from collector.store.synthetic import (  # noqa: E402
    GPUS,
    PERIOD_S,
    REQUESTS,
    SAMPLES,
    T0,
    VERSION,
    build,
    t0_ending_now,
)

__all__ = ["GPUS", "PERIOD_S", "SAMPLES", "T0", "build", "ensure"]


def ensure(path: Path) -> dict[str, int]:
    """Build the store unless a current one is already at ``path``."""
    stamp = Path(str(path) + f".v{VERSION}")
    if path.exists() and stamp.exists():
        with Store.open(path, read_only=True) as store:
            return {
                t: int(store.query(f"SELECT count(*) AS n FROM {t}")["n"][0])
                for t in ("gpu_samples", "iterations", "requests", "tokens", "devices")
            }
    counts = build(path)
    stamp.touch()
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=Path)
    ap.add_argument("--samples", type=int, default=SAMPLES, help=f"GPU samples (default {SAMPLES:,})")
    ap.add_argument("--requests", type=int, default=REQUESTS, help=f"requests (default {REQUESTS:,})")
    ap.add_argument(
        "--end-now",
        action="store_true",
        help="place the data so that it ends now (a live window of the last hour sees it)",
    )
    args = ap.parse_args()
    if args.samples < GPUS or args.requests < 1:
        ap.error(f"--samples must be >= {GPUS} (one per GPU) and --requests >= 1")
    t0 = t0_ending_now(args.samples) if args.end_now else T0
    t = time.perf_counter()
    counts = build(args.path, samples=args.samples, requests=args.requests, t0=t0)
    if (args.samples, args.requests, args.end_now) == (SAMPLES, REQUESTS, False):
        Path(str(args.path) + f".v{VERSION}").touch()
    print(f"built {args.path} in {time.perf_counter() - t:.1f} s: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
