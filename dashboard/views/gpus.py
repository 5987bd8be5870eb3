"""GPUs: per GPU, SM activity and utilization, power (with its limit) and SM clock over time, on
coloured bands of the engine phase (prefill / decode / mixed / idle) the GPU was in.

Reads ``GET /api/v1/tables/gpu_samples`` (samples with their device attributes) and
``GET /api/v1/tables/iterations`` (phase per engine iteration, with the GPU's UUID and worker).
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots

from dashboard import common
from dashboard.figures import PHASE_COLOURS
from dashboard.timeline import IDLE_BELOW, bands_from_samples, downsample, iterations_of_gpu, phase_bands

MAX_SAMPLE_ROWS = 300_000
MAX_ITERATION_ROWS = 100_000  # beyond this, bands come from utilization and the GPU's role
PROBE_ITERATIONS = 2_000  # iterations read at the window's start to judge whether the rest fits
MAX_CHARTS = 16
BAND_OPACITY = 0.28
LINE_COLOURS = {
    "sm_active_pct": "#1f2a44",
    "gpu_util_pct": "#d62728",
    "power_w": "#1f77b4",
    "power_limit_w": "#555555",
    "sm_clock_mhz": "#8c564b",
}


def _figure(title: str, points: pd.DataFrame, bands: list, labels: set[str], simulated: bool) -> go.Figure:
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.05,
        row_heights=[0.4, 0.32, 0.28],
    )
    t = pd.to_datetime(points["time_s"], unit="s")

    def line(col: str, name: str, row: int, unit: str, dash: str | None = None) -> None:
        if col not in points or points[col].isna().all():
            return
        fig.add_trace(
            go.Scatter(
                x=t,
                y=points[col],
                name=name,
                mode="lines",
                line={"color": LINE_COLOURS[col], "width": 1.6, "dash": dash},
                hovertemplate=f"%{{y:.1f}} {unit}<extra>{name}</extra>",
                legendgroup=name,
            ),
            row=row,
            col=1,
        )

    line("sm_active_pct", "SM activity", 1, "%")
    line("gpu_util_pct", "utilization", 1, "%", "dot")
    line("power_w", "power", 2, "W")
    line("power_limit_w", "power limit", 2, "W", "dash")
    line("sm_clock_mhz", "SM clock", 3, "MHz")
    top = fig.layout.yaxis.domain[1]
    for b in bands:
        if b.phase == "idle":  # idle: the plain background
            continue
        fig.add_shape(
            type="rect",
            xref="x",
            yref="paper",
            x0=pd.Timestamp(b.start_s, unit="s"),
            x1=pd.Timestamp(b.end_s, unit="s"),
            y0=0,
            y1=top,
            fillcolor=PHASE_COLOURS.get(b.phase, "#eeeeee"),
            opacity=BAND_OPACITY,
            line_width=0,
            layer="below",
        )
    for phase in sorted({b.phase for b in bands}, key=list(PHASE_COLOURS).index):
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name=f"{phase} phase",
                marker={
                    "symbol": "square",
                    "size": 13,
                    "color": PHASE_COLOURS[phase],
                    "opacity": 0.6,
                    "line": {"width": 1, "color": "#999999"},
                },
                hoverinfo="skip",
            ),
            row=1,
            col=1,
        )
    fig.update_yaxes(title_text="activity, %", range=[0, 105], row=1, col=1)
    fig.update_yaxes(title_text="power, W", rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title_text="SM clock, MHz", rangemode="tozero", row=3, col=1)
    fig.update_xaxes(title_text="virtual time, UTC (simulated)" if simulated else "time, UTC", row=3, col=1)
    fig.update_layout(
        title={"text": title, "x": 0, "xanchor": "left", "font": {"size": 15}},
        height=600,
        margin={"l": 70, "r": 20, "t": 50, "b": 110},
        legend={"orientation": "h", "yanchor": "top", "y": -0.2, "x": 0, "font": {"size": 12}},
        hovermode="x unified",
        plot_bgcolor="white",
    )
    fig.update_xaxes(showgrid=True, gridcolor="#eeeeee")
    fig.update_yaxes(showgrid=True, gridcolor="#eeeeee")
    return common.label_figure(fig, labels)


def _overview(per_gpu: list[dict]) -> None:
    table = pd.DataFrame(per_gpu)
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={
            "GPU": st.column_config.TextColumn("GPU", width="medium"),
            "pool": st.column_config.TextColumn("Pool"),
            "sm": st.column_config.NumberColumn("Mean SM activity", format="%.1f %%"),
            "util": st.column_config.NumberColumn("Mean utilization", format="%.1f %%"),
            "power": st.column_config.NumberColumn("Mean power", format="%.0f W"),
            "limit": st.column_config.NumberColumn("Power limit", format="%.0f W"),
            "busy": st.column_config.NumberColumn("Busy (not idle)", format="%.0f %%"),
            "trust": st.column_config.TextColumn("Data"),
        },
    )


def _iterations(sel: common.Selection, start: float, end: float) -> common.TableRead | None:
    """The window's iterations, or None when there are more than MAX_ITERATION_ROWS (judged from
    the density of a first small read, so a long window costs one short request)."""
    probe = common.read_table(sel, "iterations", start, end, max_rows=PROBE_ITERATIONS)
    rows = probe.rows
    if not probe.truncated:
        return probe
    covered = float(rows["start_s"].iloc[-1]) - start if not rows.empty else 0.0
    if covered <= 0 or len(rows) * (end - start) / covered > MAX_ITERATION_ROWS:
        return None
    full = common.read_table(sel, "iterations", start, end, max_rows=MAX_ITERATION_ROWS)
    return None if full.truncated else full


def render(sel: common.Selection) -> None:
    """The page body (re-run every few seconds for live data with refresh on)."""
    start, end = sel.window()
    with common.service_errors():
        samples_read = common.read_table(sel, "gpu_samples", start, end, max_rows=MAX_SAMPLE_ROWS)
        iters_read = _iterations(sel, start, end)
    samples = samples_read.rows
    if samples.empty:
        common.empty_window("GPU samples", sel)
        return
    samples = samples.assign(_key=common.gpu_keys(samples))
    wanted = {g.key for g in sel.gpus}
    if wanted:
        samples = samples[samples["_key"].isin(wanted)]
    if samples.empty:
        common.empty_window("samples of the selected GPUs", sel)
        return
    if samples_read.truncated:
        shown_to = pd.Timestamp(samples["ts_s"].max(), unit="s").strftime("%H:%M:%S")
        st.warning(
            f"This window holds more than {MAX_SAMPLE_ROWS:,} samples: the charts stop at {shown_to} UTC. "
            "Narrow the time range to see the rest.",
            icon=":material/content_cut:",
        )
    iterations = iters_read.rows if iters_read is not None else pd.DataFrame()
    labels = common.row_trust(samples)
    common.trust_badges(labels)
    groups = list(samples.groupby("_key", sort=False))
    order = {g.key: i for i, g in enumerate(sel.all_gpus)}
    groups.sort(key=lambda kv: order.get(kv[0], len(order)))
    summary, charts = [], []
    for key, rows in groups:
        first = rows.iloc[-1]
        label = common.gpu_label(first, with_node=samples["node"].nunique() > 1)
        workers = {w for w in rows.get("worker", pd.Series(dtype=object)).dropna().astype(str)}
        uuid = first.get("uuid") if isinstance(first.get("uuid"), str) else None
        pool = first.get("role") if isinstance(first.get("role"), str) else None
        if iters_read is None:  # too many iterations to read: bands from utilization and role
            bands = bands_from_samples(rows, pool, start, end)
        else:
            mine = iterations_of_gpu(iterations, uuid, str(first["node"]), workers)
            bands = phase_bands(mine, start, end) if not mine.empty else []
        idle_s = sum(b.end_s - b.start_s for b in bands if b.phase == "idle")
        gpu_labels = common.row_trust(rows)
        summary.append(
            {
                "GPU": label,
                "pool": pool or "—",
                "sm": rows["sm_active_pct"].mean() if "sm_active_pct" in rows else None,
                "util": rows["gpu_util_pct"].mean() if "gpu_util_pct" in rows else None,
                "power": rows["power_w"].mean() if "power_w" in rows else None,
                "limit": rows["power_limit_w"].max() if "power_limit_w" in rows else None,
                "busy": 100.0 * (1 - idle_s / (end - start)) if bands else None,
                "trust": ", ".join(common.ordered_labels(gpu_labels)),
            }
        )
        title = f"{label}" + (f" — {pool} pool" if pool else "")
        charts.append((key, title, downsample(rows, start, end, break_gaps=True), bands, gpu_labels))
    _overview(summary)
    if iters_read is None:
        st.caption(
            f"This window holds more than {MAX_ITERATION_ROWS:,} engine iterations: bands show where each GPU "
            f"was busy (utilization at least {IDLE_BELOW:.0%} in the slice), coloured by its pool. "
            "Narrow the time range for bands from the iterations themselves."
        )
    elif iterations.empty:
        st.caption(
            "No engine iterations in this window: no phase bands (the GPUs' engine telemetry is not collected)."
        )
    else:
        st.caption(
            "Bands: the engine phase that took most of the GPU's busy time in each slice of the window; "
            f"idle where it ran iterations less than {IDLE_BELOW:.0%} of the slice. "
            "Lines are sample means per point of the chart."
        )
    for key, title, points, bands, gpu_labels in charts[:MAX_CHARTS]:
        fig = _figure(title, points, bands, gpu_labels, sel.simulated)
        st.plotly_chart(fig, width="stretch", key=f"gpu_{key}", config={"displaylogo": False})
    if len(charts) > MAX_CHARTS:
        st.info(f"{len(charts) - MAX_CHARTS} more GPUs: pick a pool or GPUs in the sidebar to chart them.")


with common.service_errors():
    sel = common.sidebar()
st.title("GPUs")
st.caption(
    f"{common.describe_window(sel)} · SM activity, utilization, power and clock per GPU, over the engine's phases"
)


@st.fragment(run_every=sel.refresh_every_s)
def _live() -> None:
    render(sel)


_live()
