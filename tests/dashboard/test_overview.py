"""The Overview page (the dashboard's default) in AppTest, against a real collector: a simulated
fleet, an empty store, and (tests/dashboard/test_app.py) a service that is down."""

from __future__ import annotations

import re

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.common import plain_md
from dashboard.figures import GPU_TIME_COLOURS, OPTIONAL_GPU_TIME
from tests.collector.conftest import start_collector
from tests.conftest import Fleet, stop_process
from tests.dashboard.conftest import APP, GpuTimeBar

WASTE_LABEL = (
    "Waste in this window (stranded, idle or host-bound GPU-time; not a saving a change is known to recover):"
)

AGG, DISAGG = "agg:2xh100-sxm", "1p1d:h100-sxm"
LABELS = [
    "Output tokens/s",
    "$ per 1M tokens, all in",
    "$ per request",
    "J per output token",
    "Stranded GPU-time",
    "Host-bound GPU-time",
    "Idle GPU-time",
    "SLO attainment",
]


def _app(dataset: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    if dataset is not None:
        at.query_params["dataset"] = dataset
    return at.run()


def _texts(at: AppTest) -> str:
    return "\n".join(
        str(e.value)
        for kind in ("markdown", "caption", "info", "warning", "error")
        for e in getattr(at, kind)
    )


def _waste(at: AppTest) -> str:
    """The Overview's sentence of where the money goes (the stranded waste, labelled)."""
    return next(m.value for m in at.markdown if WASTE_LABEL in m.value)


def _bar(at: AppTest) -> GpuTimeBar:
    """The Overview's one chart: the GPU-time bar in HTML (no Plotly on the landing page)."""
    assert not at.get("plotly_chart")
    bars = [h.proto.body for h in at.get("html") if "pl-gpu-time" in h.proto.body]
    assert len(bars) == 1
    return GpuTimeBar.parse(bars[0])


def test_overview_is_the_default_page_with_every_figure_and_its_trust(dashboard_env: Fleet):
    at = _app(dashboard_env.scenarios[DISAGG])
    assert not at.exception
    assert at.title[0].value == "Overview"
    metrics = {m.label: m.value for m in at.metric}
    assert list(metrics) == LABELS
    assert all(v != "no data" for v in metrics.values()), metrics
    # the unit is in the label: the value fits a quarter of a 1280 px page ("1,218 toke…" was cut)
    assert re.fullmatch(r"[\d,.]+", metrics["Output tokens/s"])
    assert metrics["$ per 1M tokens, all in"].startswith("$") and metrics["$ per request"].startswith("$")
    assert metrics["J per output token"].endswith(" J")
    assert metrics["SLO attainment"].endswith(" %")
    text = _texts(at)
    assert text.count(":blue-badge[simulated]") == 1  # the trust label once, in the page's badge block
    # the headline is the window average; the rate while serving only under its own name
    assert re.search(
        r"^[\d,]+ output tokens over the ([\d.,]+ (s|min|h) of the )?[\d.,]+ (s|min|h) window( with its GPUs observed)?$",
        text,
        re.M,
    )
    assert re.search(r"^tokens/s while serving \(busy time\): [\d.,]+ tokens/s \(over the ", text, re.M)
    assert re.search(r"^[\d,]+ of [\d,]+ requests; none failed$", text, re.M)  # the SLO's denominator
    # the headline is the best recommendation's saving at the SLOs (none here: how to make one); the
    # stranded money is shown after it under its own name, never as a saving
    headline = next(m.value for m in at.markdown if not m.value.startswith("Figures on this page:"))
    assert headline.startswith("#### ") and "No layout recommendation yet" in headline
    sentence = _waste(at)
    assert sentence.startswith(f"**{WASTE_LABEL}**") and "/yr at this fleet size (2 GPUs)" in sentence
    # the whole scenario is on screen: there is no previous period, and the page says so once
    assert "No trend shown: the previous period would start before the scenario" in text
    assert all(not m.delta for m in at.metric)
    bar = _bar(at)
    assert list(bar.rows) == ["all GPUs"]
    shares = bar.rows["all GPUs"]
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-4)  # the shares of GPU-time sum to 100 %
    assert shares["productive_prefill"] > 0 and shares["productive_decode"] > 0
    # the legend: every category in stacking order, named, with its share (one bar); unsampled time
    # only where the samples had gaps (none in a simulated scenario), other busy only for GPUs
    # without phaselens telemetry (none here)
    assert [key for key, _text in bar.legend] == [k for k in GPU_TIME_COLOURS if k not in OPTIONAL_GPU_TIME]
    legend = dict(bar.legend)
    assert legend["productive_prefill"].startswith("productive prefill ") and legend["host_bound"].startswith(
        "host-bound "
    )
    assert legend["productive_decode"].endswith(f"{100 * shares['productive_decode']:.1f} %")
    assert bar.trust == "" and "share of GPU-time, %" in bar.text  # the page's block says it


def test_a_later_range_is_compared_with_the_period_before_it(dashboard_env: Fleet):
    sid = dashboard_env.scenarios[AGG]
    at = _app(sid)
    slider = at.sidebar.slider(key=f"range_{sid}")
    top = slider.max
    slider.set_range(top / 2, top).run()
    assert not at.exception
    deltas = {m.label: m.delta for m in at.metric}
    assert deltas["Output tokens/s"] and "vs previous period" in deltas["Output tokens/s"]
    assert deltas["Idle GPU-time"].endswith("pp vs previous period")
    assert "No trend" not in _texts(at)


def test_fleet_size_and_pool_filter(dashboard_env: Fleet):
    sid = dashboard_env.scenarios[DISAGG]
    at = _app(sid)
    at.number_input(key=f"fleet_gpus_{sid}").set_value(64).run()
    assert not at.exception
    assert "/yr at this fleet size (64 GPUs)" in _waste(at)
    at.sidebar.multiselect(key=f"pools_{sid}").select("decode").run()
    bar = _bar(at)
    assert list(bar.rows) == ["decode pool"]
    decode = bar.rows["decode pool"]
    assert "productive_prefill" not in decode and decode["productive_decode"] > 0  # a decode-only pool
    assert sum(decode.values()) == pytest.approx(1.0, abs=1e-4)


def test_empty_live_window_is_a_message(dashboard_env: Fleet):
    at = _app("live")
    assert not at.exception
    assert not at.metric and not at.get("plotly_chart") and not at.get("html")
    assert "No GPU time, tokens or requests in this window" in at.info[0].value


def test_empty_store_is_a_message(tmp_path, monkeypatch):
    proc, url = start_collector(tmp_path / "empty.duckdb")
    try:
        monkeypatch.setenv("PHASELENS_API_URL", url)
        at = _app()
        assert not at.exception
        assert at.sidebar.selectbox(key="dataset").value == "live"
        assert not at.metric
        assert "No GPU time, tokens or requests in this window" in at.info[0].value
    finally:
        stop_process(proc)


# Streamlit's frontend loads its emoji library for a markdown text this matches (StreamlitMarkdown)
STREAMLIT_EMOJI = re.compile(r":(?!material/|streamlit:)[\w+-][\w_+-]*:")


def test_clock_times_and_layout_names_in_markdown_do_not_look_like_emoji_codes():
    text = "simulated · agg:8xh100-sxm:tp2 · llama (s1), 2026-12-02 04:20:13 – 05:20:13 UTC"
    assert STREAMLIT_EMOJI.search(text)
    md = plain_md(text)
    assert not STREAMLIT_EMOJI.search(md)
    assert md.replace("\\:", ":") == text  # markdown shows an escaped colon as a colon
