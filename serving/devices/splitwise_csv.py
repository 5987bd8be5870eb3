"""Reduce Splitwise's profiling CSV to the committed per-unit medians (serving/devices/published_splitwise.py):
:func:`medians` and :func:`render`; the command line is ``bench/splitwise_units.py --csv PATH [--write]``.
The ``bloom-176b`` rows (the blind test set of issue 23) are skipped unread: only a row's ``model`` column
is looked at."""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from pathlib import Path

MODULE = Path(__file__).resolve().parent / "published_splitwise.py"
MODEL = "llama2-70b"
SOURCE_COMMIT = "8f99e7d"

HEADER = '''"""Splitwise profiling data, llama2-70b rows: one median per unit (GENERATED, do not edit).

Source: Patel et al., "Splitwise" (ISCA 2024); github.com/Mutinifni/splitwise-sim ``data/perf_model.csv``
at commit {commit}. Regenerate or check with ``python bench/splitwise_units.py --csv PATH [--write]``.
The CSV's ``bloom-176b`` rows are not read (the blind test set of issue 23).

Units (docs/FIDELITY.md, "Protocol"):

* ``TTFT_MS[(hardware, tp, prompt_size, batch_size)]``: median ``prompt_time`` (ms) over all its rows
  (every ``token_size``): ``batch_size`` prompts of ``prompt_size`` tokens in one prompt phase.
* ``TPOT_MS[(hardware, tp, prompt_size, batch_size, token_size)]``: median ``token_time`` (ms), the mean
  time per generated token over ``token_size`` generated tokens.
* ``PEAK_POWER_FRAC`` / ``AVG_POWER_FRAC`` (same keys as TPOT): median ``peak_power`` / ``average_power``,
  fractions of the TDP (A100 400 W, H100 700 W); only units whose rows record a power (the CSV's H100
  rows all read 0: none recorded).

Each TTFT median is over 5 rows (45 for ``prompt_size`` 512, batch 1: one per ``token_size``); each
TPOT and power median over 5.
"""

from __future__ import annotations

TTFT_MS: dict[tuple[str, int, int, int], float] = {{
'''


def medians(path: Path) -> tuple[dict, dict, dict, dict]:
    """Per-unit medians of the CSV's llama2-70b rows."""
    prompt: dict[tuple, list[float]] = defaultdict(list)
    token: dict[tuple, list[float]] = defaultdict(list)
    peak: dict[tuple, list[float]] = defaultdict(list)
    avg: dict[tuple, list[float]] = defaultdict(list)
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["model"] != MODEL:
                continue  # bloom-176b: blind, not read
            hw, tp = row["hardware"], int(row["tensor_parallel"])
            n, b, t = int(row["prompt_size"]), int(row["batch_size"]), int(row["token_size"])
            prompt[hw, tp, n, b].append(float(row["prompt_time"]))
            token[hw, tp, n, b, t].append(float(row["token_time"]))
            peak[hw, tp, n, b, t].append(float(row["peak_power"]))
            avg[hw, tp, n, b, t].append(float(row["average_power"]))
    if not prompt:
        raise SystemExit(f"{path}: no {MODEL} rows (is it Splitwise's perf_model.csv?)")

    def med(d: dict[tuple, list[float]], nd: int) -> dict[tuple, float]:
        return {k: round(statistics.median(v), nd) for k, v in sorted(d.items())}

    return med(prompt, 3), med(token, 3), med(peak, 4), med(avg, 4)


def _line(key: tuple, value: float) -> str:
    return "    (" + ", ".join(f'"{x}"' if isinstance(x, str) else str(x) for x in key) + f"): {value!r},\n"


def render(path: Path) -> str:
    """The module's text for the CSV at ``path``."""
    ttft, tpot, peak, avg = medians(path)
    out = [HEADER.format(commit=SOURCE_COMMIT)]
    out += [_line(k, v) for k, v in ttft.items()]
    out.append("}\nTPOT_MS: dict[tuple[str, int, int, int, int], float] = {\n")
    out += [_line(k, v) for k, v in tpot.items()]
    out.append("}\nPEAK_POWER_FRAC: dict[tuple[str, int, int, int, int], float] = {\n")
    out += [_line(k, v) for k, v in peak.items() if v > 0]
    out.append("}\nAVG_POWER_FRAC: dict[tuple[str, int, int, int, int], float] = {\n")
    out += [_line(k, v) for k, v in avg.items() if v > 0]
    out.append("}\n")
    return "".join(out)
