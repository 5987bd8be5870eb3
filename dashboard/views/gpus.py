"""GPUs: the fleet's GPU metrics, one chart per metric with every GPU — SM, tensor and DRAM activity,
utilization, memory used, temperature, SM clock, and power with its limit — and one row per
tensor-parallel group (the GPUs of one worker) in the table above them.

Up to 16 GPUs the charts draw one line per TP group (its GPUs' mean, in its pool's colour); past
that, a GPU x time heatmap with the rows grouped by worker. The charts are inline SVG
(:mod:`dashboard.figures.gpu_svg`): the page never loads Plotly's bundle. The data is ``GET
/api/v1/analytics/gpu-series``: per-GPU means per time bucket computed in the store, at most
:data:`MAX_POINTS` values per chart whatever the window (64 GPUs x an hour of 100 ms samples included).
"""

from __future__ import annotations

import streamlit as st

from dashboard import common
from dashboard.figures.gpu_svg import panels_html
from dashboard.figures.gpus import HEATMAP_ABOVE_GPUS, PANELS, group_rows, legend_html, tp_groups, use_heatmap
from dashboard.page_trust import PageTrust, render_with_trust

MAX_POINTS = 6_000  # values per chart (GPUs x time buckets), bucketed by the service
MAX_BUCKETS = 240  # time buckets per GPU: a line's points at about 2 px apart on a half-width chart


def _bucket_text(bucket_s: float) -> str:
    if bucket_s >= 3600:
        return f"{bucket_s / 3600:g} h"
    if bucket_s >= 60:
        return f"{bucket_s / 60:g} min"
    return f"{bucket_s:g} s"


def _selected(series: dict, sel: common.Selection) -> dict:
    """``series`` narrowed to the GPUs picked in the sidebar (all when none was)."""
    if set(sel.gpus) == set(sel.all_gpus):
        return series
    wanted = {g.analytics_key for g in sel.gpus}
    keep = [i for i, g in enumerate(series["gpus"]) if g["key"] in wanted]
    pick = lambda rows: [rows[i] for i in keep]  # noqa: E731
    return series | {
        "gpus": pick(series["gpus"]),
        "series": {m: pick(v) for m, v in series["series"].items()},
        "samples": pick(series["samples"]),
        "means": {m: pick(v) for m, v in series["means"].items()},
    }


def _table(series: dict, groups: list) -> None:
    table = group_rows(series, groups)
    pct = {"format": "%.1f %%"}
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={
            "group": st.column_config.TextColumn("TP group (worker · pool · GPUs)", width="large"),
            "pool": None,
            "GPUs": st.column_config.NumberColumn("GPUs", format="%d"),
            "sm_active_pct": st.column_config.NumberColumn("SM activity", **pct),
            "tensor_active_pct": st.column_config.NumberColumn("Tensor activity", **pct),
            "dram_active_pct": st.column_config.NumberColumn("DRAM activity", **pct),
            "gpu_util_pct": st.column_config.NumberColumn("Utilization", **pct),
            "mem_used_bytes": st.column_config.NumberColumn("Memory used", format="%.1f GiB"),
            "temperature_c": st.column_config.NumberColumn("Temperature", format="%.0f °C"),
            "sm_clock_mhz": st.column_config.NumberColumn("SM clock", format="%.0f MHz"),
            "power_w": st.column_config.NumberColumn("Power", format="%.0f W"),
            "power_limit_w": st.column_config.NumberColumn("Power limit", format="%.0f W"),
        },
        height=min(36 * (len(table) + 1) + 4, 330),
    )


def render(sel: common.Selection) -> None:
    """The page body (re-run every few seconds for live data with refresh on)."""
    render_with_trust(lambda trust: _body(sel, trust))


def _body(sel: common.Selection, trust: PageTrust) -> None:
    with common.service_errors():
        series = common.analytics(sel, "gpu_series", max_points=MAX_POINTS, max_buckets=MAX_BUCKETS)
    series = _selected(series, sel)
    if not series["gpus"]:
        common.empty_window("GPU samples", sel)
        return
    trust.add(series["trust"]["labels"], primary=True)
    multi_node = len({g["node"] for g in series["gpus"]}) > 1
    groups = tp_groups(series["gpus"], with_node=multi_node)
    n = len(series["gpus"])
    how = (
        f"one row per GPU, grouped by worker (heatmap past {HEATMAP_ABOVE_GPUS} GPUs)"
        if use_heatmap(series)
        else "one line per TP group: the mean of its GPUs"
    )
    st.caption(
        f"{n} GPUs in {len(groups)} TP groups · means per {_bucket_text(series['bucket_s'])} "
        f"(computed by the service; at most {series['max_points']:,} values per chart) · {how}"
    )
    _table(series, groups)
    if not use_heatmap(series):
        st.markdown(legend_html(groups), unsafe_allow_html=True)
    grid, _drawn = panels_html(series, PANELS, groups, simulated=sel.simulated)
    st.markdown(grid, unsafe_allow_html=True)
    absent = [m for m in series.get("missing", []) if ":" in m]
    if absent:
        st.caption("Not charted: " + "; ".join(absent))


with common.service_errors():
    sel = common.sidebar()
st.title("GPUs")
st.caption(
    f"{common.describe_window(sel)} · activity, memory, temperature, clock and power of every GPU, "
    "one chart per metric"
)


@st.fragment(run_every=sel.refresh_every_s)
def _live() -> None:
    render(sel)


_live()
