"""The Cost page in AppTest, against a real collector on a simulated fleet."""

from __future__ import annotations

import httpx
import pytest

from dashboard import figures
from tests.conftest import Fleet
from tests.dashboard.conftest import plotly_values as _values
from tests.dashboard.views.conftest import DISAGG, figures_of, open_page, texts


def _by_title(at) -> dict[str, dict]:
    return {f["layout"]["title"]["text"].split(":")[0]: f for f in figures_of(at)}


def _stack_sums(fig: dict) -> list[float]:
    bars = [t for t in fig["data"] if t["type"] == "bar"]
    columns = [_values(t["y"]) for t in bars]
    return [sum(c[i] for c in columns) for i in range(len(columns[0]))]


def test_the_stack_by_pool_sums_to_the_total(dashboard_env: Fleet):
    sid = dashboard_env.scenarios[DISAGG]
    at = open_page("cost", sid)
    assert not at.exception
    figs = _by_title(at)
    # a scenario of minutes lies in one or two clock hours: its cost over time per period instead
    assert set(figs) == {
        "Where the money goes, by pool",
        "Annualised",
        "Cost over time, by category (per 10 s)",
    }
    body = httpx.get(
        f"{dashboard_env.url}/api/v1/analytics/summary", params={"dataset": sid}, timeout=120
    ).json()
    cost = body["parts"]["cost"]
    pools = figs["Where the money goes, by pool"]
    assert list(pools["data"][-1]["x"]) == ["decode pool", "prefill pool"]
    sums = _stack_sums(pools)
    assert sums == pytest.approx([r["cost_usd"] for r in cost["by_pool"]])
    assert sum(sums) == pytest.approx(cost["total"]["cost_usd"])
    assert sum(r["cost_usd"] for r in cost["by_hour"]) == pytest.approx(cost["total"]["cost_usd"])
    names = {t["name"] for t in pools["data"] if t["type"] == "bar"}
    assert {"productive decode", "stranded decode compute", "idle"} <= names
    assert pools["layout"]["yaxis"]["title"]["text"] == "cost in the window, US $"
    assert [m.label for m in at.metric] == [  # the figures that compare layouts first
        "Cost of the window",
        "Per 1M tokens, all in",
        "Per request",
        "Industry $ per 1M output",
        "Blended 3:1, per 1M tokens",
        "Per 1M input tokens",
        "Per 1M output tokens",
    ]
    values = {m.label: m.value for m in at.metric}
    total = cost["total"]
    assert total["usd_per_1m_tokens"] > 0 and total["usd_per_request"] > 0
    assert values["Per 1M tokens, all in"] == figures.usd_text(total["usd_per_1m_tokens"])
    assert values["Per request"] == figures.usd_text(total["usd_per_request"])
    assert "other busy" not in {r for r in at.dataframe[0].value["Category"]}  # no external GPU here
    text = texts(at)
    assert "Prices used" in text and "Mercatus" in text and "EIA" in text  # the price sources
    assert "Industry $ per 1M output: GPU $ per hour ÷ output tokens per GPU-hour × 10⁶" in text
    gpus = len({(r["node"], r["gpu"]) for r in cost["by_gpu"]})
    assert f"on {gpus} H100 80GB HBM3s at this profile" in text  # the annual sentence: the GPUs observed


def test_fleet_size_and_prices_are_editable(dashboard_env: Fleet):
    at = open_page("cost", dashboard_env.scenarios[DISAGG])
    annual = lambda: sum(_values(t["x"])[0] for t in _by_title(at)["Annualised"]["data"])  # noqa: E731
    window = lambda: sum(_stack_sums(_by_title(at)["Where the money goes, by pool"]))  # noqa: E731
    before_year, before_window = annual(), window()
    at.number_input(key="cost_fleet").set_value(2 * at.number_input(key="cost_fleet").value).run()
    assert not at.exception
    assert annual() == pytest.approx(2 * before_year)  # twice the GPUs, twice the dollars a year
    assert window() == pytest.approx(before_window)  # the window itself costs the same
    at.number_input(key="cost_gpu_usd").set_value(6.0).run()  # from $2.00
    assert not at.exception and window() > 2.5 * before_window
    assert "set in the request (gpu_usd_per_hour=6)" in texts(at)
