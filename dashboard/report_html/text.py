"""Small formatters of the report page: escaping, trust badges, times, durations, amounts, shares,
latencies, the pools' order."""

from __future__ import annotations

import html
import math
from datetime import UTC, datetime
from typing import Any

POOL_ORDER = {"prefill": 0, "decode": 1, "mixed": 2}


def utc_text(ts_s: float | None, fmt: str = "%Y-%m-%d %H:%M") -> str:
    """An epoch time as UTC text (``?`` when unknown)."""
    return "?" if ts_s is None else datetime.fromtimestamp(ts_s, UTC).strftime(fmt)


def ordered_pools(keys: Any) -> list[str]:
    """Pool names in the order prefill, decode, mixed, then the others by name."""
    return sorted((str(k) for k in keys), key=lambda p: (POOL_ORDER.get(p, 9), p))


def esc(text: str) -> str:
    """``text`` escaped for HTML (quotes too)."""
    return html.escape(text, quote=True)


def no_data_section(heading: str, summary: dict[str, Any], part: str, default_why: str) -> str:
    """The section of a ``part`` without data: its heading and why (the summary's ``missing`` reason
    for the part, else ``default_why``)."""
    why = (summary.get("missing") or {}).get(part) or default_why
    return f'<section><h2>{heading}</h2><p class="empty">No {part}: {esc(str(why))}</p></section>'


def badge(label: str) -> str:
    """A trust label as a coloured badge."""
    return f'<span class="badge {esc(label)}">{esc(label)}</span>'


def number_or_none(v: Any) -> float | None:
    """A JSON number as a float; None for anything else, NaN or infinite."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def range_text(start_s: float | None, end_s: float | None) -> str:
    """``2026-12-01 10:00 – 11:00``, with seconds when the range is shorter than an hour, and the
    end's date when it is another day."""
    short = start_s is not None and end_s is not None and end_s - start_s < 3600
    fmt = "%Y-%m-%d %H:%M:%S" if short else "%Y-%m-%d %H:%M"
    same_day = (
        start_s is not None and end_s is not None and utc_text(start_s, "%j%Y") == utc_text(end_s, "%j%Y")
    )
    return f"{utc_text(start_s, fmt)} – {utc_text(end_s, fmt[9:] if same_day else fmt)}"


def span_between_s(start_s: float | None, end_s: float | None) -> float | None:
    """Seconds from ``start_s`` to ``end_s``; None when either is unknown."""
    return end_s - start_s if start_s is not None and end_s is not None else None


def duration_text(seconds: float | None) -> str:
    """``1 h``, ``24 h``, ``7 d``, ``90 min``, ``42 s``."""
    if seconds is None or seconds <= 0:
        return ""
    if seconds >= 2 * 86400 and seconds % 86400 == 0:
        return f"{seconds / 86400:g} d"
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.3g} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def gpu_hours_text(seconds: Any) -> str:
    """GPU-time to read: ``12.5 GPU-hours``, ``0.75 GPU-hours``, ``31.6 GPU-seconds``."""
    s = number_or_none(seconds)
    if s is None:
        return "unknown GPU-time"
    if s < 360:
        return f"{s:.3g} GPU-seconds"
    h = s / 3600
    return f"{h:,.1f} GPU-hours" if h >= 10 else f"{h:.3g} GPU-hours"


def plural(n: int, word: str) -> str:
    """``1 GPU``, ``2 GPUs``."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def amount_text(v: float) -> str:
    """A table cell: ``0``, ``< 0.01``, ``3.14``, ``1,234``."""
    if v == 0:
        return "0"
    if abs(v) < 0.01:
        return "< 0.01"
    return f"{v:.2f}" if abs(v) < 100 else f"{v:,.0f}"


def pct_text(v: float | None) -> str:
    """A percentage cell: ``37 %``, ``—`` when unknown."""
    return "—" if v is None else f"{v:.0f} %"


def share_text(v: Any) -> str:
    """A share (0..1) as a percentage: ``91.5%``, ``—`` when unknown."""
    x = number_or_none(v)
    return "—" if x is None else f"{x:.1%}"


def seconds_text(v: Any) -> str:
    """A time span to read, in the unit that fits it: ``9.06 s`` (not 9,063 ms), ``420 ms``,
    ``12.5 ms``, ``2.5 min``, ``1.5 h``; ``—`` when unknown."""
    x = number_or_none(v)
    if x is None:
        return "—"
    a = abs(x)
    if a >= 2 * 3600:
        return f"{x / 3600:.3g} h"
    if a >= 120:
        return f"{x / 60:.3g} min"
    if a >= 1:
        return f"{x:.3g} s"
    ms = x * 1000
    return f"{ms:.0f} ms" if abs(ms) >= 100 else f"{ms:.3g} ms"
