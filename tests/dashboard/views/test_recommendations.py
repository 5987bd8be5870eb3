"""The Recommendations page (and the Overview's headline) in AppTest, against a real collector with a
control token, on a store holding a simulated scenario and a recommendation made for it with
`phaselens recommend --db`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from streamlit.testing.v1 import AppTest

from analytics.window import scenarios
from collector.store import Store
from dashboard.api import TOKEN_ENV, ApiError, CollectorApi
from dashboard.common import text_md
from dashboard.figures import recommend as rf
from phaselens.cli import main
from tests.collector.conftest import start_collector
from tests.conftest import stop_process
from tests.dashboard.conftest import APP
from tests.dashboard.views.conftest import open_page, texts

TOKEN = "page-test-token"
# two GPUs at a light load: the recommendation is the least budget, one GPU (a change to show)
MODEL = ["--model", "llama-3.1-8b", "--layout", "agg:2xh100-sxm"]
LOAD = ["--poisson", "2", "--num-requests", "60", "--prompt-tokens", "64:256", "--output-tokens", "32:64"]


@dataclass(frozen=True)
class Service:
    url: str
    scenario: str
    rec_id: str


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    db = tmp_path_factory.mktemp("rec-page") / "p.duckdb"
    assert main(["simulate", "--no-progress", "--db", str(db), *MODEL, *LOAD]) == 0
    with Store.open(db, read_only=True) as store, store.reader() as cur:
        sid = scenarios(cur)[0]["scenario_id"]
    assert main(["recommend", "--db", str(db), *MODEL, "--for", f"scenario:{sid}", *LOAD[:4]]) == 0
    with Store.open(db, read_only=True) as store, store.reader() as cur:
        rec_id = cur.execute("SELECT recommendation_id FROM recommendations").fetchone()[0]
    proc, url = start_collector(db, "--control-token", TOKEN)
    try:
        yield Service(url, sid, rec_id)
    finally:
        stop_process(proc)


@pytest.fixture
def env(service: Service, monkeypatch: pytest.MonkeyPatch) -> Service:
    monkeypatch.setenv("PHASELENS_API_URL", service.url)
    monkeypatch.delenv(TOKEN_ENV, raising=False)  # the page's own token field is tested here
    return service


def _rec(service: Service, rec_id: str) -> dict:
    return httpx.get(f"{service.url}/api/v1/recommendations/{rec_id}", timeout=30).json()


def test_the_page_shows_candidates_pareto_impact_and_confidence(env: Service):
    at = open_page("recommendations")
    assert not at.exception
    rec = _rec(env, env.rec_id)
    assert at.selectbox(key="rec_pick").value == env.rec_id
    head = at.subheader[0].value.replace("\\:", ":")
    assert head == ("Stay as is: " if rf.is_stay(rec) else "Recommended: ") + rf.proposed_layout(rec)
    # the candidates: the table's rows and the Pareto chart, the current layout marked, labelled simulated
    table = at.dataframe[0].value
    assert list(table["Layout"]) == [r["Layout"] for r in rf.candidate_rows(rec)]
    assert not rf.is_stay(rec) and rf.proposed_layout(rec).startswith("agg:1xh100-sxm")
    assert {"current", "recommended"} <= set(table[""]) and set(table["Meets SLOs"]) <= {"yes", "no", "—"}
    (chart,) = at.get("plotly_chart")
    spec = json.loads(chart.proto.spec)
    names = {t.get("name") for t in spec["data"]}
    assert {"current layout", "recommended", "meets the SLOs"} <= names
    current = next(t for t in spec["data"] if t.get("name") == "current layout")
    assert current["text"] == ["current layout"]
    assert "SIMULATED" not in json.dumps(spec["layout"].get("annotations") or [])  # said once, above
    assert texts(at).count(":blue-badge[simulated]") == 1
    # the predicted impact and the confidence (nothing measured here: low, not checked)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Saving a year"] == rf.usd_text(rf.annual_saving_usd(rec))
    assert {"$ per 1M tokens, all in", "J per token", "TTFT p90, ms", "TPOT p90, ms"} <= set(metrics)
    said = texts(at)
    assert "**Confidence** :red-badge[low]" in said and "not checked" in said
    # a scenario's recommendation is not for the bundled stack: export it instead
    assert f"phaselens export {env.rec_id} --format dynamo" in said.replace("\\:", ":")
    assert "apply_plan" not in [b.key for b in at.button]
    assert "Auto-apply is off" in said


def test_make_a_recommendation_needs_the_token_and_stores_one(env: Service):
    at = open_page("recommendations")
    before = len(httpx.get(f"{env.url}/api/v1/recommendations", timeout=30).json()["recommendations"])
    at.text_input(key="mk_layout").set_value("agg:1xh100-sxm")
    at.text_input(key="mk_model").set_value("llama-3.1-8b")
    at.radio(key="mk_trace").set_value("poisson").run()
    at.number_input(key="mk_requests").set_value(20)
    at.text_input(key="mk_for").set_value("fleet:lab")
    at.button(key="make_rec").click().run()
    assert not at.exception
    assert any("Making a recommendation refused** (401)" in e.value for e in at.error)
    at.text_input(key="control_token").set_value(TOKEN).run()  # typed for this session
    at.button(key="make_rec").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    recs = httpx.get(f"{env.url}/api/v1/recommendations", timeout=30).json()["recommendations"]
    assert len(recs) == before + 1 and recs[0]["target"] == "fleet:lab"
    assert recs[0]["current"]["layout"] == "agg:1xh100-sxm"
    assert any(recs[0]["recommendation_id"] in s.value for s in at.success)


def test_the_client_sends_the_control_token_from_the_environment(env: Service, monkeypatch):
    with pytest.raises(ApiError) as refused:
        CollectorApi(env.url, token="").apply(env.rec_id)
    assert refused.value.status == 401 and refused.value.method == "POST"
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with pytest.raises(ApiError) as not_stack:  # past the token: the scenario's one cannot be applied
        CollectorApi(env.url).apply(env.rec_id)
    assert not_stack.value.status == 409 and "not the bundled stack" in not_stack.value.message
    assert CollectorApi(env.url).actions()["actions"] == []


def test_the_overview_headline_is_the_recommendation_s_saving(env: Service):
    rec = _rec(env, env.rec_id)
    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["dataset"] = env.scenario
    at.run()
    assert not at.exception
    headline = next(m.value for m in at.markdown if m.value.startswith("####"))
    assert headline == "#### " + text_md(rf.headline_text(rec))  # colons and $ escaped for markdown
    assert headline.startswith("#### Best recommendation") and "confidence low" in headline
    assert [p.proto.page for p in at.get("page_link")] == ["recommendations"]  # the page's URL path


def test_make_a_recommendation_for_the_observed_traffic_of_a_scenario(env: Service):
    """The scenario's workload observed and stored, the recommendation made on a trace that follows it
    and naming it (so a report can tell when the traffic has drifted from it)."""
    at = open_page("recommendations")
    at.text_input(key="control_token").set_value(TOKEN).run()
    assert at.radio(key="mk_trace").value == "observed"  # the default: the traffic seen
    window = next(o for o in at.selectbox(key="mk_window").options if env.scenario in o)
    at.selectbox(key="mk_window").set_value(window)
    at.text_input(key="mk_layout").set_value("agg:2xh100-sxm")
    at.text_input(key="mk_model").set_value("llama-3.1-8b")
    at.text_input(key="mk_for").set_value(f"scenario:{env.scenario}")
    at.button(key="make_rec").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    newest = httpx.get(f"{env.url}/api/v1/recommendations", timeout=30).json()["recommendations"][0]
    rec = _rec(env, newest["recommendation_id"])
    inputs = rec["details"]["inputs"]
    stored = httpx.get(f"{env.url}/api/v1/workloads", params={"kind": "observed"}, timeout=30).json()
    (observed,) = [w for w in stored["workloads"] if w["workload_id"] == inputs["workload_id"]]
    assert observed["dataset"] == env.scenario and observed["request_count"] == 60
    # the trace searched on follows the observed workload: as many requests over the same span
    assert inputs["trace"]["requests"] == pytest.approx(60, rel=0.35)
    assert inputs["trace"]["desc"].startswith(
        f"synthesized from the observed workload {observed['workload_id']}"
    )
    # a report of the scenario carries it and checks drift against the workload it names: none
    made = httpx.post(
        f"{env.url}/api/v1/reports",
        json={"dataset": env.scenario},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=120,
    )
    assert made.status_code == 200, made.text
    report = httpx.get(
        f"{env.url}/api/v1/reports/{made.json()['report_id']}", params={"format": "json"}, timeout=60
    ).json()
    part = report["summary"]["recommendation"]
    assert part["best"]["recommendation_id"] == rec["recommendation_id"]
    assert part["staleness"]["workload_id"] == inputs["workload_id"] and part["staleness"]["stale"] is False
