"""Latency over time (TTFT and ITL percentiles against the SLOs), SLO attainment over time and a
goodput sweep."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.figures.palette import NEUTRAL
from dashboard.figures.style import (
    ITL_COLOUR,
    MET_COLOUR,
    MISSED_COLOUR,
    PERCENTILE_DASH,
    TTFT_COLOUR,
    apply_layout,
    label_figure,
    part_labels,
)
from dashboard.figures.text import as_float, time_axis_title


def _positive(x: float) -> float:
    """A value for a log axis: NaN (a gap) unless > 0."""
    return x if x > 0 else math.nan


def _times(
    rows: Sequence[Mapping[str, Any]], key: str = "bucket_start_s", *, shift_s: float = 0.0
) -> list[pd.Timestamp]:
    return [pd.Timestamp(as_float(r.get(key)) + shift_s, unit="s") for r in rows]


def _span(
    x: Sequence[pd.Timestamp], window_s: tuple[float, float] | None, bucket_s: float | None = None
) -> tuple[Any, Any] | None:
    """The x range of a time chart, fitted to the data: the first bucket's start to the last one's
    end (x holds bucket middles), never wider than ``window_s`` (a live hour whose data fills its last
    minutes is not drawn as an empty hour); the window when there is no data."""
    if not x:
        if window_s is None:
            return None
        return pd.Timestamp(window_s[0], unit="s"), pd.Timestamp(window_s[1], unit="s")
    half = pd.Timedelta(seconds=(bucket_s or 0.0) / 2)
    lo, hi = min(x) - half, max(x) + half
    if window_s is not None:
        lo = max(lo, pd.Timestamp(window_s[0], unit="s"))
        hi = min(hi, pd.Timestamp(window_s[1], unit="s"))
    return lo, hi


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
    """TTFT (top), time per output token (middle) and inter-token latency (bottom) p50 / p90 / p99
    per time bucket (at the bucket's middle), in ms, over the data's span within ``window_s`` (log
    axes where a row spans a decade), each SLO as a dashed line on the one metric it bounds: the TTFT
    SLO on TTFT, the TPOT SLO (a request's mean gap between tokens) on TPOT. ITL — single gaps, whose
    p99 may sit far above a met TPOT SLO — has no SLO line."""
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.07)
    x = _times(over_time, shift_s=(bucket_s or 0.0) / 2)
    span = _span(x, window_s, bucket_s)
    values: dict[int, list[float]] = {1: [], 2: [], 3: []}
    for row, metric, name, colour, slo in (
        (1, "ttft", "TTFT", TTFT_COLOUR, slo_ttft_s),
        (2, "tpot", "TPOT", ITL_COLOUR, slo_tpot_s),
        (3, "itl", "ITL", ITL_COLOUR, None),
    ):
        for p, dash in PERCENTILE_DASH.items():
            y = [_positive(as_float(r.get(f"{metric}_p{p}_s")) * 1000) for r in over_time]
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
            what = f"{name} SLO"
            # a trace, not a shape: a shape's y on a log axis is in log units
            fig.add_trace(
                go.Scatter(
                    x=list(span),
                    y=[slo * 1000, slo * 1000],
                    mode="lines",
                    name=f"{what} {slo * 1000:g} ms",
                    line={"color": NEUTRAL["reference"], "dash": "dash", "width": 1},
                    hovertemplate=f"{what}: %{{y:,.0f}} ms<extra></extra>",
                ),
                row=row,
                col=1,
            )
    # a log axis (powers of ten) when the row's values and SLO span more than a decade, else linear
    for row, name in ((1, "TTFT, ms"), (2, "TPOT, ms"), (3, "inter-token latency, ms")):
        v = values[row]
        if v and max(v) >= 10 * min(v):
            ticks = log_ticks(min(v), max(v))
            log_axis = {"tickvals": ticks, "ticktext": [f"{t:,g}" for t in ticks]} if ticks else {"dtick": 1}
            fig.update_yaxes(title_text=f"{name} (log)", type="log", **log_axis, row=row, col=1)
        else:
            fig.update_yaxes(title_text=name, rangemode="tozero", row=row, col=1)
    if span:
        fig.update_xaxes(range=list(span))
    fig.update_xaxes(title_text=time_axis_title(simulated), row=3, col=1)
    per = f" (per {bucket_s:g} s of arrivals)" if bucket_s else ""
    apply_layout(fig, f"Latency percentiles over time{per}", height=720, legend_y=-0.1)
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
    the target, red below) over the data's span within ``window_s``, the target as a dashed line."""
    x = _times(over_time, shift_s=(bucket_s or 0.0) / 2)
    span = _span(x, window_s, bucket_s)
    shares = [as_float(r.get("attainment")) * 100 for r in over_time]
    colours = [
        MET_COLOUR if s == s and s >= target * 100 else MISSED_COLOUR if s == s else NEUTRAL["no_value"]
        for s in shares
    ]
    counts = [[int(as_float(r.get("met")) or 0), int(as_float(r.get("requests")) or 0)] for r in over_time]
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
        line={"color": NEUTRAL["reference"], "dash": "dash", "width": 1},
        annotation_text=f"target {100 * target:.0f} %",
        annotation_position="top right",
        annotation_font={"size": 11},
        annotation_bgcolor=NEUTRAL["label_bg"],
    )
    fig.update_yaxes(title_text="requests meeting both SLOs, %", range=[0, 112])
    fig.update_xaxes(title_text=time_axis_title(simulated), range=list(span) if span else None)
    apply_layout(fig, "SLO attainment over time" + (f" ({slo_text})" if slo_text else ""), height=340)
    fig.update_layout(showlegend=False)
    return label_figure(fig, labels)


def goodput_sweep_figure(result: Mapping[str, Any]) -> go.Figure:
    """A goodput sweep (``phaselens goodput --json``): attainment per offered rate, the target and the
    goodput found."""
    sweep = sorted(result.get("sweep") or [], key=lambda m: as_float(m.get("rate_rps")))
    target = as_float(result.get("target"))
    rates = [as_float(m.get("rate_rps")) for m in sweep]
    shares = [as_float(m.get("attainment")) * 100 for m in sweep]
    met = [s == s and s >= target * 100 for s in shares]
    fig = go.Figure(
        go.Scatter(
            x=rates,
            y=shares,
            mode="lines+markers",
            line={"color": NEUTRAL["reference_light"], "width": 1},
            marker={"size": 9, "color": [MET_COLOUR if m else MISSED_COLOUR for m in met]},
            name="runs of the sweep",
            hovertemplate="%{x:.3g} req/s: %{y:.1f} % meet both SLOs<extra></extra>",
        )
    )
    if target == target:
        fig.add_hline(
            y=target * 100,
            line={"color": NEUTRAL["reference"], "dash": "dash", "width": 1},
            annotation_text=f"target {100 * target:.0f} %",
            annotation_position="bottom left",
        )
    good = as_float(result.get("goodput_rps"))
    if good == good and good > 0:
        bound = "" if result.get("bounded", True) else "≥ "
        fig.add_vline(
            x=good,
            line={"color": MET_COLOUR, "width": 2},
            annotation_text=f"goodput {bound}{good:.3g} req/s",
            annotation_position="top right",
        )
    fig.update_xaxes(title_text="offered request rate, req/s (log)", type="log")
    fig.update_yaxes(title_text="requests meeting both SLOs, %", range=[0, 105])
    gpus = int(as_float(result.get("gpus")) or 1)
    per_gpu = as_float(result.get("goodput_rps_per_gpu"))
    apply_layout(fig, f"Goodput sweep: {per_gpu:.3g} req/s per GPU ({gpus} GPUs)", height=360)
    fig.update_layout(showlegend=False)
    return label_figure(fig, part_labels(result))
