"""The recommendation's chart, tables and sentences (dashboard/figures/recommend.py): the Overview's
headline with and without a recommendation, which one is the best, the Pareto chart's marks."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dashboard.figures import recommend as rf

METRICS = ("output_tokens_per_s_per_gpu", "output_tokens_per_s_per_user", "usd_per_year", "ttft_p90_s")


def _cand(layout: str, gpus: int, per_gpu: float, per_user: float, meets: bool, **kw: Any) -> dict[str, Any]:
    return {
        "layout": layout,
        "gpus": gpus,
        "output_tokens_per_s_per_gpu": per_gpu,
        "output_tokens_per_s_per_user": per_user,
        "meets_slo": meets,
        "evaluated_on": "trace",
        "slo_attainment": 0.97 if meets else 0.6,
        "ttft_p90_s": 0.4,
        "tpot_p90_s": 0.02,
        "bottleneck": "none" if meets else "decode",
    } | kw


REC = {  # a row per the shared contract (docs/RECOMMENDATIONS.md)
    "recommendation_id": "rec-1796000000-abcdef",
    "ts_s": 1_796_000_000.0,
    "kind": "layout",
    "target": "stack:http://127.0.0.1:8000",
    "status": "proposed",
    "current": {"layout": "agg:8xh100-sxm:tp2", "model": "llama-3.1-70b", "gpus": 8},
    "proposed": {"layout": "2p1d:h100-sxm:p.tp=2:d.tp=4", "model": "llama-3.1-70b", "gpus": 8},
    "rationale": "prefill-bound",
    "est_cost_change_usd_per_h": -3.0,
    "details": {
        "inputs": {"slo": {"ttft_s": 1.0, "tpot_s": 0.03, "target": 0.9}, "fleet_gpus": 64},
        "predicted": {"usd_per_year": 600_000.0, "ttft_p90_s": 0.5},
        "current_predicted": {"usd_per_year": 641_000.0, "ttft_p90_s": 0.9},
        "confidence": {
            "level": "medium",
            "replay_error_pct": {"ttft_p90": 12.4, "tpot_p90": -3.1, "output_tokens_per_s": 1.0},
            "text": "within 25 % of today's measurements",
        },
        "candidates": [
            _cand("agg:8xh100-sxm:tp2", 8, 900.0, 30.0, False, current=True, pareto=True),
            _cand("2p1d:h100-sxm:p.tp=2:d.tp=4", 8, 1300.0, 40.0, True, pareto=True),
            _cand("agg:4xh100-sxm:tp2", 4, 700.0, 20.0, True),
            {"layout": "8p0d", "gpus": 8, "pruned": "bound: decode step over the TPOT SLO"},
        ],
        "trust": "simulated",
    },
}


def test_the_headline_says_the_saving_at_the_slos_and_the_confidence():
    text = rf.headline_text(REC)
    assert text == (
        "Best recommendation: save $41,000/yr at your SLOs (TTFT ≤ 1 s and TPOT ≤ 30 ms for 90 % of requests) "
        "with 2p1d:h100-sxm:p.tp=2:d.tp=4 — confidence medium"
    )
    # not the stranded dollars: the simulated $/year of the current layout minus the proposal's
    assert rf.annual_saving_usd(REC) == pytest.approx(41_000.0)


def test_the_headline_without_a_recommendation_says_how_to_make_one():
    text = rf.headline_text(None)
    assert text.startswith("No layout recommendation yet")
    assert "Make a recommendation" in text and "phaselens recommend" in text


def test_the_headline_of_staying_as_is_and_of_spending_more_to_meet_the_slos():
    stay = copy.deepcopy(REC)
    stay["proposed"] = dict(stay["current"])
    stay["details"]["stay"] = True
    assert rf.headline_text(stay).startswith(
        "Best recommendation: stay as is (agg:8xh100-sxm:tp2): no change saves money at your SLOs"
    )
    dearer = copy.deepcopy(REC)
    dearer["details"]["predicted"]["usd_per_year"] = 700_000.0
    assert "spend $59,000/yr more to meet your SLOs" in rf.headline_text(dearer)
    # without the fleet's $/year: the per-hour change for one copy of the layout, a year of it
    bare = copy.deepcopy(REC)
    bare["details"]["predicted"] = {}
    assert rf.annual_saving_usd(bare) == pytest.approx(3.0 * 8760)
    assert "for scenario:x" in rf.headline_text(REC, target_note="scenario:x")


def test_the_best_is_the_largest_proposed_saving_for_the_data_set_first():
    recs = [
        REC | {"recommendation_id": "a", "est_cost_change_usd_per_h": -1.0, "ts_s": 3.0},
        REC | {"recommendation_id": "b", "est_cost_change_usd_per_h": -5.0, "ts_s": 2.0},
        REC | {"recommendation_id": "c", "est_cost_change_usd_per_h": -9.0, "status": "superseded"},
        REC | {"recommendation_id": "d", "est_cost_change_usd_per_h": -7.0, "target": "scenario:s1"},
    ]
    assert rf.best_recommendation(recs, "live")["recommendation_id"] == "b"
    assert rf.best_recommendation(recs, "s1")["recommendation_id"] == "d"
    assert rf.best_recommendation(recs, "s2")["recommendation_id"] == "d"  # none for it: the best of all
    assert rf.best_recommendation([recs[2]], "live") is None


def test_the_confidence_in_words_has_the_replay_errors():
    assert rf.confidence_text(REC) == (
        "medium: replay error TTFT p90 +12 %, TPOT p90 -3 %, tokens/s +1 % — within 25 % of today's measurements"
    )


def test_the_pareto_chart_marks_the_current_and_recommended_layouts_and_the_slos():
    fig = rf.pareto_figure(REC)
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {
        "meets the SLOs",
        "misses the SLOs",
        "Pareto front",
        "current layout",
        "recommended",
    }
    assert list(by_name["meets the SLOs"].y) == [1300.0, 700.0] and list(by_name["misses the SLOs"].y) == [
        900.0
    ]
    assert by_name["misses the SLOs"].marker.symbol == "circle-open"
    assert (by_name["current layout"].x[0], by_name["current layout"].y[0]) == (30.0, 900.0)
    assert (by_name["recommended"].x[0], by_name["recommended"].y[0]) == (40.0, 1300.0)
    assert by_name["current layout"].text[0] == "current layout"
    assert fig.layout.yaxis.title.text == "output tokens/s per GPU"
    assert any("SIMULATED" in (a.text or "") for a in fig.layout.annotations)  # the trust label


def test_candidate_rows_mark_the_choice_and_leave_out_the_pruned_unless_asked():
    rows = rf.candidate_rows(REC)
    assert [r[""] for r in rows] == ["current", "recommended", ""]
    assert rows[1]["Meets SLOs"] == "yes" and rows[0]["Bottleneck"] == "decode"
    every = rf.candidate_rows(REC, include_pruned=True)
    assert (
        every[-1]["Bottleneck"].startswith("bound: decode step") and every[-1]["Simulated on"] == "bound only"
    )
    impact = {r["Figure"]: r for r in rf.impact_rows(REC)}
    assert impact["$ a year (fleet)"]["Change"] == "-6.4 %"
    assert impact["TTFT p90, ms"]["Recommended (simulated)"] == "500"


def test_the_guard_in_words():
    guard = {
        "window_s": 30.0,
        "slo": {"ttft_s": 1.0, "tpot_s": 0.03, "target": 0.9},
        "max_error_rate": 0.05,
        "min_requests": 1,
    }
    assert rf.guard_text(guard) == (
        "a 30 s window after each step; it breaches under 90 % of requests meeting TTFT ≤ 1 s and TPOT ≤ 30 ms, "
        "or over 5 % errors (judged from 1 request; fewer: not judged); a breach rolls every applied step back"
    )
