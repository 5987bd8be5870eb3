"""One summary of a window: phases, idle time, bimodality, cost and latency, with trust labels.

:func:`summarize` runs every analysis on one window and gathers their results; a part that cannot
be computed (no samples, no requests, an analysis that failed on this data) is left out and named in
``missing`` with the reason — the rest of the summary stands. :func:`format_summary` renders the
JSON form (``Summary.to_dict()``, also what the collector's ``GET /api/v1/analytics/summary``
answers) as readable tables, so ``phaselens analyze`` prints the same whether it ran the analysis
itself or asked the service.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import duckdb

from analytics.trust import Trust
from analytics.window import Window


@dataclass(slots=True)
class Summary:
    """The parts of one window's analysis (each a JSON-able dict), what is missing, and the trust
    labels of the whole."""

    window: Window
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    trust: Trust = field(default_factory=Trust)
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return _json_safe(
            {
                "window": self.window.describe(),
                "trust": self.trust.to_dict(),
                "parts": self.parts,
                "missing": self.missing,
                "seconds": self.seconds,
            }
        )


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set):
        return [_json_safe(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return _json_safe(obj.item())
    return obj


def _as_dict(result: Any) -> dict[str, Any]:
    if hasattr(result, "to_dict"):
        return result.to_dict()
    if isinstance(result, dict):
        return result
    raise TypeError(f"an analysis returned {type(result).__name__}, not a dict or an object with to_dict()")


def _parts(prices: Any, slo: Any, fleet_gpus: int | None) -> list[tuple[str, Callable[..., Any]]]:
    """The analyses of a summary, in order: (name, function of (con, window))."""
    from analytics import attribution, bimodal, cost, latency

    def cost_part(con: duckdb.DuckDBPyConnection, window: Window) -> Any:
        return cost.cost_breakdown(
            con, window, prices if prices is not None else cost.load_prices(), fleet_gpus=fleet_gpus
        )

    def latency_part(con: duckdb.DuckDBPyConnection, window: Window) -> Any:
        return latency.latency_summary(con, window, slo if slo is not None else latency.SloSpec())

    return [
        ("phases", attribution.phase_breakdown),
        ("idle", attribution.idle_split),
        ("bimodal", bimodal.bimodality),
        ("cost", cost_part),
        ("latency", latency_part),
    ]


def summarize(
    con: duckdb.DuckDBPyConnection,
    window: Window,
    *,
    prices: Any = None,
    slo: Any = None,
    fleet_gpus: int | None = None,
) -> Summary:
    """Run every analysis of the summary on ``window``; a part that fails is named in ``missing``."""
    out = Summary(window)
    for name, fn in _parts(prices, slo, fleet_gpus):
        t = time.perf_counter()
        try:
            result = fn(con, window)
        except (ValueError, duckdb.Error, ZeroDivisionError) as e:
            out.missing[name] = f"{type(e).__name__}: {e}"
            continue
        finally:
            out.seconds[name] = time.perf_counter() - t
        part = _as_dict(result)
        out.parts[name] = part
        trust = part.get("trust")
        if isinstance(trust, dict):
            out.trust.merge([Trust(set(trust.get("labels", [])), list(trust.get("notes", [])))])
        for what, why in (part.get("missing") or {}).items() if isinstance(part.get("missing"), dict) else []:
            out.missing.setdefault(f"{name}.{what}", why)
    return out


# -- rendering ------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
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
            ", ".join(f"{k}={_cell(v)}" for k, v in value.items())
            if isinstance(value, dict)
            else ", ".join(map(_cell, value))
        )
    return str(value)


def _table(rows: list[dict[str, Any]], limit: int = 40) -> list[str]:
    cols = list(dict.fromkeys(k for r in rows for k in r if not isinstance(r[k], dict | list)))
    if not cols:
        return []
    shown = rows[:limit]
    cells = [cols] + [[_cell(r.get(c)) for c in cols] for r in shown]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cells[0], widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells[1:]]
    if len(rows) > limit:
        lines.append(f"... {len(rows) - limit} more rows (--json for all)")
    return lines


def _render(obj: Any, indent: str = "") -> list[str]:
    lines: list[str] = []
    if isinstance(obj, dict):
        scalars = {k: v for k, v in obj.items() if not isinstance(v, dict | list) and k != "trust"}
        if scalars:
            width = max(len(k) for k in scalars)
            lines += [f"{indent}{k.ljust(width)}  {_cell(v)}" for k, v in scalars.items()]
        for k, v in obj.items():
            if k == "trust" and isinstance(v, dict):
                lines.append(f"{indent}trust: {', '.join(v.get('labels', [])) or 'no data'}")
                lines += [f"{indent}  note: {n}" for n in v.get("notes", [])]
            elif isinstance(v, list) and v and all(isinstance(r, dict) for r in v):
                lines.append(f"{indent}{k}:")
                lines += [indent + "  " + line for line in _table(v)]
            elif isinstance(v, list):
                lines.append(f"{indent}{k}: {_cell(v)}")
            elif isinstance(v, dict):
                lines.append(f"{indent}{k}:")
                lines += _render(v, indent + "  ")
    return lines


def format_summary(summary: dict[str, Any]) -> str:
    """The summary's JSON form as readable text: the window and its trust labels first, then each part."""
    w = summary["window"]
    start = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(w["start_s"]))
    end = time.strftime("%H:%M:%S", time.gmtime(w["end_s"]))
    trust = summary.get("trust", {})
    lines = [
        f"phaselens analysis — data set {w['dataset']}, {start} – {end} UTC ({w['duration_s']:,.0f} s)",
        f"trust: {', '.join(trust.get('labels', [])) or 'no data'}",
    ]
    lines += [f"  note: {n}" for n in trust.get("notes", [])]
    for name, part in summary.get("parts", {}).items():
        lines += ["", f"== {name} ==", *_render(part)]
    if summary.get("missing"):
        lines += ["", "== missing =="]
        lines += [f"{k}: {v}" for k, v in summary["missing"].items()]
    return "\n".join(lines)
