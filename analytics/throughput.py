"""Output tokens/s of a window: one headline figure, and the rate while serving under its own name.

* **Output tokens/s (window average)** — the headline everywhere (``phaselens analyze``, the
  summary's ``throughput`` part, the Overview tile and ``GET /api/v1/analytics/overview``, the HTML
  report, ``rate(phaselens_tokens_total{side="output"})`` of ``/metrics``): output tokens generated in the
  window ÷ the seconds of the window the GPUs were observed (``observed_s``: the window's length,
  or the cost part's GPU-seconds ÷ its GPUs where the data covers less of it — a collector started
  ten minutes into an hour's window). So the fleet's figure is the cost part's output tokens/s per
  GPU × its GPUs, never a rate diluted by time nothing was observed.
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
#: observed for at least this share of the window, the text calls it the whole window (sampling's edges)
OBSERVED_WHOLE = 0.98
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
    observed_s = observed_seconds(cost, window_s)
    busy_s = _num((parts.get("serving") or {}).get("span_s"))
    out: dict[str, Any] = {
        "label": HEADLINE_LABEL,
        "busy_label": BUSY_LABEL,
        "output_tokens": tokens,
        "window_s": window_s,
        "observed_s": observed_s,
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
    if not window_s or not observed_s:
        out["no_data"] = "no data: the window has no length"
        return out
    out["output_tokens_per_s"] = tokens / observed_s
    out["basis"] = f"{tokens:,.0f} output tokens over the {duration_text(window_s)} window"
    whole = observed_s >= OBSERVED_WHOLE * window_s
    if not whole:
        out["basis"] = (
            f"{tokens:,.0f} output tokens over the {duration_text(observed_s)} of the "
            f"{duration_text(window_s)} window with its GPUs observed"
        )
    if busy_s:
        out["output_tokens_per_s_busy"] = tokens / busy_s
        out["busy_basis"] = (
            f"over the {duration_text(busy_s)} with a request in flight "
            f"({min(busy_s / observed_s, 1.0):.0%} of the {'window' if whole else 'observed time'})"
        )
    return out


def observed_seconds(cost: dict[str, Any], window_s: float | None) -> float | None:
    """The seconds of the window its GPUs were observed: the cost part's GPU-seconds ÷ its GPUs
    (sampled time and the gaps inside it), at most the window's length; the window's length where
    the cost part has no GPU time."""
    gpu_s = _num((cost.get("total") or {}).get("gpu_seconds"))
    gpus = len(cost.get("by_gpu") or [])
    if not window_s or not gpu_s or not gpus:
        return window_s
    return min(window_s, gpu_s / gpus)
