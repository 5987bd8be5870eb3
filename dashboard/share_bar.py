"""Where the GPU-time goes as a stacked bar in plain HTML and CSS (no JavaScript): the Overview's
one chart, drawn without Plotly so that the landing page never loads Streamlit's 4.7 MB Plotly
bundle (docs/BENCHMARKS.md, "dashboard"). Same rows (:func:`dashboard.figures.gpu_time_rows`),
colours (:data:`dashboard.figures.GPU_TIME_COLOURS`), label threshold and trust label as the Plotly
chart of the same data (:func:`dashboard.figures.gpu_time_figure`, in the HTML reports).

Each segment carries ``data-key`` (its category) and ``data-share`` (its share of the row's GPU-time,
0..1) for tests and tools, a ``title`` for the hover, and its share as text where it fits.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dashboard.figures import MIN_LABEL_SHARE, gpu_time_colours, gpu_time_rows, trust_markup
from dashboard.figures.palette import NEUTRAL

AXIS_TITLE = "share of GPU-time, %"
TICKS_PCT = (0, 25, 50, 75, 100)
DARK_TEXT = NEUTRAL["ink_dark"]  # segment text on light colours (white on dark ones: text_colour)
_FONT = "font-family:'Source Sans Pro','Source Sans 3',sans-serif"  # Streamlit's own


def _luminance(colour: str) -> float:
    """WCAG relative luminance of a ``#rrggbb`` colour."""
    h = colour.lstrip("#")
    lin = [
        (c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4)
        for c in (int(h[i : i + 2], 16) / 255 for i in (0, 2, 4))
    ]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def text_colour(background: str) -> str:
    """Dark or white text, whichever has the higher WCAG contrast on the ``#rrggbb`` background."""
    lum = _luminance(background)
    on_white = 1.05 / (lum + 0.05)
    on_dark = (lum + 0.05) / (_luminance(DARK_TEXT) + 0.05)
    return NEUTRAL["white"] if on_white > on_dark else DARK_TEXT


def _pct(share: float) -> str:
    return f"{100 * share:.1f} %"


def trust_html(labels: Iterable[str]) -> str:
    """The trust labels as the Plotly charts write them (:func:`dashboard.figures.trust_markup`)."""
    text = trust_markup(labels)
    return f"<b data-testid='trust'>{text}</b>" if text else ""


def _segments(
    row: str, shares: Mapping[str, float], names: Mapping[str, str], colours: Mapping[str, str]
) -> str:
    out = []
    for key, colour in colours.items():
        share = float(shares.get(key, 0.0) or 0.0)
        if share <= 0:
            continue
        name = names.get(key, key)
        label = f"{100 * share:.0f} %" if share >= MIN_LABEL_SHARE else ""
        out.append(
            f"<div class='pl-seg' data-key='{html.escape(key)}' data-share='{share:.6f}'"
            f" title='{html.escape(f'{name}: {_pct(share)} of GPU-time ({row})')}'"
            f" style='flex:0 0 {100 * share:.4f}%;background:{colour};color:{text_colour(colour)};"
            "display:flex;align-items:center;justify-content:center;overflow:hidden;white-space:nowrap;"
            "font-size:13px;font-weight:600'>"
            f"{label}</div>"
        )
    return "".join(out)


def _legend(names: Mapping[str, str], single: Mapping[str, float] | None, colours: Mapping[str, str]) -> str:
    """The categories in stacking order, with each one's share when there is one bar."""
    items = []
    for key, colour in colours.items():
        name = html.escape(names.get(key, key))
        value = (
            f" <span style='color:{NEUTRAL['reference']}'>{_pct(float(single.get(key, 0.0) or 0.0))}</span>"
            if single
            else ""
        )
        items.append(
            f"<span data-legend='{html.escape(key)}' style='white-space:nowrap;margin-right:16px'>"
            f"<span style='display:inline-block;width:12px;height:12px;background:{colour};"
            f"vertical-align:-1px;margin-right:5px;border:1px solid {NEUTRAL['swatch_border']}'></span>{name}{value}</span>"
        )
    return "".join(items)


def _axis() -> str:
    ticks = []
    for t in TICKS_PCT:
        shift = "0" if t == 0 else "-100%" if t == 100 else "-50%"
        ticks.append(
            f"<span style='position:absolute;left:{t}%;transform:translateX({shift});white-space:nowrap'>{t} %</span>"
        )
    return (
        "<div></div><div style='position:relative;height:18px;border-top:1px solid {NEUTRAL['axis']};"
        f"font-size:12px;color:{NEUTRAL['reference']}'>{''.join(ticks)}</div>"
        f"<div></div><div style='text-align:center;font-size:13px;color:{NEUTRAL['reference']}'>{AXIS_TITLE}</div>"
    )


def gpu_time_html(gpu_time: Mapping[str, Any], pools: Sequence[str] | None, labels: Iterable[str]) -> str:
    """Where the GPU-time goes (``analytics.overview.gpu_time``) as one stacked bar per row of
    :func:`dashboard.figures.gpu_time_rows` (the ``pools`` named, else all GPUs): a legend in
    stacking order (with the shares when there is one bar), each segment labelled with its share
    where it fits (:data:`MIN_LABEL_SHARE`) and titled for the hover, an axis in % and the trust
    ``labels`` at the top right."""
    names = gpu_time.get("names") or {}
    rows = gpu_time_rows(gpu_time, pools)
    colours = gpu_time_colours(rows)
    bars = "".join(
        f"<div style='text-align:right;font-size:14px;padding-right:4px'>{html.escape(row)}</div>"
        f"<div class='pl-bar' data-row='{html.escape(row)}' style='display:flex;height:34px;"
        f"background:{NEUTRAL['track']}'>{_segments(row, shares, names, colours)}</div>"
        for row, shares in rows
    )
    summary = "; ".join(
        f"{row}: " + ", ".join(f"{names.get(k, k)} {_pct(float(s.get(k, 0.0) or 0.0))}" for k in colours)
        for row, s in rows
    )
    return (
        f"<div class='pl-gpu-time' role='img' aria-label='{html.escape(f'{AXIS_TITLE}: {summary}')}'"
        f" style='{_FONT};color:{NEUTRAL['ink']}'>"
        "<div style='display:flex;justify-content:space-between;align-items:flex-start;gap:12px;"
        "margin-bottom:8px'>"
        f"<div style='font-size:13px;line-height:1.9'>{_legend(names, rows[0][1] if len(rows) == 1 else None, colours)}</div>"
        f"<div style='font-size:12px;white-space:nowrap'>{trust_html(labels)}</div></div>"
        "<div style='display:grid;grid-template-columns:max-content 1fr;column-gap:8px;row-gap:10px;"
        f"align-items:center'>{bars}{_axis()}</div></div>"
    )
