"""The roofline section: MFU and MBU per pool and phase, and stranded compute / bandwidth, each with
its trust label (the ``roofline`` part of the summary, analytics/roofline.py)."""

from __future__ import annotations

from typing import Any

from dashboard.report_html.text import badge, esc


def _table(rows: list[dict[str, str]]) -> str:
    if not rows:
        return ""
    head = "".join(f"<th>{esc(k)}</th>" for k in rows[0])
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{''.join(badge(x.strip()) for x in v.split(','))}</td>"
            if k == "trust"
            else f'<td class="num">{esc(v)}</td>'
            if k not in ("pool", "phase")
            else f"<td>{esc(v)}</td>"
            for k, v in r.items()
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def roofline_section(summary: dict[str, Any]) -> str:
    """MFU/MBU per pool and phase beside the activities, then the stranded GPU-seconds per pool."""
    from dashboard.roofline import STRANDED_TEXT, roofline_labels, roofline_rows, stranded_rows

    part = (summary.get("parts") or {}).get("roofline") or {}
    out = ["<section><h2>Against the roofline</h2>"]
    why = (summary.get("missing") or {}).get("roofline")
    if not part:
        out.append(
            f'<p class="empty">No MFU / MBU: {esc(str(why or "no iteration carries a work count"))}</p>'
        )
        return "".join(out) + "</section>"
    out.append('<p class="meta">' + "".join(badge(lb) for lb in roofline_labels(part)) + "</p>")
    out.append(f'<p class="meta">{esc(STRANDED_TEXT)}</p>')
    out.append(_table(roofline_rows(part)))
    out.append("<h3>Stranded compute and bandwidth</h3>")
    out.append(_table(stranded_rows(part)))
    notes = (part.get("trust") or {}).get("notes") or []
    out += [f'<p class="meta">{esc(n)}</p>' for n in notes]
    return "".join(out) + "</section>"
