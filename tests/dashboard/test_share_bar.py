"""The Overview's GPU-time bar in HTML (dashboard/share_bar.py) against the Plotly chart of the
same data (dashboard/figures/, in the reports): same rows, shares, colours and trust label."""

from __future__ import annotations

import re

import pytest

from dashboard import figures, share_bar
from tests.dashboard.conftest import GpuTimeBar

NAMES = {
    "productive_prefill": "productive prefill",
    "productive_decode": "productive decode",
    "stranded": "stranded",
    "host_bound": "host-bound",
    "idle": "idle",
}
FLEET = {
    "productive_prefill": 0.30,
    "productive_decode": 0.45,
    "stranded": 0.17,
    "host_bound": 0.03,
    "idle": 0.05,
}
GPU_TIME = {
    "shares": FLEET,
    "per_pool": {
        "prefill": {
            "productive_prefill": 0.8,
            "productive_decode": 0.0,
            "stranded": 0.1,
            "host_bound": 0.0,
            "idle": 0.1,
        },
        "decode": {
            "productive_prefill": 0.0,
            "productive_decode": 0.6,
            "stranded": 0.3,
            "host_bound": 0.04,
            "idle": 0.06,
        },
    },
    "names": NAMES,
}


def _segment_styles(markup: str) -> dict[str, str]:
    return dict(re.findall(r"data-key='([a-z_]+)'.*?style='([^']*)'", markup))


def test_one_bar_matches_the_plotly_chart_and_labels_what_fits():
    markup = share_bar.gpu_time_html(GPU_TIME, None, ["simulated", "estimated"])
    bar = GpuTimeBar.parse(markup)
    fig = figures.gpu_time_figure(GPU_TIME, None, ["simulated", "estimated"])
    plotly = {t.name: t.x[0] / 100 for t in fig.data}
    assert list(bar.rows) == ["all GPUs"] == list(fig.data[0].y)
    assert {NAMES[k]: v for k, v in bar.rows["all GPUs"].items()} == pytest.approx(plotly)
    # the same colour per category as every page's charts
    styles = _segment_styles(markup)
    for trace in fig.data:
        key = next(k for k, n in NAMES.items() if n == trace.name)
        assert f"background:{trace.marker.color}" in styles[key]
        assert f"flex:0 0 {100 * FLEET[key]:.4f}%" in styles[key]
    # a share as text where it fits (>= MIN_LABEL_SHARE), none where it would overlap; every one hovers
    assert bar.labels[("all GPUs", "productive_decode")] == "45 %"
    assert bar.labels[("all GPUs", "host_bound")] == ""  # 3 % < 6 %
    assert bar.titles[("all GPUs", "host_bound")] == "host-bound: 3.0 % of GPU-time (all GPUs)"
    # every category but unsampled time (no gaps in the samples here) and other busy (no GPU without
    # phaselens telemetry) in stacking order
    assert [k for k, _ in bar.legend] == [
        k for k in figures.GPU_TIME_COLOURS if k not in figures.OPTIONAL_GPU_TIME
    ]
    assert dict(bar.legend)["stranded"] == "stranded 17.0 %"
    assert bar.trust == "SIMULATED · ESTIMATED" and share_bar.AXIS_TITLE in bar.text
    assert "<script" not in markup


def test_chosen_pools_are_one_bar_each_and_empty_categories_are_not_drawn():
    bar = GpuTimeBar.parse(share_bar.gpu_time_html(GPU_TIME, ["prefill", "decode", "nowhere"], []))
    assert list(bar.rows) == ["prefill pool", "decode pool"]
    assert "productive_decode" not in bar.rows["prefill pool"]
    assert bar.rows["decode pool"]["stranded"] == pytest.approx(0.3)
    assert all(text == " ".join(text.split()) and "%" not in text for _k, text in bar.legend)  # no one share
    assert bar.trust == ""
    # a pool none of whose data is there: the fleet's bar, as the Plotly chart does
    assert list(GpuTimeBar.parse(share_bar.gpu_time_html(GPU_TIME, ["nowhere"], [])).rows) == ["all GPUs"]


def test_names_from_the_service_are_escaped():
    gt = {**GPU_TIME, "names": {**NAMES, "idle": "<img src=x onerror=alert(1)>"}}
    markup = share_bar.gpu_time_html(gt, None, [])
    assert "<img" not in markup and "&lt;img" in markup


@pytest.mark.parametrize(
    ("colour", "text"),
    [
        ("#c62828", "#ffffff"),
        ("#8e6bbf", "#ffffff"),
        ("#f5a623", "#1f2430"),
        ("#4caf50", "#1f2430"),
        ("#b0b7c3", "#1f2430"),
    ],
)
def test_segment_text_reads_on_its_colour(colour, text):
    assert share_bar.text_colour(colour) == text


def test_unsampled_time_shows_in_the_bar_and_the_chart_where_there_is_some():
    shares = dict(FLEET, idle=0.02, unsampled=0.03)  # 3 % of the GPU-time in gaps of the samples
    gpu_time = {"shares": shares, "per_pool": {}, "names": {**NAMES, "unsampled": "unsampled (no samples)"}}
    bar = GpuTimeBar.parse(share_bar.gpu_time_html(gpu_time, None, ["measured"]))
    assert [k for k, _ in bar.legend] == [k for k in figures.GPU_TIME_COLOURS if k != "other_busy"]
    assert dict(bar.legend)["unsampled"] == "unsampled (no samples) 3.0 %"
    assert bar.rows["all GPUs"]["unsampled"] == pytest.approx(0.03)
    fig = figures.gpu_time_figure(gpu_time, None, ["measured"])
    trace = next(t for t in fig.data if t.name == "unsampled (no samples)")
    assert trace.x[0] == pytest.approx(3.0) and trace.marker.color == figures.COST_COLOURS["unsampled"]


def test_other_busy_time_shows_in_the_bar_where_there_is_some():
    """An external fleet's busy time that no engine work explains (GPUs without phaselens telemetry)."""
    shares = dict(FLEET, idle=0.02, other_busy=0.03)
    names = {**NAMES, "other_busy": "other busy (not engine work)"}
    bar = GpuTimeBar.parse(
        share_bar.gpu_time_html({"shares": shares, "per_pool": {}, "names": names}, None, [])
    )
    assert [k for k, _ in bar.legend] == [k for k in figures.GPU_TIME_COLOURS if k != "unsampled"]
    assert dict(bar.legend)["other_busy"] == "other busy (not engine work) 3.0 %"
