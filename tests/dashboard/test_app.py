"""The dashboard's pages in Streamlit's AppTest, against a real collector on a simulated fleet."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from dashboard.figures.gpus import PANELS
from tests.collector.conftest import start_collector
from tests.conftest import Fleet, stop_process
from tests.dashboard.conftest import APP
from tests.serving.conftest import free_port

AGG, DISAGG = "agg:2xh100-sxm", "1p1d:h100-sxm"


def _app(dataset: str | None = None, page: str = "views/gpus.py") -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    if dataset is not None:
        at.query_params["dataset"] = dataset
    at.switch_page(page)  # the default page is the Overview (tests/dashboard/test_overview.py)
    return at.run()


def _figures(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _values(array: list | dict) -> list:
    """A trace's values: a list, or Plotly's typed array (``{"dtype", "bdata"}``, base64)."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=np.dtype(array["dtype"])).tolist()
    return list(array)


def _texts(at: AppTest) -> str:
    return "\n".join(
        str(e.value)
        for kind in ("markdown", "caption", "info", "warning", "error")
        for e in getattr(at, kind)
    )


def _traces(fig: dict) -> list[str]:
    """The names of a chart's lines (the TP groups, the power limit)."""
    return [t.get("name") for t in fig["data"]]


def test_gpus_page_draws_one_chart_per_metric_with_every_gpu(dashboard_env: Fleet):
    at = _app(dashboard_env.scenarios[DISAGG])
    assert not at.exception
    assert at.sidebar.selectbox(key="dataset").value == dashboard_env.scenarios[DISAGG]
    figs = _figures(at)
    metrics = [f["layout"]["meta"]["metric"] for f in figs]
    assert sorted(metrics) == sorted(p.metric for p in PANELS)  # one chart per metric, in two columns
    assert {f["layout"]["meta"]["mode"] for f in figs} == {"lines"}  # 2 GPUs: lines, not a heatmap
    titles = [f["layout"]["title"]["text"] for f in figs]
    assert "SM activity, %" in titles and "Tensor core activity, %" in titles and "Temperature, °C" in titles
    for fig in figs:
        groups = [n for n in _traces(fig) if n != "power limit"]
        assert len(groups) == 2 and groups == ["worker-0 · prefill · GPU 0", "worker-1 · decode · GPU 1"]
        assert "simulated" in fig["layout"]["xaxis"]["title"]["text"]
        assert not fig["layout"].get("annotations")  # the trust label is the page's, shown once
    power = next(f for f in figs if f["layout"]["meta"]["metric"] == "power_w")
    limit = next(t for t in power["data"] if t["name"] == "power limit")
    assert limit["line"]["shape"] == "hv" and set(_values(limit["y"])) == {700.0}
    lo, hi = power["layout"]["yaxis"]["range"]
    assert lo == 0 and 700 < hi < 760  # the limit within the axis, the axis fitted to it
    drawn = [v for t in power["data"] if t["name"] != "power limit" for v in _values(t["y"]) if v == v]
    assert 50 < max(drawn) <= 700
    clock = next(f for f in figs if f["layout"]["meta"]["metric"] == "sm_clock_mhz")
    assert clock["layout"]["yaxis"]["range"][0] > 0  # fitted to the clocks, not from zero
    table = at.dataframe[0].value
    assert len(table) == 2 and set(table["pool"]) == {"prefill", "decode"}
    sm = dict(zip(table["pool"], table["sm_active_pct"], strict=True))
    assert 0 < sm["decode"] < 100 and 0 < sm["prefill"] < 100
    assert _texts(at).count(":violet-badge[simulated]") == 1


def test_pool_and_gpu_filters_narrow_the_charts(dashboard_env: Fleet):
    at = _app(dashboard_env.scenarios[DISAGG])
    at.sidebar.multiselect(key=f"pools_{dashboard_env.scenarios[DISAGG]}").select("decode").run()
    assert not at.exception
    figs = _figures(at)
    assert len(figs) == len(PANELS)
    assert all([n for n in _traces(f) if n != "power limit"] == [_traces(f)[0]] for f in figs)
    assert "decode" in _traces(figs[0])[0]
    at = _app(dashboard_env.scenarios[AGG])
    gpus = at.sidebar.multiselect(key=f"gpus_{dashboard_env.scenarios[AGG]}")
    assert len(gpus.options) == 2
    gpus.select(gpus.options[1]).run()
    figs = _figures(at)
    assert _traces(figs[0]) == [_traces(figs[0])[0]] and _traces(figs[0])[0].startswith("worker-1")


def test_scenario_time_range_and_an_empty_live_window(dashboard_env: Fleet):
    sid = dashboard_env.scenarios[AGG]
    at = _app(sid)
    full = _figures(at)[0]
    at.sidebar.slider(key=f"range_{sid}").set_range(10.0, 20.0).run()
    part = _figures(at)[0]
    span = lambda f: (min(_values(f["data"][0]["x"])), max(_values(f["data"][0]["x"])))  # noqa: E731
    assert span(full)[0] < span(part)[0] < span(part)[1] < span(full)[1]
    at.sidebar.selectbox(key="dataset").set_value("live").run()
    assert not at.exception and not at.get("plotly_chart")
    assert "No GPU samples in this window" in at.info[0].value  # a message, not an empty chart


def test_health_page_shows_service_and_sources(dashboard_env: Fleet):
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("views/health.py").run()
    assert not at.exception
    text = _texts(at)
    assert ":green-badge[ok]" in text and "fleet.duckdb" in text
    assert "No sources configured" in text
    assert "Note: this host's GPUs are not sampled: --no-nvml" in text  # why, from /health's notes
    assert [m.label for m in at.metric][:3] == ["Rows written", "Results dropped", "Store errors"]


def test_health_page_names_a_source_that_is_down(tmp_path, monkeypatch):
    """A collector told to read a serving stack that is not there: the source is down, the page
    says so, with the source's error."""
    dead = f"http://127.0.0.1:{free_port()}"
    proc, url = start_collector(tmp_path / "down.duckdb", "--serving", dead)
    try:
        monkeypatch.setenv("PHASELENS_API_URL", url)
        at = AppTest.from_file(APP, default_timeout=60).run()
        at.switch_page("views/health.py").run()
        assert not at.exception
        sources = at.dataframe[0].value
        assert len(sources) == 2 and all(dead in name for name in sources["Source"])
        if (sources["Status"] == "unknown").any():  # before the first poll failed: look again
            at.run()
            sources = at.dataframe[0].value
        assert set(sources["Status"]) <= {"down", "degraded"}
        assert "need attention" in at.warning[0].value
        gaps = sources[["Telemetry gaps", "Missing batches"]].astype(str).values.ravel().tolist()
        assert "—" in gaps and all(g == "—" or g.replace(",", "").isdigit() for g in gaps), gaps
    finally:
        stop_process(proc)


@pytest.mark.parametrize("page", ["views/overview.py", "views/gpus.py", "views/health.py"])
def test_unreachable_service_is_a_message_not_a_stack_trace(page, monkeypatch):
    monkeypatch.setenv("PHASELENS_API_URL", f"http://127.0.0.1:{free_port()}")
    at = AppTest.from_file(APP, default_timeout=60).run()
    if page != "views/overview.py":
        at.switch_page(page).run()
    assert not at.exception
    assert "service is not reachable" in at.error[0].value and "phaselens collect" in at.error[0].value


@pytest.mark.parametrize("page", ["views/overview.py", "views/gpus.py", "views/reports.py"])
def test_an_api_url_without_its_scheme_is_named_not_called_unreachable(page, monkeypatch):
    monkeypatch.setenv("PHASELENS_API_URL", "127.0.0.1:8900")
    at = AppTest.from_file(APP, default_timeout=60).run()
    if page != "views/overview.py":
        at.switch_page(page).run()
    assert not at.exception
    message = at.error[0].value
    assert "`PHASELENS_API_URL` is not an http(s) URL**: `127.0.0.1:8900`" in message
    assert "PHASELENS_API_URL=http://127.0.0.1:8900" in message and "not reachable" not in message


def test_reports_page_lists_opens_and_makes_reports(dashboard_env: Fleet):
    made = httpx.post(
        f"{dashboard_env.url}/api/v1/reports", json={"dataset": dashboard_env.scenarios[AGG]}, timeout=120
    )
    assert made.status_code == 200, made.text
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("views/reports.py").run()
    assert not at.exception
    before = len(at.dataframe[0].value)
    assert before >= 1 and at.selectbox(key="report_pick").value == made.json()["report_id"]  # newest first
    assert [b.label for b in at.get("download_button")] == ["Download HTML", "Download JSON"]
    frame = at.get("iframe")[0].proto
    assert "<h1>Efficiency report" in frame.srcdoc and "simulated scenario" in frame.srcdoc
    at.button(key="make_report").click().run()
    assert not at.exception
    assert len(at.dataframe[0].value) == before + 1
    assert at.dataframe[0].value["Kind"].iloc[0] == "manual"
