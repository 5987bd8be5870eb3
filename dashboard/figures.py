"""Plotly figures of the analytics summary: pure functions, a part of the summary's JSON in, a
``go.Figure`` out, no Streamlit — so the dashboard pages and the HTML reports draw the same charts.

Colours mean one thing everywhere: :data:`PHASE_COLOURS` (the GPUs page's phase bands), one colour
per cost category (:data:`COST_COLOURS`, productive ones in their phase's colour, stranded ones a
pale shade of it), and the trust labels' (:data:`TRUST_COLOURS`) written into every chart by
:func:`label_figure`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

PHASE_COLOURS = {"prefill": "#f5a623", "decode": "#4caf50", "mixed": "#ab7ddb", "idle": "#ffffff"}
# Trust labels (analytics/trust.py, docs/STORE.md) -> badge colour (Streamlit's palette) and hex.
TRUST_COLOURS = {
    "measured": ("green", "#2e7d32"),
    "emulated": ("orange", "#e65100"),
    "simulated": ("violet", "#6a1b9a"),
    "host-bound": ("red", "#c62828"),
    "estimated": ("blue", "#1565c0"),
}
TRUST_ORDER = tuple(TRUST_COLOURS)

#: the cost categories of analytics/cost.py, in stacking order, with what to call them
COST_CATEGORIES = (
    "prefill",
    "decode",
    "stranded_prefill",
    "stranded_decode",
    "host_bound",
    "other_busy",
    "idle",
    "unsampled",
)
COST_LABELS = {
    "prefill": "productive prefill",
    "decode": "productive decode",
    "stranded_prefill": "stranded prefill bandwidth",
    "stranded_decode": "stranded decode compute",
    "host_bound": "host-bound",
    "other_busy": "other busy (not engine work)",  # an external fleet's busy time no engine work explains
    "idle": "idle",
    "unsampled": "unsampled (no samples)",  # a gap in the GPU's samples: not known, not idle
}
#: cost categories shown in tables only where the window has time in them (external fleets only)
OPTIONAL_COST = frozenset({"other_busy"})
COST_COLOURS = {
    "prefill": PHASE_COLOURS["prefill"],
    "decode": PHASE_COLOURS["decode"],
    # the waste in red shades (decode's compute, prefill's bandwidth), as on the Overview
    "stranded_prefill": "#ef9a9a",
    "stranded_decode": "#c62828",
    "host_bound": "#8e6bbf",
    "other_busy": "#cdbfe6",  # a paler host-bound: busy with work the engine does not report
    "idle": "#b0b7c3",
    "unsampled": "#e4e7ec",  # paler than idle: time with no data, not waste
}
SM_COLOUR = "#1f2a44"  # SM activity, as on the GPUs page
UTIL_COLOUR = "#d62728"  # utilization %, as on the GPUs page
TTFT_COLOUR = PHASE_COLOURS["prefill"]  # the first token waits on prefill
ITL_COLOUR = "#2e7d32"  # token gaps are decode steps (a darker decode green, readable as a line)
PERCENTILE_DASH = {50: "solid", 90: "dash", 99: "dot"}
SARLE_THRESHOLD = 5.0 / 9.0  # analytics.bimodal.SARLE_THRESHOLD (evidence beside the verdict)
MODE_LABEL_SPAN_PCT = 32.0  # about how much of a histogram's 0..100 % axis a mode's label spans
_GRID = "#eeeeee"


# -- trust labels -------------------------------------------------------------------------------------


def ordered_labels(labels: Iterable[str]) -> list[str]:
    """Trust labels in the fixed order measured, emulated, simulated, host-bound, estimated."""
    given = set(labels)
    return [label for label in TRUST_ORDER if label in given] + sorted(given - set(TRUST_ORDER))


def trust_markup(labels: Iterable[str]) -> str:
    """The trust labels as every chart writes them: upper case, each in its colour, in
    :func:`ordered_labels` order (markup that both Plotly's text and HTML read); empty for none."""
    return " · ".join(
        f"<span style='color:{TRUST_COLOURS.get(lb, ('', '#555'))[1]}'>{lb.upper()}</span>"
        for lb in ordered_labels(labels)
    )


def label_figure(fig: go.Figure, labels: Iterable[str]) -> go.Figure:
    """Write the trust labels into the chart itself (top right), so that a screenshot or an
    exported image still says how far the numbers can be trusted."""
    text = trust_markup(labels)
    if not text:
        return fig
    fig.add_annotation(
        text=f"<b>{text}</b>",
        xref="paper",
        yref="paper",
        x=1.0,
        y=1.0,
        yshift=8,
        xanchor="right",
        yanchor="bottom",
        showarrow=False,
        font={"size": 12},
    )
    return fig


def part_labels(part: Mapping[str, Any] | None) -> list[str]:
    """The trust labels of a summary part (``part["trust"]["labels"]``)."""
    trust = (part or {}).get("trust") or {}
    return list(trust.get("labels") or [])


def _layout(fig: go.Figure, title: str, *, height: int = 380, legend_y: float = -0.22) -> None:
    fig.update_layout(
        title={"text": title, "x": 0, "xanchor": "left", "font": {"size": 15}},
        height=height,
        margin={"l": 70, "r": 20, "t": 56, "b": 40},
        legend={
            "orientation": "h",
            "yanchor": "top",
            "y": legend_y,
            "x": 0,
            "font": {"size": 12},
            "traceorder": "normal",
        },
        plot_bgcolor="white",
    )
    fig.update_xaxes(showgrid=True, gridcolor=_GRID)
    fig.update_yaxes(showgrid=True, gridcolor=_GRID)


def usd_text(v: Any) -> str:
    """Dollars to read: ``$1.14M``, ``$1,234``, ``$12.34``, ``$0.0521`` (three significant digits
    below a dollar), ``< $0.0001`` below that, ``—`` when undefined."""
    x = _num(v)
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


def time_axis_title(simulated: bool) -> str:
    return "virtual time, UTC (simulated)" if simulated else "time, UTC"


def _num(v: Any) -> float:
    """A JSON number as a float (None / NaN / text → NaN)."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float):
        return float(v)
    return math.nan


# -- bimodal ------------------------------------------------------------------------------------------


def verdict_text(row: Mapping[str, Any] | None) -> str:
    """A bimodality row's verdict in words, as the analytics decided it (``verdict``:
    ``analytics.bimodal.bimodal_verdict`` — ``bimodal (dip p < 0.001, two modes)``, ``not bimodal
    (dip p < 0.001 but one mode)``, ...), so the page, the report and ``phaselens analyze`` say one
    thing. Never re-derived here from the p-value."""
    verdict = (row or {}).get("verdict")
    return str(verdict) if verdict else "no verdict (no bimodality row)"


def sarle_text(sarle: float) -> str:
    """Sarle's b against its threshold, worded as evidence, not as a verdict: ``0.41 (below 0.556)``."""
    side = "above" if sarle > SARLE_THRESHOLD else "below"
    return f"{sarle:.2f} ({side} {SARLE_THRESHOLD:.3f})"


def modes_in_words(row: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """A bimodality row's modes as (label, text) — ``("Modes", "0 % (10% of samples) and 24 % (90%)")``
    or ``("One mode", "40 %")`` — or None without a mode (the dashboard and the report say it alike)."""
    row = row or {}
    lo, hi = _num(row.get("mode_low_pct")), _num(row.get("mode_high_pct"))
    if lo != lo:
        return None
    if hi != hi:
        return "One mode", f"{lo:.0f} %"
    w_lo, w_hi = (w if w == w else 0.0 for w in (_num(row.get("weight_low")), _num(row.get("weight_high"))))
    return "Modes", f"{lo:.0f} % ({w_lo:.0%} of samples) and {hi:.0f} % ({w_hi:.0%})"


def bimodal_pool_rows(bimodal: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The bimodality rows (the summary's ``bimodal`` part) of the fleet and of each pool, by pool
    (``fleet`` for all GPUs, as the histogram's groups are keyed)."""
    out: dict[str, dict[str, Any]] = {}
    for row in bimodal.get("table") or []:
        if row.get("scope") == "fleet":
            out["fleet"] = row
        elif row.get("scope") == "pool":
            out[str(row.get("role") or "unknown")] = row
    return out


def _shares_pct(part: Mapping[str, Any]) -> list[float]:
    counts = [float(c) for c in part.get("counts") or []]
    n = sum(counts)
    return [100.0 * c / n for c in counts] if n else [0.0] * len(counts)


def activity_histogram_figure(
    group: Mapping[str, Any],
    edges_pct: Sequence[float],
    bimodal_row: Mapping[str, Any] | None,
    *,
    title: str,
    labels: Iterable[str],
) -> go.Figure:
    """SM activity and utilization % of one pool as overlaid histograms (share of samples per
    bin), the modes (``mode_low_pct`` / ``mode_high_pct`` of the pool's bimodality row: peaks of the
    smoothed histogram; one where the high one is missing) marked, the verdict (:func:`verdict_text`) in the title."""
    edges = [float(e) for e in edges_pct]
    mids = [(a + b) / 2 for a, b in pairwise(edges)]
    width = edges[1] - edges[0] if len(edges) > 1 else 1.0
    fig = go.Figure()
    for key, name, colour, opacity in (
        ("sm_active", "SM activity", SM_COLOUR, 0.75),
        ("gpu_util", "utilization", UTIL_COLOUR, 0.45),
    ):
        part = group.get(key) or {}
        if not part.get("n"):
            continue
        fig.add_trace(
            go.Bar(
                x=mids,
                y=_shares_pct(part),
                width=width,
                name=f"{name} (mean {_num(part.get('mean_pct')):.0f} %)",
                marker={"color": colour, "line": {"width": 0}},
                opacity=opacity,
                hovertemplate=f"{name} %{{x:.0f}} %: %{{y:.1f}} % of samples<extra></extra>",
            )
        )
    row = bimodal_row or {}
    modes = [
        ("low", _num(row.get("mode_low_pct")), _num(row.get("weight_low")), PHASE_COLOURS["decode"]),
        ("high", _num(row.get("mode_high_pct")), _num(row.get("weight_high")), PHASE_COLOURS["prefill"]),
    ]
    one = modes[1][1] != modes[1][1]  # a single mode: no high one
    for i, (which, centre, weight, colour) in enumerate(modes):
        if centre != centre:
            continue
        name = "mode" if one else f"{which} mode"
        fig.add_vline(x=centre, line={"color": colour, "width": 2.5, "dash": "dash"})
        # text on the side away from the other mode, unless it would run off the plot there (two
        # close modes then share a side, one line apart)
        right_side = centre < MODE_LABEL_SPAN_PCT if which == "low" else centre <= 100 - MODE_LABEL_SPAN_PCT
        fig.add_annotation(
            x=centre,
            y=1.0 - 0.09 * i,
            yref="paper",
            text=f"{name} {centre:.0f} %"
            + (f" ({100 * weight:.0f} % of samples)" if weight == weight and not one else ""),
            showarrow=False,
            yanchor="top",
            xanchor="left" if right_side else "right",
            xshift=4 if right_side else -4,
            font={"size": 11, "color": "#333333"},
            bgcolor="rgba(255,255,255,0.85)",
        )
        # a legend entry naming the marker
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="lines",
                name="mode (one)" if one else f"mode ({which})",
                line={"color": colour, "width": 2.5, "dash": "dash"},
                hoverinfo="skip",
            )
        )
    fig.update_layout(barmode="overlay", bargap=0)
    fig.update_xaxes(title_text=f"SM activity or utilization, % ({width:g} % bins)", range=[0, 100])
    fig.update_yaxes(title_text="share of samples, %", rangemode="tozero")
    _layout(fig, f"{title} — {verdict_text(row)}", height=400, legend_y=-0.2)
    return label_figure(fig, labels)


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
    return [c for c in COST_CATEGORIES if c not in OPTIONAL_COST or (_num(total.get(f"{c}_s")) or 0.0) > 0]


def cost_stack(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """Per cost category the dollars of each row (``cost_usd_<category>``; NaN stays NaN)."""
    return {c: [_num(r.get(f"cost_usd_{c}")) for r in rows] for c in COST_CATEGORIES}


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
                marker={"color": COST_COLOURS[c], "line": {"width": 0.5, "color": "#ffffff"}},
                hovertemplate=f"{COST_LABELS[c]}: $%{{y:,.4~f}}{unit}<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack")


def pool_name(pool: Any) -> str:
    return f"{pool} pool" if isinstance(pool, str) and pool else "no pool"


def cost_by_pool_figure(by_pool: Sequence[Mapping[str, Any]], *, labels: Iterable[str]) -> go.Figure:
    """The window's cost per pool, stacked by category, with each pool's total above its bar."""
    x = [pool_name(r.get("pool")) for r in by_pool]
    fig = go.Figure()
    _stack_bars(fig, x, by_pool, "")
    totals = [_num(r.get("cost_usd")) for r in by_pool]
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
    _layout(fig, "Where the money goes, by pool", height=420, legend_y=-0.2)
    return label_figure(fig, labels)


def cost_over_time_figure(
    by_hour: Sequence[Mapping[str, Any]], *, labels: Iterable[str], simulated: bool
) -> go.Figure:
    """Cost per clock hour of the window (UTC), stacked by category."""
    rows = sorted(by_hour, key=lambda r: _num(r.get("hour_start_s")))
    x = [pd.Timestamp(_num(r.get("hour_start_s")), unit="s") for r in rows]
    fig = go.Figure()
    _stack_bars(fig, x, rows, " in this hour")
    fig.update_yaxes(title_text="cost per hour of the window, US $", tickprefix="$", rangemode="tozero")
    fig.update_xaxes(title_text=f"hour, {time_axis_title(simulated)}", type="date")
    _layout(fig, "Cost over time, by category (per clock hour)", height=420, legend_y=-0.3)
    fig.update_layout(xaxis={"dtick": 3_600_000})
    return label_figure(fig, labels)


def annual_figure(annual: Mapping[str, Any], *, labels: Iterable[str]) -> go.Figure:
    """The annualised cost of ``annual["fleet_gpus"]`` GPUs at the observed profile, one bar stacked
    by category."""
    per = annual.get("usd_per_year") or {}
    fig = go.Figure()
    for c in COST_CATEGORIES:
        v = _num(per.get(c))
        if v == 0 or v != v:
            continue
        fig.add_trace(
            go.Bar(
                y=[f"{int(annual.get('fleet_gpus') or 0)} GPUs"],
                x=[v],
                orientation="h",
                name=COST_LABELS[c],
                marker={"color": COST_COLOURS[c], "line": {"width": 0.5, "color": "#ffffff"}},
                hovertemplate=f"{COST_LABELS[c]}: $%{{x:,.0f}} a year<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="US $ per year", tickprefix="$", rangemode="tozero")
    total = _num(annual.get("total_usd_per_year"))
    _layout(fig, f"Annualised: ${total:,.0f} a year", height=230, legend_y=-0.5)
    fig.update_layout(margin={"l": 80, "r": 20, "t": 56, "b": 20})
    return label_figure(fig, labels)


# -- latency ------------------------------------------------------------------------------------------


def _positive(x: float) -> float:
    """A value for a log axis: NaN (a gap) unless > 0."""
    return x if x > 0 else math.nan


def _times(
    rows: Sequence[Mapping[str, Any]], key: str = "bucket_start_s", *, shift_s: float = 0.0
) -> list[pd.Timestamp]:
    return [pd.Timestamp(_num(r.get(key)) + shift_s, unit="s") for r in rows]


def _span(x: Sequence[pd.Timestamp], window_s: tuple[float, float] | None) -> tuple[Any, Any] | None:
    """The x range of a time chart: the window when given, else the data's."""
    if window_s is not None:
        return pd.Timestamp(window_s[0], unit="s"), pd.Timestamp(window_s[1], unit="s")
    return (min(x), max(x)) if x else None


def log_ticks(lo: float, hi: float, *, most: int = 10) -> list[float] | None:
    """The 1-2-5 values (…, 10, 20, 50, 100, …) a log axis from ``lo`` to ``hi`` (> 0) labels, so
    that a line within one decade still has values beside it; None when there would be more than
    ``most`` (the axis then labels powers of ten only)."""
    ticks: list[float] = []
    decade = 10.0 ** math.floor(math.log10(lo / 2))
    while decade <= hi * 2:
        ticks += [m * decade for m in (1, 2, 5) if lo / 2 <= m * decade <= hi * 2]
        decade *= 10
    return [float(f"{t:.6g}") for t in ticks] if len(ticks) <= most else None


def latency_over_time_figure(
    over_time: Sequence[Mapping[str, Any]],
    *,
    labels: Iterable[str],
    simulated: bool,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
    bucket_s: float | None = None,
    window_s: tuple[float, float] | None = None,
) -> go.Figure:
    """TTFT (top) and inter-token latency (bottom) p50 / p90 / p99 per time bucket (at the bucket's
    middle), in ms, over ``window_s`` (log axes where a row spans a decade), with the SLOs as dashed lines (the TPOT SLO bounds
    the mean gap, drawn against ITL for scale)."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1)
    x = _times(over_time, shift_s=(bucket_s or 0.0) / 2)
    span = _span(x, window_s)
    values: dict[int, list[float]] = {1: [], 2: []}
    for row, metric, name, colour, slo in (
        (1, "ttft", "TTFT", TTFT_COLOUR, slo_ttft_s),
        (2, "itl", "ITL", ITL_COLOUR, slo_tpot_s),
    ):
        for p, dash in PERCENTILE_DASH.items():
            y = [_positive(_num(r.get(f"{metric}_p{p}_s")) * 1000) for r in over_time]
            values[row] += [v for v in y if v == v]
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    mode="lines+markers" if len(x) < 30 else "lines",
                    name=f"{name} p{p}",
                    line={"color": colour, "width": 2 if p == 50 else 1.5, "dash": dash},
                    marker={"size": 4},
                    connectgaps=False,
                    hovertemplate=f"{name} p{p}: %{{y:,.1f}} ms<extra></extra>",
                ),
                row=row,
                col=1,
            )
        if slo and span:
            values[row].append(slo * 1000)
            what = "TTFT SLO" if metric == "ttft" else "TPOT SLO"
            # a trace, not a shape: a shape's y on a log axis is in log units
            fig.add_trace(
                go.Scatter(
                    x=list(span),
                    y=[slo * 1000, slo * 1000],
                    mode="lines",
                    name=f"{what} {slo * 1000:g} ms",
                    line={"color": "#555555", "dash": "dash", "width": 1},
                    hovertemplate=f"{what}: %{{y:,.0f}} ms<extra></extra>",
                ),
                row=row,
                col=1,
            )
    # a log axis (powers of ten) when the row's values and SLO span more than a decade, else linear
    for row, name in ((1, "TTFT, ms"), (2, "inter-token latency, ms")):
        v = values[row]
        if v and max(v) >= 10 * min(v):
            ticks = log_ticks(min(v), max(v))
            log_axis = {"tickvals": ticks, "ticktext": [f"{t:,g}" for t in ticks]} if ticks else {"dtick": 1}
            fig.update_yaxes(title_text=f"{name} (log)", type="log", **log_axis, row=row, col=1)
        else:
            fig.update_yaxes(title_text=name, rangemode="tozero", row=row, col=1)
    if span:
        fig.update_xaxes(range=list(span))
    fig.update_xaxes(title_text=time_axis_title(simulated), row=2, col=1)
    per = f" (per {bucket_s:g} s of arrivals)" if bucket_s else ""
    _layout(fig, f"Latency percentiles over time{per}", height=560, legend_y=-0.14)
    fig.update_layout(hovermode="x unified")
    return label_figure(fig, labels)


def attainment_over_time_figure(
    over_time: Sequence[Mapping[str, Any]],
    *,
    labels: Iterable[str],
    simulated: bool,
    target: float = 0.9,
    slo_text: str = "",
    bucket_s: float | None = None,
    window_s: tuple[float, float] | None = None,
) -> go.Figure:
    """The share of requests meeting both SLOs per time bucket (bars a bucket wide, green at or above
    the target, red below) over ``window_s``, the target as a dashed line."""
    x = _times(over_time, shift_s=(bucket_s or 0.0) / 2)
    span = _span(x, window_s)
    shares = [_num(r.get("attainment")) * 100 for r in over_time]
    colours = [
        PHASE_COLOURS["decode"] if s == s and s >= target * 100 else UTIL_COLOUR if s == s else "#cccccc"
        for s in shares
    ]
    counts = [[int(_num(r.get("met")) or 0), int(_num(r.get("requests")) or 0)] for r in over_time]
    fig = go.Figure(
        go.Bar(
            x=x,
            y=shares,
            marker={"color": colours},
            customdata=counts,
            width=bucket_s * 1000 * 0.9 if bucket_s else None,  # ms on a date axis
            name="requests meeting both SLOs",
            hovertemplate="%{y:.0f} % (%{customdata[0]} of %{customdata[1]} requests)<extra></extra>",
        )
    )
    fig.add_hline(
        y=target * 100,
        line={"color": "#555555", "dash": "dash", "width": 1},
        annotation_text=f"target {100 * target:.0f} %",
        annotation_position="top right",
        annotation_font={"size": 11},
        annotation_bgcolor="rgba(255,255,255,0.85)",
    )
    fig.update_yaxes(title_text="requests meeting both SLOs, %", range=[0, 112])
    fig.update_xaxes(title_text=time_axis_title(simulated), range=list(span) if span else None)
    _layout(fig, "SLO attainment over time" + (f" ({slo_text})" if slo_text else ""), height=340)
    fig.update_layout(showlegend=False)
    return label_figure(fig, labels)


def goodput_sweep_figure(result: Mapping[str, Any]) -> go.Figure:
    """A goodput sweep (``phaselens goodput --json``): attainment per offered rate, the target and the
    goodput found."""
    sweep = sorted(result.get("sweep") or [], key=lambda m: _num(m.get("rate_rps")))
    target = _num(result.get("target"))
    rates = [_num(m.get("rate_rps")) for m in sweep]
    shares = [_num(m.get("attainment")) * 100 for m in sweep]
    met = [s == s and s >= target * 100 for s in shares]
    fig = go.Figure(
        go.Scatter(
            x=rates,
            y=shares,
            mode="lines+markers",
            line={"color": "#888888", "width": 1},
            marker={"size": 9, "color": [PHASE_COLOURS["decode"] if m else UTIL_COLOUR for m in met]},
            name="runs of the sweep",
            hovertemplate="%{x:.3g} req/s: %{y:.1f} % meet both SLOs<extra></extra>",
        )
    )
    if target == target:
        fig.add_hline(
            y=target * 100,
            line={"color": "#555555", "dash": "dash", "width": 1},
            annotation_text=f"target {100 * target:.0f} %",
            annotation_position="bottom left",
        )
    good = _num(result.get("goodput_rps"))
    if good == good and good > 0:
        bound = "" if result.get("bounded", True) else "≥ "
        fig.add_vline(
            x=good,
            line={"color": PHASE_COLOURS["decode"], "width": 2},
            annotation_text=f"goodput {bound}{good:.3g} req/s",
            annotation_position="top right",
        )
    fig.update_xaxes(title_text="offered request rate, req/s (log)", type="log")
    fig.update_yaxes(title_text="requests meeting both SLOs, %", range=[0, 105])
    gpus = int(_num(result.get("gpus")) or 1)
    per_gpu = _num(result.get("goodput_rps_per_gpu"))
    _layout(fig, f"Goodput sweep: {per_gpu:.3g} req/s per GPU ({gpus} GPUs)", height=360)
    fig.update_layout(showlegend=False)
    return label_figure(fig, part_labels(result))
