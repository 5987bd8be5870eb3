"""The cost figures that compare layouts and periods: all-in $/1M tokens, $ per request, the blended
3:1 figure — by hand, on a hand-built store, and on two stored runs of one workload in an
aggregated and a disaggregated layout (the per-side figures differ there while the window costs
do not)."""

from __future__ import annotations

import math

import duckdb
import pytest

from analytics.cost import cost_breakdown, price_usage
from analytics.summary import format_summary, summarize
from analytics.window import Window, resolve_window, scenarios
from tests.analytics.test_cost import PRICES, USD_PER_J, hand_store, hand_usage, sim_store  # noqa: F401


def test_all_in_per_request_and_blended_by_hand() -> None:
    b = price_usage(
        [hand_usage(), hand_usage(gpu="GPU-b", pool="decode", input_tokens=0)], PRICES, requests=40
    )
    h = b.headline()
    tokens = 1e6 + 2e5 + 2e5  # GPU-a: 1M in, 200k out; GPU-b: 200k out
    assert h["usd_per_1m_tokens"] == pytest.approx(h["cost_usd"] / tokens * 1e6)
    assert h["requests"] == 40 and h["usd_per_request"] == pytest.approx(h["cost_usd"] / 40)
    # Artificial Analysis' blend: 3 input tokens to 1 output token
    assert h["blended_usd_per_1m_tokens"] == pytest.approx(
        (3 * h["usd_per_1m_input"] + h["usd_per_1m_output"]) / 4
    )
    pools = b.by_pool.set_index("pool")
    assert pools.loc["decode", "usd_per_1m_tokens"] == pytest.approx(
        pools.loc["decode", "cost_usd"] / 2e5 * 1e6
    )
    assert "usd_per_request" not in b.by_pool  # requests are not per pool or GPU
    # no requests, or none known: undefined, never $0
    assert math.isnan(price_usage([hand_usage()], PRICES, requests=0).headline()["usd_per_request"])
    none = price_usage([hand_usage()], PRICES).headline()
    assert math.isnan(none["usd_per_request"]) and math.isnan(none["requests"])


def test_all_in_figures_from_a_hand_built_store(hand_store: duckdb.DuckDBPyConnection) -> None:  # noqa: F811
    h = cost_breakdown(hand_store, Window(100.0, 104.5), PRICES).headline()
    cost = 2.0 * 4 / 3600 + 1200 * USD_PER_J  # 4 GPU-s at $2/h, 1200 J on the counter
    assert h["cost_usd"] == pytest.approx(cost, rel=1e-3)
    assert h["usd_per_1m_tokens"] == pytest.approx(cost / (1000 + 6) * 1e6, rel=1e-3)
    assert h["requests"] == 2  # r1 and r2 finish at 102.1 and 103.2
    assert h["usd_per_request"] == pytest.approx(cost / 2, rel=1e-3)
    # a window where neither finishes: the GPU time is priced, $/request undefined
    early = cost_breakdown(hand_store, Window(100.0, 102.0), PRICES).headline()
    assert early["requests"] == 0 and math.isnan(early["usd_per_request"]) and early["cost_usd"] > 0


def test_layouts_compare_by_the_all_in_figures_not_by_side(sim_store: duckdb.DuckDBPyConnection) -> None:  # noqa: F811
    """One workload (the same trace, 120 s) on 2 × H100 aggregated and 1P1D: the same GPU-hours, so
    about the same window cost. The all-in figures track the cost; $/1M output does not (the 1P1D's
    idle prefill GPU is charged to input tokens)."""
    totals, texts = {}, {}
    for s in scenarios(sim_store):
        w = resolve_window(sim_store, dataset=s["scenario_id"])
        summary = summarize(
            sim_store, Window(w.start_s, w.end_s + 1.0, s["scenario_id"]), skip=frozenset({"bimodal"})
        )
        totals[s["name"].split(":")[0]] = summary.parts["cost"]["total"]
        texts[s["name"].split(":")[0]] = format_summary(summary.to_dict())
    agg, dis = totals["agg"], totals["1p1d"]
    assert agg["input_tokens"] == dis["input_tokens"] and agg["output_tokens"] == dis["output_tokens"]
    assert agg["requests"] == dis["requests"] > 0

    def ratio(key: str) -> float:
        return dis[key] / agg[key]

    cost = ratio("cost_usd")
    assert cost == pytest.approx(1.0, abs=0.05)  # same GPUs, same time: about the same money
    assert ratio("usd_per_1m_tokens") == pytest.approx(cost, rel=1e-6)
    assert ratio("usd_per_request") == pytest.approx(cost, rel=1e-6)
    assert ratio("industry_usd_per_1m_output") == pytest.approx(ratio("gpu_cost_usd"), rel=1e-6)
    assert abs(ratio("usd_per_1m_output") - cost) > 0.2  # the per-side figure moves with the layout
    for text in texts.values():
        assert "all in (compare layouts and periods by these)" in text
        assert "per 1M tokens (input + output)" in text and "per request" in text and "blended 3:1" in text
