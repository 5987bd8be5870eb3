"""The figure builders of dashboard/figures/ on hand-made summary parts: traces, values, labels."""

from __future__ import annotations

import math

import pytest

from dashboard import figures


def _trace(fig, name: str):
    return next(t for t in fig.data if t.name == name)


def _annotations(fig) -> str:
    return " | ".join(a.text for a in fig.layout.annotations)


@pytest.mark.parametrize(
    ("row", "words"),
    [
        ({"verdict": "bimodal (dip p < 0.001, two modes)"}, "bimodal (dip p < 0.001, two modes)"),
        # the analytics' verdict, never re-derived here from the p-value
        (
            {"dip_p_value": 0.0, "verdict": "not bimodal (dip p < 0.001 but one mode)"},
            "not bimodal (dip p < 0.001 but one mode)",
        ),
        ({"dip_p_value": 0.0}, "no verdict (no bimodality row)"),
        (None, "no verdict (no bimodality row)"),
    ],
)
def test_verdict_text_is_the_rows_verdict(row, words):
    assert figures.verdict_text(row) == words


def test_sarle_text_is_evidence_against_its_threshold():
    assert (
        figures.sarle_text(0.41) == "0.41 (below 0.556)" and figures.sarle_text(0.9) == "0.90 (above 0.556)"
    )


def test_histogram_shares_modes_and_labels():
    group = {
        "pool": "mixed",
        "sm_active": {"counts": [6, 0, 0, 2], "n": 8, "mean_pct": 30.0},
        "gpu_util": {"counts": [0, 0, 0, 4], "n": 4, "mean_pct": 90.0},
    }
    row = {
        "dip_p_value": 0.0,
        "verdict": "bimodal (dip p < 0.001, two modes)",
        "mode_low_pct": 10.0,
        "mode_high_pct": 80.0,
        "weight_low": 0.75,
        "weight_high": 0.25,
    }
    fig = figures.activity_histogram_figure(
        group, [0, 25, 50, 75, 100], row, title="Mixed pool", labels=["simulated"]
    )
    sm = _trace(fig, "SM activity (mean 30 %)")
    assert list(sm.x) == [12.5, 37.5, 62.5, 87.5] and list(sm.y) == [75.0, 0.0, 0.0, 25.0]  # % of samples
    assert list(_trace(fig, "utilization (mean 90 %)").y) == [0.0, 0.0, 0.0, 100.0]
    assert [s.x0 for s in fig.layout.shapes] == [10.0, 80.0]  # the two modes
    text = _annotations(fig)
    assert "low mode 10 % (75 % of samples)" in text and "high mode 80 % (25 % of samples)" in text
    assert "SIMULATED" in text
    assert fig.layout.title.text == "Mixed pool — bimodal (dip p < 0.001, two modes)"
    assert fig.layout.xaxis.title.text == "SM activity or utilization, % (25 % bins)"
    assert fig.layout.yaxis.title.text == "share of samples, %"


@pytest.mark.parametrize(
    ("low", "high", "sides"),
    [
        (10, 80, ("left", "right")),
        (45, 60, ("right", "left")),
        (23, 24, ("left", "left")),
        (80, 90, ("right", "right")),
    ],
)
def test_mode_labels_stay_inside_the_plot(low, high, sides):
    """A label reads away from its centre on the side with room for it (xanchor "left": to the right
    of the centre), so two close modes share a side, one line apart, and none runs off the plot."""
    group = {"sm_active": {"counts": [1, 1], "n": 2, "mean_pct": 40.0}}
    row = {
        "dip_p_value": 0.5,
        "mode_low_pct": low,
        "mode_high_pct": high,
        "weight_low": 0.5,
        "weight_high": 0.5,
    }
    fig = figures.activity_histogram_figure(group, [0, 50, 100], row, title="t", labels=[])
    modes = [a for a in fig.layout.annotations if "mode" in a.text]
    assert tuple(a.xanchor for a in modes) == sides
    for a in modes:
        room = 100 - a.x if a.xanchor == "left" else a.x
        assert room >= figures.MODE_LABEL_SPAN_PCT
    assert modes[0].y != modes[1].y


def test_one_mode_is_marked_as_the_mode_without_a_share():
    group = {"sm_active": {"counts": [1, 1], "n": 2, "mean_pct": 40.0}}
    row = {
        "dip_p_value": 0.9,
        "mode_low_pct": 40.0,
        "mode_high_pct": None,
        "weight_low": 1.0,
        "weight_high": 0.0,
    }
    fig = figures.activity_histogram_figure(group, [0, 50, 100], row, title="t", labels=[])
    assert [s.x0 for s in fig.layout.shapes] == [40.0]
    assert [a.text for a in fig.layout.annotations if "mode" in a.text] == ["mode 40 %"]
    assert [t.name for t in fig.data if t.type == "scatter"] == ["mode (one)"]


def test_histogram_without_modes_draws_no_centres():
    group = {
        "sm_active": {"counts": [1, 1], "n": 2, "mean_pct": 40.0},
        "gpu_util": {"counts": [0, 0], "n": 0},
    }
    fig = figures.activity_histogram_figure(group, [0, 50, 100], None, title="Decode pool", labels=[])
    assert not fig.layout.shapes and len(fig.data) == 1  # no utilization values: no empty trace
    assert fig.layout.title.text == "Decode pool — no verdict (no bimodality row)"


def _pool(pool: str, **usd: float) -> dict:
    row = {"pool": pool} | {f"cost_usd_{c}": usd.get(c, 0.0) for c in figures.COST_CATEGORIES}
    row["cost_usd"] = sum(usd.values())
    return row


def test_cost_by_pool_stacks_to_the_total_in_category_colours():
    rows = [
        _pool("prefill", prefill=3.0, idle=1.0),
        _pool("decode", decode=2.0, stranded_decode=4.0, idle=0.5),
    ]
    fig = figures.cost_by_pool_figure(rows, labels=["measured"])
    assert fig.layout.barmode == "stack"
    bars = [t for t in fig.data if t.type == "bar"]
    # categories with no dollars in any pool are left out of the legend
    assert [t.name for t in bars] == [
        "productive prefill",
        "productive decode",
        "stranded decode compute",
        "idle",
    ]
    for i, total in enumerate((4.0, 6.5)):
        assert sum(t.y[i] for t in bars) == pytest.approx(total)
    assert _trace(fig, "idle").marker.color == figures.COST_COLOURS["idle"]
    assert _trace(fig, "productive decode").marker.color == figures.PHASE_COLOURS["decode"]
    text = next(t for t in fig.data if t.type == "scatter")
    assert list(text.text) == ["$4.00", "$6.50"] and list(text.x) == ["prefill pool", "decode pool"]
    assert fig.layout.yaxis.title.text == "cost in the window, US $" and "MEASURED" in _annotations(fig)


def test_cost_over_time_and_annual():
    hours = [
        _pool("x", decode=1.0) | {"hour_start_s": 7200.0},
        _pool("x", idle=2.0) | {"hour_start_s": 3600.0},
    ]
    fig = figures.cost_over_time_figure(hours, labels=["simulated"], simulated=True)
    decode = _trace(fig, "productive decode")
    assert [str(x) for x in decode.x] == ["1970-01-01 01:30:00", "1970-01-01 02:30:00"]  # sorted, centred
    assert list(decode.y) == [0.0, 1.0]
    assert "simulated" in fig.layout.xaxis.title.text
    assert fig.layout.title.text == "Cost over time, by category (per clock hour)"
    fig = figures.cost_over_time_figure(hours, labels=["simulated"], simulated=True, period_s=300.0)
    assert fig.layout.title.text == "Cost over time, by category (per 5 min)" and decode.width == 3_240_000
    assert _trace(fig, "productive decode").width == pytest.approx(300_000 * 0.9)  # a bar per period
    annual = {
        "fleet_gpus": 64,
        "usd_per_year": {"decode": 100.0, "stranded_decode": 300.0, "idle": 50.0},
        "total_usd_per_year": 450.0,
    }
    fig = figures.annual_figure(annual, labels=["simulated"])
    assert sum(t.x[0] for t in fig.data) == pytest.approx(450.0)
    assert fig.layout.title.text == "Annualised: $450 a year" and list(fig.data[0].y) == ["64 GPUs"]


@pytest.mark.parametrize(
    ("usd", "text"),
    [
        (1.14e6, "$1.14M"),
        (1234.4, "$1,234"),
        (12.345, "$12.35"),
        (0.05191, "$0.0519"),
        (3.05e-07, "< $0.0001"),
        (0, "$0.00"),
        (None, "—"),
    ],
)
def test_usd_text(usd, text):
    assert figures.usd_text(usd) == text


OVER_TIME = [
    {"bucket_start_s": 0.0, "requests": 4, "met": 4, "attainment": 1.0, "ttft_p50_s": 0.01, "ttft_p90_s": 0.05, "ttft_p99_s": 0.1, "tpot_p50_s": 0.008, "tpot_p90_s": 0.009, "tpot_p99_s": 0.02, "itl_p50_s": 0.008, "itl_p90_s": 0.009, "itl_p99_s": 0.4},
    {"bucket_start_s": 1.0, "requests": 5, "met": 2, "attainment": 0.4, "ttft_p50_s": 0.02, "ttft_p90_s": None, "ttft_p99_s": 0.3, "tpot_p50_s": 0.009, "tpot_p90_s": 0.01, "tpot_p99_s": 0.03, "itl_p50_s": 0.0, "itl_p90_s": 0.01, "itl_p99_s": 0.5},
]  # fmt: skip


def test_latency_over_time_in_ms_with_each_slo_on_the_metric_it_bounds():
    fig = figures.latency_over_time_figure(
        OVER_TIME, labels=["emulated"], simulated=False, slo_ttft_s=2.0, slo_tpot_s=0.1
    )
    assert list(_trace(fig, "TTFT p50").y) == pytest.approx([10.0, 20.0])
    p90 = list(_trace(fig, "TTFT p90").y)
    assert p90[0] == pytest.approx(50.0) and math.isnan(p90[1])  # a missing percentile is a gap, not 0
    itl = list(_trace(fig, "ITL p50").y)
    assert itl[0] == pytest.approx(8.0) and math.isnan(itl[1])  # 0 ms cannot sit on a log axis: a gap
    assert list(_trace(fig, "TPOT p99").y) == pytest.approx([20.0, 30.0])
    assert list(_trace(fig, "TTFT SLO 2000 ms").y) == [2000.0, 2000.0]
    assert list(_trace(fig, "TPOT SLO 100 ms").y) == [100.0, 100.0]
    # issue 25: the TPOT SLO was drawn on the ITL row, where ITL p99 (500 ms here) crossed it while
    # every request met it; each SLO now sits on the row of the metric it bounds, ITL has none
    rows = {t.name: t.yaxis for t in fig.data}
    assert rows["TTFT SLO 2000 ms"] == rows["TTFT p50"] == "y"
    assert rows["TPOT SLO 100 ms"] == rows["TPOT p50"] == "y2"
    assert rows["ITL p99"] == "y3" and [n for n, ax in rows.items() if ax == "y3" and "SLO" in n] == []
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis.title.text == "TTFT, ms (log)"
    # 1-2-5 values labelled, so that a line inside one decade has a value beside it
    assert list(fig.layout.yaxis2.tickvals) == [
        5.0,
        10.0,
        20.0,
        50.0,
        100.0,
        200.0,
    ]  # TPOT 8 ms .. SLO 100 ms
    assert list(fig.layout.yaxis2.ticktext) == ["5", "10", "20", "50", "100", "200"]
    assert fig.layout.yaxis2.title.text == "TPOT, ms (log)"
    assert fig.layout.yaxis3.title.text == "inter-token latency, ms (log)"
    assert fig.layout.yaxis.tickvals[-1] == 2000.0 and fig.layout.yaxis.ticktext[-2] == "1,000"
    assert fig.layout.xaxis3.title.text == "time, UTC" and "EMULATED" in _annotations(fig)


def test_log_ticks():
    assert figures.log_ticks(28.0, 800.0) == [20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]
    assert figures.log_ticks(0.3, 4.0) == [0.2, 0.5, 1.0, 2.0, 5.0]
    assert figures.log_ticks(1.0, 1e5) is None


def test_attainment_over_time_colours_the_buckets_below_target():
    fig = figures.attainment_over_time_figure(OVER_TIME, labels=["measured"], simulated=False, target=0.9)
    bar = fig.data[0]
    assert list(bar.y) == pytest.approx([100.0, 40.0])
    assert list(bar.marker.color) == [figures.MET_COLOUR, figures.MISSED_COLOUR]  # the SLO colours
    assert [list(c) for c in bar.customdata] == [[4, 4], [2, 5]]
    assert fig.layout.shapes[0].y0 == 90.0 and "target 90 %" in _annotations(fig)


def test_goodput_sweep():
    result = {
        "goodput_rps": 3.0,
        "goodput_rps_per_gpu": 1.5,
        "gpus": 2,
        "target": 0.9,
        "bounded": True,
        "sweep": [{"rate_rps": 4.0, "attainment": 0.5}, {"rate_rps": 2.0, "attainment": 1.0}, {"rate_rps": 3.0, "attainment": 0.92}],
        "trust": {"labels": ["simulated"], "notes": []},
    }  # fmt: skip
    fig = figures.goodput_sweep_figure(result)
    assert list(fig.data[0].x) == [2.0, 3.0, 4.0] and list(fig.data[0].y) == pytest.approx(
        [100.0, 92.0, 50.0]
    )
    assert list(fig.data[0].marker.color) == [figures.MET_COLOUR] * 2 + [figures.MISSED_COLOUR]
    assert "goodput 3 req/s" in _annotations(fig) and "SIMULATED" in _annotations(fig)
    assert fig.layout.title.text == "Goodput sweep: 1.5 req/s per GPU (2 GPUs)"


def test_latency_axes_are_linear_within_a_decade_and_fit_the_data():
    rows = [
        {"bucket_start_s": 60.0, "ttft_p50_s": 3.0, "ttft_p90_s": 5.0, "ttft_p99_s": 7.0, "itl_p50_s": 0.07}
    ]
    fig = figures.latency_over_time_figure(
        rows, labels=[], simulated=False, slo_ttft_s=2.0, slo_tpot_s=0.1, bucket_s=60.0, window_s=(0.0, 600.0)
    )
    assert fig.layout.yaxis.type != "log" and fig.layout.yaxis.title.text == "TTFT, ms"  # 2000-7000 ms
    assert [str(t) for t in _trace(fig, "TTFT p50").x] == ["1970-01-01 00:01:30"]  # the bucket's middle
    # the data fills one minute of the ten: the axis spans that bucket, not the empty window
    assert [str(t) for t in fig.layout.xaxis.range] == ["1970-01-01 00:01:00", "1970-01-01 00:02:00"]
    assert [str(t) for t in _trace(fig, "TTFT SLO 2000 ms").x] == [
        "1970-01-01 00:01:00",
        "1970-01-01 00:02:00",
    ]
    att = figures.attainment_over_time_figure(
        [{"bucket_start_s": 60.0, "attainment": 0.5, "met": 1, "requests": 2}],
        labels=[],
        simulated=False,
        bucket_s=60.0,
        window_s=(0.0, 600.0),
    )
    assert att.data[0].width == pytest.approx(54_000)  # 90 % of a 60 s bucket, in ms on a date axis
    assert [str(t) for t in att.layout.xaxis.range] == ["1970-01-01 00:01:00", "1970-01-01 00:02:00"]
    empty = figures.attainment_over_time_figure([], labels=[], simulated=False, window_s=(0.0, 600.0))
    assert [str(t) for t in empty.layout.xaxis.range] == ["1970-01-01 00:00:00", "1970-01-01 00:10:00"]


@pytest.mark.parametrize("pools", [None, ["prefill", "decode"]])
def test_gpu_time_legend_is_under_the_bars_clear_of_the_trust_labels(pools):
    shares = dict.fromkeys(figures.GPU_TIME_COLOURS, 0.2)
    gpu_time = {"shares": shares, "per_pool": {"prefill": shares, "decode": shares}, "names": {}}
    fig = figures.gpu_time_figure(gpu_time, pools, ["emulated", "host-bound"], with_fleet=True)
    (label,) = fig.layout.annotations  # the trust labels: on the line above the plot, top right
    assert label.y == 1.0 and label.yanchor == "bottom" and "EMULATED" in label.text
    # the legend was on that line too (y 1.02, anchored at its bottom) and the labels hid its end
    assert fig.layout.legend.yanchor == "top" and fig.layout.legend.y < 0


def test_modes_in_words_says_two_modes_one_or_none():
    row = {"mode_low_pct": 0.2, "mode_high_pct": 23.9, "weight_low": 0.1, "weight_high": 0.9}
    assert figures.modes_in_words(row) == ("Modes", "0 % (10% of samples) and 24 % (90%)")
    assert figures.modes_in_words({"mode_low_pct": 40.0, "mode_high_pct": None}) == ("One mode", "40 %")
    assert figures.modes_in_words({"no_spread": True}) is None and figures.modes_in_words(None) is None


def test_the_cost_categories_are_the_analytics_ones_in_order() -> None:
    """The dashboard keeps its own copy (it reads data only through the API); it must not drift."""
    from analytics.cost import CATEGORIES

    assert figures.COST_CATEGORIES == CATEGORIES
