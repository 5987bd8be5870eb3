"""Reading a Prometheus text page: the collector's reader against ``prometheus_client``'s parser.

What every dcgm-exporter scrape and engine ``/metrics`` scrape goes through (``parse_exposition``
in ``collector/sources/exposition.py``): the real captures of the tests (dcgm-exporter on an L4 and
on an A30 with MIG, vLLM with LMCache, a Dynamo vLLM worker) and the 8-GPU dcgm-exporter page that
``bench/ingest.py`` scrapes. **Baseline**: ``prometheus_client``'s text parser on the same page, same
run (what the collector used before; still its reader for pages that are not plain). Printed per
page: milliseconds per parse (best of ``--repeats`` rounds), series per page, the ratio, and the
CPU a series costs; the samples of both readers are checked equal first.

    .venv/bin/python bench/exposition.py
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ingest_rows import dcgm_page  # noqa: E402
from collector.captures import CAPTURES_DIR  # noqa: E402
from collector.sources.base import SourceResult  # noqa: E402
from collector.sources.exposition import _library_samples, parse_exposition  # noqa: E402

DATA = CAPTURES_DIR


def _best_ms(fn: Callable[[], object], rounds: int, per_round: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.process_time()
        for _ in range(per_round):
            fn()
        best = min(best, (time.process_time() - t) / per_round)
    return best * 1e3


def main(argv: list[str] | None = None) -> None:
    """Parse each page with both readers; print CPU ms per parse and the ratio."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5, help="rounds per reader and page (best is printed)")
    ap.add_argument("--per-round", type=int, default=20, help="parses per round")
    args = ap.parse_args(argv)
    pages = {p.name: p.read_text() for p in sorted(DATA.glob("*.prom"))}
    pages["dcgm-exporter, 8 GPUs (bench/ingest.py)"] = dcgm_page()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} CPUs, load average {load}; CPU time per parse, best of {args.repeats} rounds")
    print(f"{'page':<44} {'series':>6} {'library':>10} {'collector':>10} {'ratio':>7} {'us/series':>9}")
    for name, text in pages.items():
        result = SourceResult("bench", 0.0)
        ours = parse_exposition(text, result)
        if result.errors or [(s.name, s.labels, repr(s.value)) for s in ours] != [
            (s.name, s.labels, repr(s.value)) for s in _library_samples(text)
        ]:
            raise SystemExit(f"{name}: the readers disagree")
        lib_ms = _best_ms(lambda t=text: _library_samples(t), args.repeats, args.per_round)
        our_ms = _best_ms(
            lambda t=text: parse_exposition(t, SourceResult("bench", 0.0)), args.repeats, args.per_round
        )
        print(
            f"{name:<44} {len(ours):>6} {lib_ms:>8.2f}ms {our_ms:>8.2f}ms {lib_ms / our_ms:>6.1f}x "
            f"{our_ms * 1e3 / len(ours):>9.2f}"
        )


if __name__ == "__main__":
    main()
