"""Output tokens/s of a window: one headline figure, and the rate while serving under its own name.

* **Output tokens/s (window average)** — the headline everywhere (``phaselens analyze``, the
  summary's ``throughput`` part, the Overview tile and ``GET /api/v1/analytics/overview``, the HTML
  report, ``phaselens_output_tokens_per_second`` on ``/metrics``): output tokens generated in the
  window ÷ the window's length in seconds.
* **tokens/s while serving (busy time)** — output tokens ÷ the seconds of the window with at least
  one request in flight (the summary's ``serving`` part, :func:`analytics.summary.serving_span`). On
  bursty traffic it is far above the window average (188 against 67 tokens/s on a trace that served
  a third of the time); it is shown beside the headline, named as what it is, never in its place.

Pure: :func:`throughput` reads a summary's JSON form (``Summary.to_dict()``), so the CLI, the API,
the overview and the report compute the figure with one function from the same parts.
"""

from __future__ import annotations

import math
from typing import Any

#: the headline figure's name, with its unit
HEADLINE_LABEL = "Output tokens/s (window average)"
#: the rate over the time with a request in flight, by its explicit name
BUSY_LABEL = "tokens/s while serving (busy time)"


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def duration_text(s: float) -> str:
    """0.8 s, 90 s, 2.6 min, 1.5 h."""
    if s < 10:
        return f"{s:.1f} s"
    return f"{s:,.0f} s" if s < 120 else f"{s / 60:,.1f} min" if s < 7200 else f"{s / 3600:,.1f} h"


def throughput(summary: dict[str, Any]) -> dict[str, Any]:
    """The window's output tokens/s: ``output_tokens_per_s`` (the headline, tokens ÷ ``window_s``),
    ``output_tokens_per_s_busy`` (tokens ÷ ``busy_s``, the seconds with a request in flight; None
    where no request lies in the window), ``output_tokens``, ``basis`` / ``busy_basis`` (what each
    divides by, in words), the labels, the cost part's trust labels, and ``no_data`` (why the
    headline is None: output tokens unknown, an empty window). A summary that already holds the
    ``throughput`` part (``analytics.summary.summarize`` adds it) answers with that part."""
    parts = summary.get("parts") or {}
    if isinstance(parts.get("throughput"), dict):
        return parts["throughput"]
    window_s = _num((summary.get("window") or {}).get("duration_s"))
    cost = parts.get("cost") or {}
    tokens = _num((cost.get("total") or {}).get("output_tokens"))
    busy_s = _num((parts.get("serving") or {}).get("span_s"))
    out: dict[str, Any] = {
        "label": HEADLINE_LABEL,
        "busy_label": BUSY_LABEL,
        "output_tokens": tokens,
        "window_s": window_s,
        "busy_s": busy_s if busy_s else None,
        "output_tokens_per_s": None,
        "output_tokens_per_s_busy": None,
        "basis": None,
        "busy_basis": None,
        "trust": {"labels": list((cost.get("trust") or {}).get("labels") or []), "notes": []},
        "no_data": None,
    }
    if tokens is None:
        out["no_data"] = "no data: output tokens unknown (no GPU time or no cost part in the window)"
        return out
    if not window_s:
        out["no_data"] = "no data: the window has no length"
        return out
    out["output_tokens_per_s"] = tokens / window_s
    out["basis"] = f"{tokens:,.0f} output tokens over the {duration_text(window_s)} window"
    if busy_s:
        out["output_tokens_per_s_busy"] = tokens / busy_s
        out["busy_basis"] = (
            f"over the {duration_text(busy_s)} with a request in flight "
            f"({busy_s / window_s:.0%} of the window)"
        )
    return out
