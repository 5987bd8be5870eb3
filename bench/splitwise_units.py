"""Regenerate (or check) serving/devices/published_splitwise.py from Splitwise's profiling CSV.

The CSV (github.com/Mutinifni/splitwise-sim, ``data/perf_model.csv``, commit 8f99e7d) is not part of
this repository; its ``llama2-70b`` rows are reduced to one median per unit (docs/FIDELITY.md,
"Protocol"; serving/devices/splitwise_csv.py), and those medians are the committed constants. The
``bloom-176b`` rows are the blind test set of issue 23: they are skipped unread.

    python bench/splitwise_units.py --csv PATH            # check the committed module matches the CSV
    python bench/splitwise_units.py --csv PATH --write    # rewrite it
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from serving.devices.splitwise_csv import MODULE, render


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", required=True, type=Path, help="path to Splitwise's data/perf_model.csv")
    ap.add_argument("--write", action="store_true", help=f"rewrite {MODULE.name} instead of checking it")
    args = ap.parse_args(argv)
    if not args.csv.is_file():
        ap.error(f"--csv {args.csv}: no such file (give the path to Splitwise's data/perf_model.csv)")
    text = render(args.csv)
    if args.write:
        MODULE.write_text(text)
        print(f"wrote {MODULE}")
        return 0
    have = MODULE.read_text() if MODULE.exists() else ""
    if have != text:
        print(f"{MODULE} does NOT match {args.csv} (run with --write)", file=sys.stderr)
        return 1
    print(f"{MODULE.name} matches {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
