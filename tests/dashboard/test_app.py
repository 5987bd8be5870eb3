"""The dashboard's pages in Streamlit's AppTest, against a real collector on a simulated fleet."""

from __future__ import annotations

from html.parser import HTMLParser

import httpx
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


def _texts(at: AppTest) -> str:
    return "\n".join(
        str(e.value)
        for kind in ("markdown", "caption", "info", "warning", "error")
        for e in getattr(at, kind)
    )


class _Panels(HTMLParser):
    """The GPUs page's SVG panels read back from its markup: per panel its attributes, the groups
    its lines are drawn for, its power limit and heatmap group labels, and its x-axis title."""

    def __init__(self) -> None:
        super().__init__()
        self.panels: list[dict] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        cls = a.get("class") or ""
        if tag == "figure" and cls == "pl-panel":
            self.panels.append(a | {"lines": [], "limits": [], "groups": [], "texts": [], "points": []})
        elif not self.panels:
            return
        elif tag == "polyline" and cls == "pl-line":
            self.panels[-1]["lines"].append(a["data-group"])
            self.panels[-1]["points"].append(a["points"])
        elif tag == "polyline" and cls == "pl-limit":
            self.panels[-1]["limits"].append(float(a["data-limit-w"]))
        self._in = "group" if tag == "text" and cls == "pl-group" else "text" if tag == "text" else None

    def handle_data(self, data: str) -> None:
        if self.panels and self._in:
            self.panels[-1]["groups" if self._in == "group" else "texts"].append(data)
            self._in = None


def _panels(at: AppTest) -> list[dict]:
    parser = _Panels()
    for m in at.markdown:
        if "pl-panel" in m.value:
            parser.feed(m.value)
    return parser.panels


def _xs(panel: dict) -> list[float]:
    return [float(p.split(",")[0]) for pts in panel["points"] for p in pts.split()]


def test_gpus_page_draws_one_chart_per_metric_with_every_gpu(dashboard_env: Fleet):
    at = _app(dashboard_env.scenarios[DISAGG])
    assert not at.exception
    assert at.sidebar.selectbox(key="dataset").value == dashboard_env.scenarios[DISAGG]
    assert not at.get("plotly_chart")  # SVG: the page never loads Plotly
    panels = _panels(at)
    assert [p["data-metric"] for p in panels] == [p.metric for p in PANELS]  # one chart per metric
    assert {p["data-mode"] for p in panels} == {"lines"}  # 2 GPUs: lines, not a heatmap
    for panel in panels:  # a line per TP group (here a GPU each), each group once
        assert panel["lines"] == ["worker-0 · prefill · GPU 0", "worker-1 · decode · GPU 1"]
        assert "virtual time, UTC (simulated)" in panel["texts"]
    power = next(p for p in panels if p["data-metric"] == "power_w")
    assert power["limits"] == [700.0]  # the limit's step line
    assert float(power["data-y-min"]) == 0 and 700 < float(power["data-y-max"]) < 760  # within the axis
    clock = next(p for p in panels if p["data-metric"] == "sm_clock_mhz")
    assert float(clock["data-y-min"]) > 0  # fitted to the clocks, not from zero
    table = at.dataframe[0].value
    assert len(table) == 2 and set(table["pool"]) == {"prefill", "decode"}
    sm = dict(zip(table["pool"], table["sm_active_pct"], strict=True))
    assert 0 < sm["decode"] < 100 and 0 < sm["prefill"] < 100
    assert 50 < table["power_w"].max() < 700 and set(table["power_limit_w"]) == {700.0}
    assert _texts(at).count(":blue-badge[simulated]") == 1  # the page's trust label, once


def test_pool_and_gpu_filters_narrow_the_charts(dashboard_env: Fleet):
    at = _app(dashboard_env.scenarios[DISAGG])
    at.sidebar.multiselect(key=f"pools_{dashboard_env.scenarios[DISAGG]}").select("decode").run()
    assert not at.exception
    panels = _panels(at)
    assert len(panels) == len(PANELS)
    assert all(p["lines"] == ["worker-1 · decode · GPU 1"] for p in panels)
    at = _app(dashboard_env.scenarios[AGG])
    gpus = at.sidebar.multiselect(key=f"gpus_{dashboard_env.scenarios[AGG]}")
    assert len(gpus.options) == 2
    gpus.select(gpus.options[1]).run()
    panels = _panels(at)
    assert len(panels[0]["lines"]) == 1 and panels[0]["lines"][0].startswith("worker-1")


def test_scenario_time_range_and_an_empty_live_window(dashboard_env: Fleet):
    sid = dashboard_env.scenarios[AGG]
    at = _app(sid)
    full = _panels(at)[0]
    ticks_full = [t for t in full["texts"] if t.count(":") == 2]
    at.sidebar.slider(key=f"range_{sid}").set_range(10.0, 20.0).run()
    part = _panels(at)[0]
    ticks_part = [t for t in part["texts"] if t.count(":") == 2]
    # the axis fits the narrower window: finer ticks, and the line spans the plot as before
    assert ticks_part != ticks_full and len(ticks_part) >= 2
    assert max(_xs(part)) - min(_xs(part)) > 0.9 * (max(_xs(full)) - min(_xs(full)))
    at.sidebar.selectbox(key="dataset").set_value("live").run()
    assert not at.exception and not _panels(at)
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
        # one source per stack (serving:URL: devices and telemetry in one read, /v1/collect)
        assert len(sources) == 1 and all(dead in name for name in sources["Source"])
        if (sources["Status"] == "unknown").any():  # before the first poll failed: look again
            at.run()
            sources = at.dataframe[0].value
        assert set(sources["Status"]) <= {"down", "degraded"}
        assert "need attention" in at.warning[0].value
        gaps = sources[["Telemetry gaps", "Missing batches"]].astype(str).values.ravel().tolist()
        # the one source reads telemetry too, so both counts apply (a count, not "—")
        assert gaps and all(g.replace(",", "").isdigit() for g in gaps), gaps
    finally:
        stop_process(proc)


@pytest.mark.parametrize("page", ["views/overview.py", "views/gpus.py", "views/health.py", "views/power.py"])
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
