"""The Latency page in AppTest, against a real collector on a simulated fleet."""

from __future__ import annotations

from tests.conftest import Fleet
from tests.dashboard.conftest import plotly_values as _values
from tests.dashboard.views.conftest import AGG, figures_of, open_page, texts


def test_percentiles_over_time_and_the_slo_slider_changes_attainment(dashboard_env: Fleet):
    at = open_page("latency", dashboard_env.scenarios[AGG])
    assert not at.exception
    lat, att = figures_of(at)
    names = {t["name"] for t in lat["data"]}
    assert {"TTFT p50", "TTFT p90", "TTFT p99", "ITL p50", "ITL p90", "ITL p99", "TPOT p99"} <= names
    assert {"TTFT SLO 2000 ms", "TPOT SLO 100 ms"} <= names
    assert lat["layout"]["yaxis"]["title"]["text"] == "TTFT, ms (log)"
    assert "simulated" in lat["layout"]["xaxis3"]["title"]["text"]
    # each SLO on the row of the metric it bounds: the TPOT SLO with TPOT, none on ITL
    rows = {t["name"]: t.get("yaxis", "y") for t in lat["data"]}
    assert rows["TPOT SLO 100 ms"] == rows["TPOT p50"] != rows["ITL p99"]
    assert not [n for n, ax in rows.items() if ax == rows["ITL p99"] and "SLO" in n]
    assert att["layout"]["yaxis"]["title"]["text"] == "requests meeting both SLOs, %"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Meeting both SLOs"] == "100.0%"  # the default SLOs: 2000 ms TTFT, 100 ms TPOT
    before = [v for v in _values(att["data"][0]["y"]) if v is not None]
    at.slider(key="slo_tpot_ms").set_value(8).run()  # about the simulated H100's time per token
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    both = float(metrics["Meeting both SLOs"].removesuffix("%"))
    assert 0 < both < 100 and metrics["Meeting the TTFT SLO"] == "100.0%"
    after = [v for v in _values(figures_of(at)[1]["data"][0]["y"]) if v is not None]
    assert min(after) < min(before) == 100.0
    assert "TPOT ≤ 8 ms" in figures_of(at)[1]["layout"]["title"]["text"]
    assert "phaselens goodput" in texts(at)  # how to get goodput, which the service does not store
