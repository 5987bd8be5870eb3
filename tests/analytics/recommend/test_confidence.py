"""The confidence of a recommendation: the replay on the current layout against what was measured
on it — thresholds, the text of a 30 % miss, the measured figures of request events, a change that
and the replay against a live emulated stack."""

from __future__ import annotations

import pytest

from analytics.recommend import RecommendInputs, SearchOptions, SloTarget, recommend
from analytics.recommend.confidence import HIGH_PCT, MEDIUM_PCT, confidence, measure_live, measured_figures
from serving.sim.live_compare import (
    EMULATED_GPU,
    ENGINE_OPTIONS,
    kv_blocks_of,
    poisson,
    serve_args_emulated,
    warm_up,
)
from serving.testing import start_server, stop_server

PRED = {"ttft_p90_s": 0.2, "tpot_p90_s": 0.02, "output_tokens_per_s": 100.0}


@pytest.mark.parametrize(
    ("scale", "level"),
    [
        (1.05, "high"),
        (1.0 + HIGH_PCT / 100 - 1e-6, "high"),
        (1.2, "medium"),
        (1.0 + MEDIUM_PCT / 100 + 0.01, "low"),
    ],
)
def test_levels_follow_the_documented_thresholds(scale, level):
    measured = {k: v / scale for k, v in PRED.items()}
    c = confidence(PRED, measured)
    assert c["level"] == level
    assert c["replay_error_pct"]["ttft_p90"] == pytest.approx((scale - 1) * 100)


def test_a_30_percent_miss_says_so_and_nothing_measured_is_low():
    c = confidence(PRED, {"ttft_p90_s": 0.2, "tpot_p90_s": 0.02, "output_tokens_per_s": 100 / 1.3 * 1.0})
    assert c["level"] == "low" and "misses today's measurements by 30 % (output_tokens_per_s)" in c["text"]
    assert c["margin_pct"] == pytest.approx(30.0)
    none = confidence(PRED, None)
    assert none["level"] == "low" and none["replay_error_pct"] == {
        "ttft_p90": None,
        "tpot_p90": None,
        "output_tokens_per_s": None,
    }
    assert "not checked" in none["text"] and none["margin_pct"] == 15.0


def test_measured_figures_of_request_events():
    events = [
        {"status": "ok", "arrival_s": 0.0, "first_token_s": 0.1, "finish_s": 1.1, "output_tokens": 11},
        {"status": "ok", "arrival_s": 1.0, "first_token_s": 1.3, "finish_s": 2.3, "output_tokens": 6},
        {"status": "error", "arrival_s": 1.5, "first_token_s": None, "finish_s": 1.5, "output_tokens": 0},
    ]
    m = measured_figures(events)
    assert m["requests"] == 2 and m["ttft_p50_s"] == pytest.approx(0.2)
    assert m["tpot_p50_s"] == pytest.approx((0.1 + 0.2) / 2)
    assert m["output_tokens_per_s"] == pytest.approx(17 / 2.3)
    with pytest.raises(ValueError, match="no ok request"):
        measured_figures(events[2:])


def test_confidence_from_a_live_emulated_stack():
    """The current layout is the emulated stack's (70B on one emulated H200): its replay of the
    same requests against what the stack measured, shown with the recommendation."""
    server = start_server(*serve_args_emulated())
    try:
        warm_up(server.url)
        blocks = kv_blocks_of(server.url)
        trace = poisson(2.0, 12, seed=5)
        measured, label = measure_live(server.url, trace)
    finally:
        stop_server(server)
    assert label == "emulated" and measured["requests"] == 12
    layout = f"agg:1x{EMULATED_GPU}:{ENGINE_OPTIONS}:kv_blocks={blocks}:gpu_memory_utilization=0.96"
    rec = recommend(
        RecommendInputs(trace, "llama-3.1-70b", layout, SloTarget(2.0, 0.2), measured=measured),
        SearchOptions(slice_requests=12),
    )
    errors = rec.confidence["replay_error_pct"]
    assert all(isinstance(errors[k], float) for k in ("ttft_p90", "tpot_p90", "output_tokens_per_s")), errors
    worst = max(abs(v) for v in errors.values())
    assert rec.confidence["level"] == ("high" if worst <= 10 else "medium" if worst <= 25 else "low")
    assert "off by" in rec.confidence["text"] and rec.measured["requests"] == 12
