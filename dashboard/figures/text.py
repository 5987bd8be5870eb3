"""Numbers as the charts, pages and reports write them: dollars, headline figures and their change,
the time axis' title."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def usd_text(v: Any) -> str:
    """Dollars to read: ``$1.14M``, ``$1,234``, ``$12.34``, ``$0.0521`` (three significant digits
    below a dollar), ``< $0.0001`` below that, ``—`` when undefined."""
    x = as_float(v)
    if x != x:
        return "—"
    if abs(x) >= 1e6:
        return f"${x / 1e6:,.2f}M"
    if abs(x) >= 1000:
        return f"${x:,.0f}"
    if abs(x) >= 1 or x == 0:
        return f"${x:,.2f}"
    if abs(x) < 1e-4:  # not a figure to read to three digits (nor in e-notation)
        return "< $0.0001" if x > 0 else "> -$0.0001"
    return f"${x:.3g}"


def _finite(v: Any) -> float | None:
    x = as_float(v)
    return x if math.isfinite(x) else None


def signed_pct_text(v: Any) -> str:
    """A signed percentage change (``+12.3 %``), or ``—``."""
    x = _finite(v)
    return "—" if x is None else f"{x:+.1f} %"


def whole_number_text(v: Any) -> str:
    """A whole amount with thousands separators (``1,234``), or ``—``."""
    x = _finite(v)
    return "—" if x is None else f"{x:,.0f}"


def whole_usd_text(v: Any) -> str:
    """Whole dollars (``$1,234``, a yearly saving), or ``—``."""
    x = _finite(v)
    return "—" if x is None else f"${x:,.0f}"


def time_axis_title(simulated: bool) -> str:
    """A time axis' title, saying when the times are a simulation's virtual time."""
    return "virtual time, UTC (simulated)" if simulated else "time, UTC"


def as_float(v: Any) -> float:
    """A JSON number as a float (None / NaN / text → NaN)."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float):
        return float(v)
    return math.nan


# -- headline figures (analytics/overview.py) -----------------------------------------------------------


def figure_text(key: str, value: float | None) -> str:
    """A headline figure with its unit, e.g. ``1,234 tokens/s``, ``$0.0421``, ``0.52 J``, ``37.5 %``."""
    if value is None:
        return "no data"
    if key == "output_tokens_per_s":
        return f"{value:,.0f} tokens/s" if value >= 100 else f"{value:,.1f} tokens/s"
    if key.startswith("usd_"):
        return usd_text(value)
    if key.startswith("j_per"):
        return f"{value:.3g} J"
    return f"{100 * value:.1f} %"


def delta_text(fig: Mapping[str, Any]) -> str | None:
    """A headline figure's change against the previous period: percentage points for shares,
    relative otherwise; None without a previous period."""
    if fig.get("delta") is None:
        return None
    if fig["unit"] == "ratio":
        return f"{100 * fig['delta']:+.1f} pp vs previous period"
    if fig.get("delta_ratio") is None:
        return f"{fig['delta']:+.3g} vs previous period"
    return f"{100 * fig['delta_ratio']:+.1f} % vs previous period"
