"""Where the GPU-time and the money go: the GPU-time bars, cost by pool, per hour and annualised."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from dashboard.figures.palette import NEUTRAL
from dashboard.figures.style import (
    COST_CATEGORIES,
    COST_COLOURS,
    COST_LABELS,
    OPTIONAL_COST,
    apply_layout,
    label_figure,
)
from dashboard.figures.text import as_float, time_axis_title, usd_text

# -- where the GPU-time goes ----------------------------------------------------------------------------

#: analytics.overview.GPU_TIME's keys -> colour
GPU_TIME_COLOURS = {  # the Cost page's colours (COST_COLOURS), so a category looks the same on every page
    "productive_prefill": COST_COLOURS["prefill"],
    "productive_decode": COST_COLOURS["decode"],
    "stranded": COST_COLOURS["stranded_decode"],
    "host_bound": COST_COLOURS["host_bound"],
    "other_busy": COST_COLOURS["other_busy"],
    "idle": COST_COLOURS["idle"],
    "unsampled": COST_COLOURS["unsampled"],
}
MIN_LABEL_SHARE = 0.06  # a bar segment narrower than this carries no text (it would overlap)
#: GPU-time categories shown only where some row has time in them (no data, not a kind of waste)
OPTIONAL_GPU_TIME = frozenset({"unsampled", "other_busy"})


def gpu_time_colours(rows: Sequence[tuple[str, Mapping[str, float]]]) -> dict[str, str]:
    """:data:`GPU_TIME_COLOURS` of the categories a chart of ``rows`` shows: all but the optional
    ones (unsampled time) no row has a share of."""
    return {
        k: c
        for k, c in GPU_TIME_COLOURS.items()
        if k not in OPTIONAL_GPU_TIME or any(float(s.get(k, 0.0) or 0.0) > 0 for _, s in rows)
    }


def gpu_time_rows(
    gpu_time: Mapping[str, Any], pools: Sequence[str] | None, *, with_fleet: bool = False
) -> list[tuple[str, Mapping[str, float]]]:
    """The bars of a GPU-time chart, (name, shares by :data:`GPU_TIME_COLOURS` key): the ``pools``
    named (or all GPUs when none of them has data), all GPUs first with ``with_fleet``."""
    rows: list[tuple[str, Mapping[str, float]]] = []
    per_pool = gpu_time.get("per_pool") or {}
    if pools:
        rows = [(f"{p} pool", per_pool[p]) for p in pools if p in per_pool]
    if not rows or (with_fleet and len(rows) > 1):
        rows.insert(0, ("all GPUs", gpu_time["shares"]))
    return rows


def gpu_time_figure(
    gpu_time: Mapping[str, Any],
    pools: Sequence[str] | None,
    labels: Iterable[str],
    *,
    with_fleet: bool = False,
) -> go.Figure:
    """Where GPU-time goes (``analytics.overview.gpu_time``): a stacked horizontal bar per row of
    :func:`gpu_time_rows`. (The Overview draws the same bars without Plotly: ``dashboard.share_bar``.)"""
    names = gpu_time.get("names") or {}
    rows = gpu_time_rows(gpu_time, pools, with_fleet=with_fleet)
    fig = go.Figure()
    for key, colour in gpu_time_colours(rows).items():
        xs = [100 * shares.get(key, 0.0) for _, shares in rows]
        fig.add_trace(
            go.Bar(
                y=[name for name, _ in rows],
                x=xs,
                name=names.get(key, key),
                orientation="h",
                marker_color=colour,
                text=[f"{x:.0f} %" if x >= 100 * MIN_LABEL_SHARE else "" for x in xs],
                textposition="inside",
                insidetextanchor="middle",
                hovertemplate=f"{names.get(key, key)}: %{{x:.1f}} %<extra>%{{y}}</extra>",
            )
        )
    # the legend under the axis (px from the plot's bottom, as a share of its height), so that it
    # never runs into the trust label at the top right
    plot_px = 40 + 46 * len(rows)
    fig.update_layout(
        barmode="stack",
        height=plot_px + 36 + 96,
        margin={"l": 10, "r": 10, "t": 36, "b": 96},
        xaxis={"title": {"text": "share of GPU-time, %"}, "range": [0, 100.5], "ticksuffix": " %"},
        yaxis={"automargin": True, "autorange": "reversed"},
        legend={
            "orientation": "h",
            "yanchor": "top",
            "y": -52 / plot_px,
            "x": 0,
            "font": {"size": 12},
            "traceorder": "normal",
        },
        plot_bgcolor="white",
        uniformtext={"minsize": 10, "mode": "hide"},
    )
    return label_figure(fig, labels)


# -- cost ---------------------------------------------------------------------------------------------


def cost_categories(total: Mapping[str, Any]) -> list[str]:
    """The cost categories a table of ``total`` (a cost row) lists: every one, but those of
    :data:`OPTIONAL_COST` without GPU time."""
    return [
        c for c in COST_CATEGORIES if c not in OPTIONAL_COST or (as_float(total.get(f"{c}_s")) or 0.0) > 0
    ]


def cost_stack(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """Per cost category the dollars of each row (``cost_usd_<category>``; NaN stays NaN)."""
    return {c: [as_float(r.get(f"cost_usd_{c}")) for r in rows] for c in COST_CATEGORIES}


def _stack_bars(fig: go.Figure, x: Sequence[Any], rows: Sequence[Mapping[str, Any]], unit: str) -> None:
    stack = cost_stack(rows)
    for c in COST_CATEGORIES:
        if all(v == 0 or v != v for v in stack[c]):
            continue
        fig.add_trace(
            go.Bar(
                x=list(x),
                y=stack[c],
                name=COST_LABELS[c],
                marker={"color": COST_COLOURS[c], "line": {"width": 0.5, "color": NEUTRAL["white"]}},
                hovertemplate=f"{COST_LABELS[c]}: $%{{y:,.4~f}}{unit}<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack")


def pool_name(pool: Any) -> str:
    """A pool as the charts name it: ``prefill pool``, ``no pool``."""
    return f"{pool} pool" if isinstance(pool, str) and pool else "no pool"


def cost_by_pool_figure(by_pool: Sequence[Mapping[str, Any]], *, labels: Iterable[str]) -> go.Figure:
    """The window's cost per pool, stacked by category, with each pool's total above its bar."""
    x = [pool_name(r.get("pool")) for r in by_pool]
    fig = go.Figure()
    _stack_bars(fig, x, by_pool, "")
    totals = [as_float(r.get("cost_usd")) for r in by_pool]
    fig.add_trace(
        go.Scatter(
            x=x,
            y=totals,
            mode="text",
            text=[usd_text(t) if t == t else "unpriced" for t in totals],
            textposition="top center",
            showlegend=False,
            hoverinfo="skip",
        )
    )
    top = max((t for t in totals if t == t), default=0.0)
    fig.update_yaxes(title_text="cost in the window, US $", tickprefix="$", range=[0, top * 1.18 or 1])
    fig.update_xaxes(title_text="pool")
    apply_layout(fig, "Where the money goes, by pool", height=420, legend_y=-0.2)
    return label_figure(fig, labels)


def period_text(period_s: float) -> str:
    """A period in words: ``10 s``, ``5 min``, ``hour``."""
    if period_s >= 3600:
        return "hour" if period_s == 3600 else f"{period_s / 3600:g} h"
    return f"{period_s / 60:g} min" if period_s >= 60 else f"{period_s:g} s"


def cost_over_time_figure(
    rows: Sequence[Mapping[str, Any]],
    *,
    labels: Iterable[str],
    simulated: bool,
    period_s: float = 3600.0,
) -> go.Figure:
    """Cost per period of ``period_s`` seconds (the summary's ``by_period``, or its ``by_hour`` at
    3600: a clock hour, UTC), stacked by category, each bar centred on its period."""
    rows = sorted(rows, key=lambda r: as_float(r.get("hour_start_s")))
    x = [pd.Timestamp(as_float(r.get("hour_start_s")) + period_s / 2, unit="s") for r in rows]
    what = period_text(period_s)
    fig = go.Figure()
    _stack_bars(fig, x, rows, f" in this {what}")
    fig.update_traces(width=period_s * 1000 * 0.9, selector={"type": "bar"})  # ms on a date axis
    fig.update_yaxes(title_text=f"cost per {what} of the window, US $", tickprefix="$", rangemode="tozero")
    fig.update_xaxes(title_text=time_axis_title(simulated), type="date")
    per = "per clock hour" if period_s == 3600 else f"per {what}"
    apply_layout(fig, f"Cost over time, by category ({per})", height=420, legend_y=-0.3)
    return label_figure(fig, labels)


def annual_figure(annual: Mapping[str, Any], *, labels: Iterable[str]) -> go.Figure:
    """The annualised cost of ``annual["fleet_gpus"]`` GPUs at the observed profile, one bar stacked
    by category."""
    per = annual.get("usd_per_year") or {}
    fig = go.Figure()
    for c in COST_CATEGORIES:
        v = as_float(per.get(c))
        if v == 0 or v != v:
            continue
        fig.add_trace(
            go.Bar(
                y=[f"{int(annual.get('fleet_gpus') or 0)} GPUs"],
                x=[v],
                orientation="h",
                name=COST_LABELS[c],
                marker={"color": COST_COLOURS[c], "line": {"width": 0.5, "color": NEUTRAL["white"]}},
                hovertemplate=f"{COST_LABELS[c]}: $%{{x:,.0f}} a year<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="US $ per year", tickprefix="$", rangemode="tozero")
    total = as_float(annual.get("total_usd_per_year"))
    apply_layout(fig, f"Annualised: ${total:,.0f} a year", height=230, legend_y=-0.5)
    fig.update_layout(margin={"l": 80, "r": 20, "t": 56, "b": 20})
    return label_figure(fig, labels)
