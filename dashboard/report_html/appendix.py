"""What is missing and why, and the appendix: every part's detailed tables, folded (generic
tables of the summary's JSON, with units and times in words)."""

from __future__ import annotations

import json
import math
import numbers
from decimal import Decimal
from typing import Any

from dashboard.report_html.labels import field_label, field_unit, is_field_name
from dashboard.report_html.text import badge, esc, utc_text

_ID_COLUMNS = ("pool", "role", "scope", "worker", "gpu", "model", "metric", "name")
_TIME_COLUMNS = ("hour_s", "hour_start_s", "bucket_start_s", "start_s")
_WIDE_COLUMNS = 10  # a table wider than this, with at most _SIDEWAYS_ROWS rows, is shown on its side
_SIDEWAYS_ROWS = 12
_MAX_TABLE_ROWS = 200
_TIME_LABELS = {
    "hour_s": "Hour (UTC)",
    "hour_start_s": "Hour (UTC)",
    "bucket_start_s": "Bucket start (UTC)",
    "start_s": "Start (UTC)",
    "end_s": "End (UTC)",
    "ts_s": "Time (UTC)",
}
_APPENDIX_PARTS = ("phases", "idle", "bimodal", "cost", "annual", "latency")


def missing_section(summary: dict[str, Any], heading: str = "What is missing") -> str:
    """The analyses' missing items (and the histogram's), each with its reason."""
    items = [(str(k), str(v)) for k, v in (summary.get("missing") or {}).items()]
    items += [("histogram", str(m)) for m in (summary.get("histogram") or {}).get("missing") or []]
    by_reason: dict[str, list[str]] = {}  # one line per reason, naming every analysis it stopped
    for key, why in items:
        names = by_reason.setdefault(why, [])
        if _what(key) not in names:
            names.append(_what(key))
    if not by_reason:
        return ""
    lis = "".join(f"<li><b>{esc(', '.join(k))}</b>: {esc(v)}</li>" for v, k in by_reason.items())
    return f"<section><h2>{esc(heading)}</h2><ul>{lis}</ul></section>"


def _what(key: str) -> str:
    """``cost.0`` → ``cost``, ``phases.fits`` → ``phases, fits``."""
    head, _, tail = key.partition(".")
    return head if not tail or tail.isdigit() else f"{head}, {tail.replace('_', ' ')}"


def appendix_section(summary: dict[str, Any]) -> str:
    """Each part's detailed tables, folded; the notes on how the figures were made."""
    parts = summary.get("parts") or {}
    window = summary.get("window")
    folds = []
    for name in [*_APPENDIX_PARTS, *(p for p in parts if p not in _APPENDIX_PARTS)]:
        part = parts.get(name)
        if not part:
            continue
        folds.append(f"<details><summary>{esc(_humanize(name))}</summary>{_value(part, 3, window)}</details>")
    notes = (summary.get("trust") or {}).get("notes") or []
    if notes:
        lis = "".join(f"<li>{esc(str(n))}</li>" for n in notes)
        folds.append(
            f'<details><summary>How these figures were made</summary><ul class="meta">{lis}</ul></details>'
        )
    if not folds:
        return ""
    return "<section><h2>Appendix: the detailed tables</h2>" + "".join(folds) + "</section>"


# -- generic tables of the appendix -------------------------------------------------------------------


def _value(value: Any, depth: int, window: Any = None) -> str:
    if isinstance(value, dict):
        out = []
        trust = value.get("trust")
        if isinstance(trust, dict) and "labels" in trust:
            badges = "".join(badge(lb) for lb in trust.get("labels") or [])
            out.append(f"<p>{badges}</p>" if badges else "")
        skip = {"trust"} | ({"window"} if window is not None and value.get("window") == window else set())
        scalars = {
            k: v for k, v in value.items() if k not in skip and not isinstance(v, dict) and not _is_table(v)
        }
        notes = {k: v for k, v in scalars.items() if isinstance(v, list) and k in ("notes", "missing")}
        scalars = {k: v for k, v in scalars.items() if k not in notes}
        if scalars:
            rows = "".join(f"<tr><th>{esc(_humanize(k))}</th>{_cell(v, k)}</tr>" for k, v in scalars.items())
            out.append(f"<table>{rows}</table>")
        for k, items in notes.items():
            if items:
                lis = "".join(f"<li>{esc(str(x))}</li>" for x in items)
                out.append(f'<p class="meta">{esc(_humanize(k))}:</p><ul class="meta">{lis}</ul>')
        for k, v in value.items():
            if k in scalars or k in notes or k in skip or v in ({}, [], None):
                continue
            tag = f"h{min(depth + 1, 6)}"
            out.append(f"<{tag}>{esc(_humanize(k))}</{tag}>{_value(v, depth + 1, window)}")
        return "".join(out)
    if _is_table(value):
        return _table(value)
    text, _ = _fmt(value)
    return f"<p>{esc(text)}</p>"


def _table(rows: list[dict[str, Any]]) -> str:
    """A list of dicts as a table; a wide one with few rows turned on its side (a column per row)."""
    cols: list[str] = []
    for row in rows:
        cols += [k for k in row if k not in cols]
    if len(cols) > _WIDE_COLUMNS and len(rows) <= _SIDEWAYS_ROWS:
        head = "<th></th>" + "".join(f"<th>{esc(_row_label(r, i))}</th>" for i, r in enumerate(rows))
        body = "".join(
            f"<tr><th>{esc(_humanize(c))}</th>" + "".join(_cell(r.get(c), c) for r in rows) + "</tr>"
            for c in cols
        )
        return f'<div class="wide"><table><tr>{head}</tr>{body}</table></div>'
    shown = rows[:_MAX_TABLE_ROWS]
    head = "".join(f"<th>{esc(_humanize(c))}</th>" for c in cols)
    body = "".join("<tr>" + "".join(_cell(row.get(c), c) for c in cols) + "</tr>" for row in shown)
    more = (
        f'<p class="meta">{len(rows) - len(shown):,} more rows in the JSON below.</p>'
        if len(rows) > len(shown)
        else ""
    )
    return f'<div class="wide"><table><tr>{head}</tr>{body}</table></div>{more}'


def _row_label(row: dict[str, Any], i: int) -> str:
    parts = [
        str(row[c]).replace("_", " ") if is_field_name(str(row[c])) else str(row[c])  # pool_hour: pool hour
        for c in _ID_COLUMNS
        if isinstance(row.get(c), str | int) and not isinstance(row.get(c), bool)
    ]
    for c in _TIME_COLUMNS:
        if _is_time(c, row.get(c)):
            parts.append(utc_text(float(row[c]), "%H:%M"))
    return " · ".join(parts[:2]) or f"#{i + 1}"


def _is_table(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _humanize(key: str) -> str:
    """A field's label with its unit (``labels.field_label``); a time column says UTC."""
    if _TIME_LABELS.get(str(key)):
        return _TIME_LABELS[str(key)]
    return field_label(str(key))


def _is_time(key: str, v: Any) -> bool:
    """An epoch-seconds field (``start_s``, ``hour_s``, ``bucket_start_s``, ...)."""
    return (
        isinstance(v, numbers.Real)
        and not isinstance(v, bool)
        and key.endswith("_s")
        and (key[:-2].endswith(("start", "end", "hour", "ts", "time")) or key in ("hour_s", "ts_s"))
        and 1e9 < v < 1e11
    )


def _fmt(v: Any, key: str = "") -> tuple[str, bool]:
    """A cell's text and whether it is a number."""
    if isinstance(v, bool) or v is None:
        return ("—" if v is None else str(v).lower()), False
    if _is_time(key, v):
        return utc_text(float(v), "%Y-%m-%d %H:%M:%S"), False
    unit = field_unit(key) if key and isinstance(v, numbers.Real) else None
    if unit is not None and unit.scale != 1.0:
        v = float(v) * unit.scale
    if isinstance(v, numbers.Integral):
        return f"{int(v):,}", True
    if isinstance(v, numbers.Real | Decimal):  # numpy's float32 and DuckDB's DECIMAL too
        return number_text(float(v)), math.isfinite(float(v))
    if isinstance(v, list) and all(not isinstance(x, dict | list) for x in v):
        return ", ".join(_fmt(x)[0] for x in v) or "—", False
    if isinstance(v, dict | list):
        return json.dumps(_human_numbers(v), default=str)[:300], False
    return str(v), False


def _human_numbers(v: Any) -> Any:
    """``v`` with every float inside it as :func:`number_text` writes it (a nested cell is shown as
    JSON, which would write ``1.2e-05``)."""
    if isinstance(v, numbers.Real | Decimal) and not isinstance(v, numbers.Integral):
        return number_text(float(v))
    if isinstance(v, dict):
        return {k: _human_numbers(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_human_numbers(x) for x in v]
    return v


def _cell(v: Any, key: str = "") -> str:
    text, num = _fmt(v, key)
    return f'<td class="num">{esc(text)}</td>' if num else f"<td>{esc(text)}</td>"


def number_text(v: float) -> str:
    """A number for people: ``1,234``, ``9.06``, ``0.042``, ``< 0.001`` (never ``1.2e-05`` or
    ``0.0000``), ``0``; ``—`` when not finite."""
    if not math.isfinite(v):
        return "—"
    a = abs(v)
    if a == 0:
        return "0"
    if a < 0.001:
        return "< 0.001" if v > 0 else "> -0.001"
    return f"{v:,.0f}" if a >= 1000 else f"{v:.3g}"
