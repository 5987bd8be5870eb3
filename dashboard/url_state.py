"""What a page's link carries, so that a link reproduces the view: the data set (``?dataset=``), the
time range (``?range=``) and what it is compared with (``?compare=``, ``?compare_range=``).

- ``range``: live data, a span back from now (``5m``, ``15m``, ``1h``, ``6h``, ``24h``); a scenario,
  seconds into its virtual time span (``60-240``; ``60.5-240``).
- ``compare``: ``previous`` (the period of the same length just before), or a data set's id (a stored
  scenario, or ``live``) whose ``compare_range`` (same forms) is compared, its whole span when absent.

Pure functions: the sidebar (:func:`dashboard.common.sidebar`) reads them from ``st.query_params``
and writes them back on every run.
"""

from __future__ import annotations

import math
import re

LIVE_RANGE_CODES = {
    "last 5 minutes": "5m",
    "last 15 minutes": "15m",
    "last hour": "1h",
    "last 6 hours": "6h",
    "last 24 hours": "24h",
}
PREVIOUS = "previous"
_RANGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*-\s*(\d+(?:\.\d+)?)\s*$")


def live_range_of(code: str | None) -> str | None:
    """The live range's name for a link's ``range`` code (``1h`` → ``last hour``); None if none fits."""
    by_code = {c: name for name, c in LIVE_RANGE_CODES.items()}
    return by_code.get((code or "").strip().lower())


def live_range_code(name: str) -> str:
    """The link's ``range`` code of a live range's name (``last hour`` → ``1h``)."""
    return LIVE_RANGE_CODES[name]


def scenario_duration_s(start_s: float, end_s: float) -> float:
    """A scenario's span as the range slider knows it: seconds, to a tenth, at least 1."""
    return float(round(max(float(end_s) - float(start_s), 1.0), 1))


def scenario_window(start_s: float, a: float, b: float) -> tuple[float, float]:
    """The window (UTC epoch seconds) of the range ``a``–``b`` s into a scenario starting at
    ``start_s``; at least 0.1 s long. The whole span by default: ``(start_s, 0, duration)`` — what a
    page first asks, and what the service computes ahead (phaselens/summary_warm.py)."""
    return start_s + a, start_s + max(b, a + 0.1)


def scenario_range_of(text: str | None, duration_s: float) -> tuple[float, float] | None:
    """``(a, b)`` seconds into a scenario from a link's ``60-240``, clipped to ``[0, duration_s]``;
    None when the text is absent, not of that form, or empty after clipping (the sidebar then keeps
    its default: the whole scenario)."""
    m = _RANGE.match(text or "")
    if not m:
        return None
    a, b = (min(max(float(v), 0.0), duration_s) for v in m.groups())
    if not (math.isfinite(a) and math.isfinite(b)) or b <= a:
        return None
    return a, b


def scenario_range_text(a: float, b: float) -> str:
    """A scenario range as the link writes it: ``60-240`` (a tenth of a second where it has one)."""
    return f"{_num(a)}-{_num(b)}"


def _num(v: float) -> str:
    return f"{round(v, 1):g}"


def compare_of(text: str | None, options: list[str]) -> str | None:
    """What a link's ``compare`` names: :data:`PREVIOUS` or one of ``options`` (data set ids); None
    for nothing (absent or unknown)."""
    value = (text or "").strip()
    if value == PREVIOUS or value in options:
        return value
    return None
