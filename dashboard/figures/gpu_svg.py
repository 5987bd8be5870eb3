"""The GPUs page's charts as inline SVG (no JavaScript, no Plotly): one panel per metric over every
GPU, from the service's bucketed series (``GET /api/v1/analytics/gpu-series``).

Plotly's bundle (4.7 MB) and eight ``newPlot`` calls took most of the page's time in a fresh browser
(docs/BENCHMARKS.md, "dashboard"); an SVG panel is a few kB of markup the browser lays out at once. A
heatmap is one PNG (a pixel per GPU and bucket, scaled without smoothing) under SVG axes; lines are
polylines. Hovering a line, a heatmap row or the limit shows its label and figures (SVG ``<title>``).

Each panel is ``<figure class="pl-panel" data-metric data-mode data-y-min data-y-max>``; a line
``<polyline class="pl-line" data-group>``, the power limit ``<polyline class="pl-limit"
data-limit-w>``, a heatmap's group label ``<text class="pl-group">`` — for tests and tools.
"""

from __future__ import annotations

import base64
import html
import io
import math
import warnings
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from dashboard.figures.gpus import (
    LIMIT_COLOUR,
    Group,
    Panel,
    data_span,
    fit_range,
    matrix,
    use_heatmap,
)
from dashboard.figures.palette import NEUTRAL, SIGNAL_COLOURS
from dashboard.figures.text import time_axis_title

WIDTH, HEIGHT = 640, 300
TOP, BOTTOM = 8, 44  # room for the time axis and its title
LEFT_LINES, LEFT_HEAT = 58, 150  # value ticks; group labels
RIGHT_LINES, RIGHT_HEAT = 14, 64  # the colour bar
STRIP = 62  # the power limit's strip above a heatmap
GRID, AXIS, TEXT = NEUTRAL["grid_svg"], NEUTRAL["axis"], NEUTRAL["ink"]
MISSING = NEUTRAL["missing"]  # a heatmap cell without samples
_FONT = 'font-family:"Source Sans Pro","Source Sans 3",sans-serif'  # in single-quoted attributes
# viridis at 9 stops (matplotlib's), interpolated for the heatmaps' colour scale
_VIRIDIS = np.asarray(
    [
        (68, 1, 84), (71, 44, 122), (59, 81, 139), (44, 113, 142), (33, 144, 141),
        (39, 173, 129), (92, 200, 99), (170, 220, 50), (253, 231, 37),
    ],
    dtype=float,
)  # fmt: skip
_TIME_STEPS_S = (
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10_800, 21_600, 43_200, 86_400,
    172_800, 604_800,
)  # fmt: skip


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round values (1, 2, 2.5, 5 x 10^k apart) within ``[lo, hi]``."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step + 1e-9) + 1)]


def time_ticks(t0: float, t1: float, count: int = 6) -> tuple[list[float], str]:
    """Round UTC times within ``[t0, t1]`` (epoch s) and their strftime format."""
    span = max(t1 - t0, 1e-3)
    step = next((s for s in _TIME_STEPS_S if span / s <= count), _TIME_STEPS_S[-1])
    first = math.ceil(t0 / step) * step
    ticks = [first + i * step for i in range(int((t1 - first) // step) + 1)]
    fmt = "%H:%M:%S" if step < 60 else "%H:%M"
    if span > 86_400:
        fmt = "%m-%d %H:%M"
    return ticks, fmt


def _num(v: float, decimals: int) -> str:
    return f"{v:,.{decimals}f}" if abs(v) < 1e6 else f"{v:,.0f}"


def _colours(values: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """RGB rows of ``values`` on the viridis scale from ``lo`` to ``hi`` (MISSING where NaN)."""
    frac = np.clip((values - lo) / (hi - lo if hi > lo else 1.0), 0.0, 1.0)
    pos = np.nan_to_num(frac) * (len(_VIRIDIS) - 1)
    i = np.minimum(pos.astype(int), len(_VIRIDIS) - 2)
    w = (pos - i)[..., None]
    rgb = _VIRIDIS[i] * (1 - w) + _VIRIDIS[i + 1] * w
    missing = np.asarray([int(MISSING[k : k + 2], 16) for k in (1, 3, 5)], dtype=float)
    rgb[~np.isfinite(values)] = missing
    return rgb.round().astype(np.uint8)


def _png(rgb: np.ndarray) -> str:
    from PIL import Image  # Streamlit's own dependency

    buf = io.BytesIO()
    Image.fromarray(rgb, "RGB").save(buf, format="PNG", optimize=False)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


class _Frame:
    """A plot area inside the panel, with its value range and the time range it maps to x."""

    def __init__(self, x0: float, y0: float, w: float, h: float, t0: float, t1: float, lo: float, hi: float):
        self.x0, self.y0, self.w, self.h = x0, y0, w, h
        self.t0, self.t1, self.lo, self.hi = t0, t1, lo, hi

    def x(self, t: np.ndarray | float) -> Any:
        return self.x0 + (np.asarray(t) - self.t0) / (self.t1 - self.t0 or 1.0) * self.w

    def y(self, v: np.ndarray | float) -> Any:
        return self.y0 + self.h - (np.asarray(v) - self.lo) / (self.hi - self.lo or 1.0) * self.h


def _polyline(f: _Frame, t: np.ndarray, v: np.ndarray, attrs: str, *, step: bool = False) -> str:
    """Polylines of the finite runs of ``v`` over ``t`` (a gap breaks the line)."""
    out = []
    ok = np.isfinite(v)
    runs = np.split(np.arange(len(v)), np.flatnonzero(np.diff(ok.astype(int))) + 1)
    for run in runs:
        if not len(run) or not ok[run[0]]:
            continue
        xs, ys = f.x(t[run]), f.y(v[run])
        if step:  # hold each value until the next bucket (a limit is a step, not a ramp)
            xs = np.repeat(xs, 2)[1:]
            xs = np.append(xs, min(f.x(t[run[-1]] + (t[1] - t[0] if len(t) > 1 else 0)), f.x0 + f.w))
            ys = np.repeat(ys, 2)
        pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(xs, ys, strict=True))
        out.append(f"<polyline points='{pts}' {attrs}/>")
    return "".join(out)


def _tick_decimals(ticks: Sequence[float]) -> int:
    """Decimals that tell ``ticks`` apart: none for whole numbers (``4``, not ``4.0``)."""
    for d in range(3):
        if all(abs(v * 10**d - round(v * 10**d)) < 1e-6 for v in ticks):
            return d
    return 3


def _value_axis(f: _Frame, ticks: Sequence[float], unit: str) -> str:
    decimals = _tick_decimals(ticks)
    parts = []
    for v in ticks:
        y = float(f.y(v))
        parts.append(f"<line x1='{f.x0}' x2='{f.x0 + f.w}' y1='{y:.1f}' y2='{y:.1f}' stroke='{GRID}'/>")
        parts.append(
            f"<text x='{f.x0 - 6}' y='{y + 4:.1f}' text-anchor='end' font-size='11' fill='{TEXT}'>"
            f"{_num(v, decimals)}</text>"
        )
    parts.append(
        f"<text x='12' y='{f.y0 + f.h / 2:.1f}' font-size='11' fill='{TEXT}' text-anchor='middle' "
        f"transform='rotate(-90 12 {f.y0 + f.h / 2:.1f})'>{html.escape(unit)}</text>"
    )
    return "".join(parts)


def _time_axis(f: _Frame, simulated: bool) -> str:
    ticks, fmt = time_ticks(f.t0, f.t1)
    base = f.y0 + f.h
    parts = [f"<line x1='{f.x0}' x2='{f.x0 + f.w}' y1='{base}' y2='{base}' stroke='{AXIS}'/>"]
    for t in ticks:
        x = float(f.x(t))
        label = datetime.fromtimestamp(t, UTC).strftime(fmt)
        parts.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{base}' y2='{base + 4}' stroke='{AXIS}'/>")
        parts.append(
            f"<text x='{x:.1f}' y='{base + 16}' text-anchor='middle' font-size='11' fill='{TEXT}'>{label}</text>"
        )
    parts.append(
        f"<text x='{f.x0 + f.w / 2:.1f}' y='{base + 34}' text-anchor='middle' font-size='11' fill='{NEUTRAL['tick']}'>"
        f"{html.escape(time_axis_title(simulated))}</text>"
    )
    return "".join(parts)


def _limit_line(f: _Frame, t: np.ndarray, limit: np.ndarray) -> str:
    top = float(np.nanmax(limit))
    title = f"<title>power limit {top:,.0f} W</title>"
    attrs = (
        f"class='pl-limit' data-limit-w='{top:g}' fill='none' stroke='{LIMIT_COLOUR}' stroke-width='1.4' "
        "stroke-dasharray='6 4'"
    )
    return f"<g>{title}{_polyline(f, t, limit, attrs, step=True)}</g>"


def _lines(
    series: Mapping[str, Any], panel: Panel, groups: Sequence[Group], t, z, limit
) -> tuple[str, list[float]]:
    top = float(np.nanmax(limit)) if limit is not None and np.isfinite(limit).any() else None
    lo, hi = fit_range(z, panel.from_zero, top) or [0.0, 1.0]
    f = _Frame(LEFT_LINES, TOP, WIDTH - LEFT_LINES - RIGHT_LINES, HEIGHT - TOP - BOTTOM, t[0], t[-1], lo, hi)
    parts = [_value_axis(f, nice_ticks(lo, hi), panel.unit)]
    k = 0
    for g in groups:
        block = z[k : k + len(g.rows)]
        k += len(g.rows)
        with np.errstate(all="ignore"):
            mean = np.nanmean(block, axis=0)
        finite = mean[np.isfinite(mean)]
        said = f"mean {_num(float(finite.mean()), panel.decimals)} {panel.unit}" if finite.size else "no data"
        attrs = (
            f"class='pl-line' data-group='{html.escape(g.label, quote=True)}' fill='none' "
            f"stroke='{g.colour}' stroke-width='1.6' stroke-linejoin='round'"
        )
        parts.append(f"<g><title>{html.escape(g.label)}: {said}</title>{_polyline(f, t, mean, attrs)}</g>")
    if top is not None:
        parts.append(_limit_line(f, t, limit))
    parts.append(_time_axis(f, series.get("_simulated", False)))
    return "".join(parts), [lo, hi]


def _heatmap(
    series: Mapping[str, Any], panel: Panel, groups: Sequence[Group], t, z, limit, names: Sequence[str]
) -> tuple[str, list[float]]:
    finite = z[np.isfinite(z)]
    lo = 0.0 if panel.from_zero else float(finite.min())
    hi = float(finite.max())
    has_limit = limit is not None and np.isfinite(limit).any()
    if has_limit:
        hi = max(hi, float(np.nanmax(limit)))
    if hi <= lo:
        hi = lo + 1.0
    strip = STRIP if has_limit else 0
    x0, w = LEFT_HEAT, WIDTH - LEFT_HEAT - RIGHT_HEAT
    half = (t[1] - t[0]) / 2 if len(t) > 1 else 0.5
    f = _Frame(
        x0, TOP + strip, w, HEIGHT - TOP - BOTTOM - strip, t[0] - half, t[-1] + half, 0.0, float(len(z))
    )
    parts = []
    if has_limit:
        with np.errstate(all="ignore"):
            mean = np.nanmean(z, axis=0)
        s_lo, s_hi = fit_range(mean, True, float(np.nanmax(limit))) or [0.0, 1.0]
        s = _Frame(x0, TOP, w, strip - 12, f.t0, f.t1, s_lo, s_hi)
        parts.append(_value_axis(s, nice_ticks(s_lo, s_hi, 2), "W"))
        mean_attrs = f"class='pl-mean' fill='none' stroke='{SIGNAL_COLOURS['sm_active']}' stroke-width='1.4'"
        parts.append(f"<g><title>mean of the GPUs</title>{_polyline(s, t, mean, mean_attrs)}</g>")
        parts.append(_limit_line(s, t, limit))
    rows = _colours(z, lo, hi)
    parts.append(
        f"<image x='{f.x0}' y='{f.y0}' width='{f.w}' height='{f.h}' preserveAspectRatio='none' "
        f"style='image-rendering:pixelated' href='{_png(rows)}'/>"
    )
    k = 0
    row_h = f.h / max(1, len(z))
    for g in groups:
        y_top = f.y0 + k * row_h
        block = z[k : k + len(g.rows)]
        finite_g = block[np.isfinite(block)]
        said = (
            f"mean {_num(float(finite_g.mean()), panel.decimals)} {panel.unit}"
            if finite_g.size
            else "no data"
        )
        gpus = ", ".join(names[k : k + len(g.rows)])
        parts.append(
            f"<g><title>{html.escape(g.label)} ({html.escape(gpus)}): {said}</title>"
            f"<rect x='{f.x0}' y='{y_top:.1f}' width='{f.w}' height='{row_h * len(g.rows):.1f}' fill='transparent'/></g>"
        )
        mid = y_top + row_h * len(g.rows) / 2
        parts.append(
            f"<text class='pl-group' x='{f.x0 - 6}' y='{mid + 4:.1f}' text-anchor='end' font-size='10.5' "
            f"fill='{TEXT}'>{html.escape(g.short)}</text>"
        )
        if k:
            parts.append(
                f"<line x1='{f.x0}' x2='{f.x0 + f.w}' y1='{y_top:.1f}' y2='{y_top:.1f}' stroke='white' stroke-width='1.5'/>"
            )
        k += len(g.rows)
    parts.append(_colour_bar(f, lo, hi, panel))
    parts.append(_time_axis(f, series.get("_simulated", False)))
    return "".join(parts), [lo, hi]


def _colour_bar(f: _Frame, lo: float, hi: float, panel: Panel) -> str:
    x = f.x0 + f.w + 10
    stops = "".join(
        f"<stop offset='{i / (len(_VIRIDIS) - 1):.3f}' stop-color='rgb({r:.0f},{g:.0f},{b:.0f})'/>"
        for i, (r, g, b) in enumerate(_VIRIDIS[::-1])
    )
    gid = f"pl-cb-{panel.metric}"
    parts = [
        f"<defs><linearGradient id='{gid}' x1='0' x2='0' y1='0' y2='1'>{stops}</linearGradient></defs>",
        f"<rect x='{x}' y='{f.y0}' width='10' height='{f.h}' fill='url(#{gid})'/>",
    ]
    ticks = nice_ticks(lo, hi, 4)
    decimals = _tick_decimals(ticks)
    for v in ticks:
        y = f.y0 + f.h - (v - lo) / (hi - lo) * f.h
        parts.append(
            f"<text x='{x + 14}' y='{y + 4:.1f}' font-size='10.5' fill='{TEXT}'>{_num(v, decimals)}</text>"
        )
    return "".join(parts)


def panel_svg(
    series: Mapping[str, Any], panel: Panel, groups: Sequence[Group], *, simulated: bool
) -> str | None:
    """One panel's markup: its title and an SVG of ``panel``'s metric over every GPU of ``series``
    (lines per TP group, or a heatmap past the threshold); None when no GPU has the metric."""
    with warnings.catch_warnings():  # means and maxima of buckets without samples: NaN, as meant
        warnings.simplefilter("ignore", RuntimeWarning)
        return _panel_svg(series, panel, groups, simulated=simulated)


def _panel_svg(
    series: Mapping[str, Any], panel: Panel, groups: Sequence[Group], *, simulated: bool
) -> str | None:
    span = data_span(series)
    rows = [r for g in groups for r in g.rows]
    z = matrix(series, panel.metric, rows)[:, span] * panel.scale
    if not np.isfinite(z).any():
        return None
    half = float(series.get("bucket_s") or 0.0) / 2
    t = np.asarray(series["times_s"][span], dtype=float) + half
    limit = None
    if panel.metric == "power_w":
        lim = matrix(series, "power_limit_w", rows)[:, span]
        if np.isfinite(lim).any():
            with np.errstate(all="ignore"):
                limit = np.nanmax(lim, axis=0)
    data = dict(series) | {"_simulated": simulated}
    heat = use_heatmap(series)
    if heat:
        gpus = series.get("gpus") or []
        names = [f"GPU {gpus[r].get('index')}" for r in rows]
        body, (lo, hi) = _heatmap(data, panel, groups, t, z, limit, names)
    else:
        body, (lo, hi) = _lines(data, panel, groups, t, z, limit)
    title = f"{panel.title}, {panel.unit}"
    return (
        f"<figure class='pl-panel' data-metric='{panel.metric}' data-mode='{'heatmap' if heat else 'lines'}' "
        f"data-y-min='{lo:g}' data-y-max='{hi:g}' style='margin:0 0 18px 0;{_FONT}'>"
        f"<figcaption style='font-weight:600;font-size:15px;margin:0 0 4px 4px;color:{TEXT}'>{html.escape(title)}</figcaption>"
        f"<svg viewBox='0 0 {WIDTH} {HEIGHT}' width='100%' role='img' aria-label='{html.escape(title, quote=True)}' "
        f"style='display:block;{_FONT}'>{body}</svg></figure>"
    )


def panels_html(
    series: Mapping[str, Any], panels: Sequence[Panel], groups: Sequence[Group], *, simulated: bool
) -> tuple[str, int]:
    """Every panel with data in a two-column grid, and how many there are."""
    drawn = [p for p in (panel_svg(series, panel, groups, simulated=simulated) for panel in panels) if p]
    grid = (
        "<div class='pl-gpu-panels' style='display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));"
        f"column-gap:28px'>{''.join(drawn)}</div>"
    )
    return grid, len(drawn)
