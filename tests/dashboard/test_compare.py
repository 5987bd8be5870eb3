"""Compare (issue 25, point 4): two windows side by side — the view's (A) and the previous period or
another stored scenario (B) — on the Overview, Cost and Latency pages, each figure for A and B with the
change coloured; the time range and the comparison in the link's query string (a link reproduces the
view). Against a real collector on two simulated scenarios."""

from __future__ import annotations

import math
from html.parser import HTMLParser

import pytest
from streamlit.testing.v1 import AppTest

from dashboard import compare, figures, url_state
from dashboard.api import CollectorApi
from tests.conftest import Fleet
from tests.dashboard.conftest import APP

AGG, DISAGG = "agg:2xh100-sxm", "1p1d:h100-sxm"


class _Table(HTMLParser):
    """A comparison table (dashboard/compare.py) read back: per row key, its A, B and change texts
    and the change's verdict."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, dict[str, str]] = {}
        self._key: str | None = None
        self._cell: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr" and a.get("data-key"):
            self._key = a["data-key"]
            self.rows[self._key] = {}
        elif tag == "td" and self._key and a.get("class") in ("pl-a", "pl-b", "pl-change"):
            self._cell = str(a["class"])[3:]
            if a.get("data-verdict"):
                self.rows[self._key]["verdict"] = str(a["data-verdict"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._key and self._cell:
            self.rows[self._key][self._cell] = self.rows[self._key].get(self._cell, "") + data


def _table(at: AppTest) -> dict[str, dict[str, str]]:
    tables = [m.value for m in at.markdown if "pl-compare" in m.value]
    assert len(tables) == 1, "one comparison table"
    parser = _Table()
    parser.feed(tables[0])
    return parser.rows


def _open(page: str, **query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    for k, v in query.items():
        at.query_params[k] = v
    if page != "overview":
        at.switch_page(f"views/{page}.py")
    return at.run()


def test_links_carry_the_range_and_the_comparison():
    assert url_state.live_range_of("1h") == "last hour" and url_state.live_range_of("2h") is None
    assert url_state.live_range_code("last 15 minutes") == "15m"
    assert url_state.scenario_range_of("60-240", 600.0) == (60.0, 240.0)
    assert url_state.scenario_range_of("60-900", 600.0) == (60.0, 600.0)  # clipped to the scenario
    assert (
        url_state.scenario_range_of("240-60", 600.0) is None and url_state.scenario_range_of("x", 9) is None
    )
    assert url_state.scenario_range_text(60.0, 240.25) == "60-240.2"
    assert url_state.compare_of("previous", ["live"]) == "previous"
    assert (
        url_state.compare_of("s-1", ["live", "s-1"]) == "s-1" and url_state.compare_of("s-2", ["s-1"]) is None
    )


def test_the_change_is_coloured_by_which_way_is_better():
    cheaper = compare.Row("usd", "cost", 1.0, 2.0, "$1", "$2", higher_is_better=False)
    assert compare.change(cheaper) == ("-50.0 %", "better")
    slower = compare.Row("tps", "tokens/s", 50.0, 100.0, "50", "100", higher_is_better=True)
    assert compare.change(slower) == ("-50.0 %", "worse")
    share = compare.Row("idle", "idle", 0.30, 0.25, "30 %", "25 %", ratio=True, higher_is_better=False)
    assert compare.change(share) == ("+5.0 pp", "worse")
    assert compare.change(compare.Row("x", "x", None, 1.0, "—", "1"))[1] == "none"
    html = compare.table_html([cheaper], "A", "B")
    assert "data-verdict='better'" in html and "-50.0 %" in html


def test_the_overview_compares_two_scenarios_side_by_side(dashboard_env: Fleet):
    a_id, b_id = dashboard_env.scenarios[DISAGG], dashboard_env.scenarios[AGG]
    at = _open("overview", dataset=a_id, compare=b_id)
    assert not at.exception, at.exception
    assert at.query_params["compare"] == b_id and at.sidebar.selectbox(key="compare").value == b_id
    rows = _table(at)
    api = CollectorApi(dashboard_env.url)
    scenarios = {s["scenario_id"]: s for s in api.scenarios()}

    def overview(sid: str) -> dict:  # the window the page's sidebar holds: the whole scenario, to 0.1 s
        s0, s1 = float(scenarios[sid]["start_s"]), float(scenarios[sid]["end_s"])
        return api.overview(dataset=sid, start_s=s0, end_s=s0 + round(s1 - s0, 1), fleet_gpus=2)["figures"]

    a, b = overview(a_id), overview(b_id)
    for key in ("output_tokens_per_s", "usd_per_1m_tokens", "j_per_output_token", "idle_share"):
        assert rows[key]["a"] == figures.figure_text(key, a[key]["value"])  # the service's own figures
        assert rows[key]["b"] == figures.figure_text(key, b[key]["value"])
    a_cost, b_cost = a["usd_per_1m_tokens"]["value"], b["usd_per_1m_tokens"]["value"]
    assert rows["usd_per_1m_tokens"]["change"] == f"{100 * (a_cost - b_cost) / b_cost:+.1f} %"
    rel = (a_cost - b_cost) / b_cost
    assert rows["usd_per_1m_tokens"]["verdict"] == (
        "same" if abs(rel) < 5e-4 else "better" if rel < 0 else "worse"
    )
    idle = 100 * (a["idle_share"]["value"] - b["idle_share"]["value"])
    assert rows["idle_share"]["change"] == f"{idle:+.1f} pp"  # a share: in points
    bars = [h.proto.body for h in at.get("html") if "pl-gpu-time" in h.proto.body]
    assert len(bars) == 2  # A's and B's GPU-time
    heads = [m.value for m in at.markdown if m.value.startswith(("**A** ·", "**B** ·"))]
    assert len(heads) == 2 and b_id in heads[1] and a_id in heads[0]


def test_cost_and_latency_compare_a_range_with_the_period_before_it(dashboard_env: Fleet):
    sid = dashboard_env.scenarios[DISAGG]
    scenario = next(s for s in CollectorApi(dashboard_env.url).scenarios() if s["scenario_id"] == sid)
    dur = float(scenario["end_s"]) - float(scenario["start_s"])
    mid = round(dur / 2, 1)
    at = _open("cost", dataset=sid, range=f"{mid:g}-{2 * mid:g}", compare="previous")
    assert not at.exception, at.exception
    assert at.sidebar.slider(key=f"range_{sid}").value == pytest.approx((mid, 2 * mid))  # the link's range
    assert at.query_params["range"] == url_state.scenario_range_text(mid, 2 * mid)
    rows = _table(at)
    api = CollectorApi(dashboard_env.url)
    s0 = float(scenario["start_s"])
    for side, (a, b) in (("a", (mid, 2 * mid)), ("b", (0.0, mid))):
        total = api.summary(dataset=sid, start_s=s0 + a, end_s=s0 + b, fleet_gpus=2)["parts"]["cost"]["total"]
        assert rows["cost_usd"][side] == figures.usd_text(total["cost_usd"]), side
    keys = {c.proto.id for c in at.get("plotly_chart")}
    assert len(at.get("plotly_chart")) >= 2  # A's and B's by-pool charts

    at = _open("latency", dataset=sid, range=f"{mid:g}-{2 * mid:g}", compare="previous")
    assert not at.exception, at.exception
    rows = _table(at)
    assert {"attainment_both", "ttft_p90_s", "tpot_p90_s"} <= set(rows)
    assert all(rows["ttft_p90_s"][side] not in ("", "—") for side in ("a", "b"))
    assert len(at.get("plotly_chart")) == 2 and keys  # A's and B's latency over time


def test_no_earlier_period_is_said_not_drawn(dashboard_env: Fleet):
    sid = dashboard_env.scenarios[AGG]
    at = _open("overview", dataset=sid, compare="previous")  # the whole scenario: nothing before it
    assert not at.exception
    assert any("No earlier period to compare with" in i.value for i in at.info)
    assert not [m for m in at.markdown if "pl-compare" in m.value]
    assert not math.isnan(len(at.metric))  # the usual tiles instead
    assert len(at.metric) == 8
