"""The building blocks of the summary text (analytics/summary_text.py): table cells and grids, the
number formats (%, ms, USD, p-values), and the short, unambiguous GPU names (:class:`GpuNames`)
with the order the per-GPU rows are shown in.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any


def cell_text(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:
            return "—"
        a = abs(value)
        return f"{value:,.0f}" if a >= 1000 else f"{value:.1f}" if a >= 10 else f"{value:.3g}"
    if isinstance(value, dict | list):
        return (
            ", ".join(f"{k}={cell_text(v)}" for k, v in value.items())
            if isinstance(value, dict)
            else ", ".join(map(cell_text, value))
        )
    return str(value)


def grid_lines(header: list[str], rows: list[list[str]], *, rule: bool = False) -> list[str]:
    """Aligned text columns: the first left-aligned, the others right-aligned; ``rule`` under the header."""
    cells = [header, *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )

    return [line(header)] + (["  ".join("-" * w for w in widths)] if rule else []) + [line(r) for r in rows]


def table_lines(rows: list[dict[str, Any]], limit: int = 40) -> list[str]:
    cols = list(dict.fromkeys(k for r in rows for k in r if not isinstance(r[k], dict | list)))
    if not cols:
        return []
    lines = grid_lines(cols, [[cell_text(r.get(c)) for c in cols] for r in rows[:limit]], rule=True)
    if len(rows) > limit:
        lines.append(f"... {len(rows) - limit} more rows (--json for all)")
    return lines


def render_lines(obj: Any, indent: str = "") -> list[str]:
    lines: list[str] = []
    if isinstance(obj, dict):
        scalars = {k: v for k, v in obj.items() if not isinstance(v, dict | list) and k != "trust"}
        if scalars:
            width = max(len(k) for k in scalars)
            lines += [f"{indent}{k.ljust(width)}  {cell_text(v)}" for k, v in scalars.items()]
        for k, v in obj.items():
            if k == "trust" and isinstance(v, dict):
                lines.append(f"{indent}trust: {', '.join(v.get('labels', [])) or 'no data'}")
                lines += [f"{indent}  note: {n}" for n in v.get("notes", [])]
            elif isinstance(v, list) and v and all(isinstance(r, dict) for r in v):
                lines.append(f"{indent}{k}:")
                lines += [indent + "  " + line for line in table_lines(v)]
            elif isinstance(v, list):
                lines.append(f"{indent}{k}: {cell_text(v)}")
            elif isinstance(v, dict):
                lines.append(f"{indent}{k}:")
                lines += render_lines(v, indent + "  ")
    return lines


def fmt_pct(x: Any) -> str:
    return "—" if x is None or x != x else f"{100 * x:.1f} %"


def fmt_ms(x: Any) -> str:
    return "—" if x is None or x != x else f"{1000 * x:,.1f}" if x < 1 else f"{1000 * x:,.0f}"


def fmt_usd(x: Any) -> str:
    """Money to 3 significant figures ($4.31, $0.117, $0.00160, $35.6), whole dollars from $100."""
    if x is None or x != x:
        return "—"
    if x == 0 or abs(x) >= 100:
        return f"${x:,.0f}"
    return f"${x:,.{max(0, 2 - math.floor(math.log10(abs(x))))}f}"


def fmt_p_value(p: Any) -> str:
    """A dip-test p-value: ``< 0.001`` rather than a 0, else 3 decimals below 0.1, 2 above."""
    if p is None or p != p:
        return "—"
    return "< 0.001" if p < 0.001 else f"{p:.3f}" if p < 0.1 else f"{p:.2f}"


def fmt_slo_ms(x: Any) -> str:
    """An SLO threshold in ms, every threshold the same way: ``2,000``, ``100``, ``62.5``."""
    if x is None or x != x:
        return "—"
    ms = 1000 * x
    return f"{ms:,.0f}" if abs(ms - round(ms)) < 1e-9 else f"{ms:,.1f}"


def section_lines(title: str, header: list[str], rows: list[list[str]], *, titled: bool = False) -> list[str]:
    """A titled table of ``rows``; nothing without rows, or the title alone where ``titled`` (lines
    under it still need it: a capped table's left-out line, notes)."""
    if not rows:
        return ["", title] if titled else []
    return ["", title, *("  " + line for line in grid_lines(header, rows))]


#: per-GPU rows of the unsampled-time, bimodality and power-model tables ``phaselens analyze`` prints by default
DEFAULT_GPU_ROWS = 12


def natural_key(key: str) -> tuple[Any, ...]:
    """A GPU key's place in natural order: by node, then numeric index (2 before 10)."""
    parts = key.split("|")
    if len(parts) != 4:
        return (key, 2)
    node, source, device, index = parts
    return (node, 0, int(index), source, device) if index.isdigit() else (node, 1, index, source, device)


def index_runs(indices: list[int], most: int = 8) -> str:
    """Sorted whole numbers as runs: ``0–31, 40, 42–44``; past ``most`` runs, the first ones, ``…``
    and the last (``1, 3, 5, …, 63``)."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    texts = [f"{r[0]}–{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs]
    return ", ".join(texts if len(texts) <= most else [*texts[: most - 1], "…", texts[-1]])


class GpuNames:
    """The GPUs of one summary (keys ``node|source|device|index``): their natural order (by node,
    then numeric index) and short labels — the index alone where the window holds one node, else
    ``node/index``. A GPU whose short label another GPU shares keeps its whole key."""

    def __init__(self, keys: Iterable[str]) -> None:
        self.keys = sorted(set(keys), key=natural_key)
        self.one_node = len({k.split("|")[0] for k in self.keys}) <= 1
        short = {k: self._short(k, one_node=self.one_node) for k in self.keys}
        taken = Counter(short.values())
        self._labels = {k: label for k, label in short.items() if label is not None and taken[label] == 1}
        self.pattern = (  # a key in a message, after "GPU " or not
            re.compile("(?:GPU )?(" + "|".join(map(re.escape, self.keys)) + r")(?!\d)") if self.keys else None
        )

    @staticmethod
    def _short(key: str, *, one_node: bool) -> str | None:
        parts = key.split("|")
        if len(parts) != 4 or not parts[3].isdigit():
            return None
        return parts[3] if one_node else f"{parts[0]}/{parts[3]}"

    def label(self, key: str) -> str:
        """The GPU's short label (its whole key where a short one would be ambiguous or unknown)."""
        return self._labels.get(key, key)

    def relabel(self, text: str) -> str:
        """``text`` with each GPU key it names as ``GPU <label>``."""
        return self.pattern.sub(lambda m: f"GPU {self.label(m[1])}", text) if self.pattern else text

    def order(self, keys: Iterable[str]) -> list[str]:
        """``keys`` in natural order."""
        return sorted(keys, key=natural_key)

    def listing(self, keys: Iterable[str]) -> str:
        """``GPU 7`` for one GPU; for more, the count and their labels with runs of indices
        compacted: ``GPUs 0–31 (32)``, ``GPUs a/0–7, b/0–3 (12)``."""
        ordered = self.order(set(keys))
        if len(ordered) == 1:
            return f"GPU {self.label(ordered[0])}"
        pieces: list[str] = []
        by_node: dict[str, list[int]] = {}  # short-labelled GPUs' indices per node, in order
        for key in ordered:
            if key in self._labels:
                by_node.setdefault(key.split("|")[0], []).append(int(key.rsplit("|", 1)[1]))
            else:
                pieces.append(key)
        runs = [
            index_runs(idx) if self.one_node else f"{node}/{index_runs(idx)}" for node, idx in by_node.items()
        ]
        return f"GPUs {', '.join(runs + pieces)} ({len(ordered)})"


def gpu_keys_of(parts: dict[str, Any]) -> list[str]:
    """Every GPU key the summary's per-GPU tables name: the power fits, the sample gaps, the
    bimodality's GPU rows."""
    phases = parts.get("phases") or {}
    keys = list(phases.get("fits") or {}) + list(phases.get("sample_gaps") or {})
    keys += [str(r["gpu"]) for r in (parts.get("bimodal") or {}).get("table") or [] if r.get("gpu")]
    return keys


def notable_first(keys: list[str], rank: Callable[[str], Any], limit: int | None) -> list[str]:
    """The ``limit`` first of ``keys`` by ``rank`` (all where ``limit`` is None), in natural order."""
    chosen = keys if limit is None else sorted(keys, key=lambda k: (rank(k), natural_key(k)))[: max(0, limit)]
    return sorted(chosen, key=natural_key)


def left_out_lines(shown: int, total: int, rule: str) -> list[str]:
    """The line under a capped per-GPU table: how many GPUs it leaves out and how the shown ones were
    picked (nothing where none is left out)."""
    if shown >= total:
        return []
    picked = f"; shown: {rule}" if shown else ""
    return [f"  … {total - shown} of {total} GPUs left out{picked}; --gpus all (or --json) lists every one"]
