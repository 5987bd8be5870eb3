"""The layout search (analytics/recommend): bad input refused by name, the chunk size that flips the
verdict on disaggregation, the bottleneck named, aggregated kept for light short prompts. Small
simulations (seconds each)."""

from __future__ import annotations

import pytest

from analytics.prices import load_prices
from analytics.recommend import RecommendError, RecommendInputs, SearchOptions, SloTarget, recommend
from analytics.recommend.evaluate import evaluation_of, run_slice, simulate
from analytics.recommend.inputs import inputs_from_body
from serving.config import preset
from serving.sim.layout import parse_layout
from serving.trace import load_azure_trace, poisson_trace, scale_arrivals, vendored_trace_path

SHORT = poisson_trace(60.0, 150, prompt_tokens=(32, 256), output_tokens=(16, 64), seed=1)


def _inputs(**kw):
    base = dict(trace=SHORT, model="llama-3.1-8b", current="agg:1xh100-sxm", slo=SloTarget(0.5, 0.02))
    return RecommendInputs(**(base | kw))


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"allowed_gpus": ("b300",)}, ["unknown GPU b300", "allowed: h100-sxm"]),
        (
            {"model": "llama-3.1-70b", "current": "agg:2xh100-sxm:tp2", "gpu_budget": 1},
            ["budget of 1 GPU", "needs 2 GPUs"],
        ),
        ({"slo": SloTarget(0.0, 0.02)}, ["TTFT SLO must be a number of seconds > 0"]),
        ({"slo": SloTarget(0.5, -1.0)}, ["TPOT SLO must be"]),
        ({"slo": SloTarget(0.5, 0.02, 1.5)}, ["attainment target must be in (0, 1]"]),
        ({"current": "agg:1xh100-sxm:tp3"}, ["current layout"]),
        ({"trace": SHORT[:1]}, ["at least 2 are needed"]),
        ({"dispatch_delay_s": -0.01}, ["dispatch delay must be a number of seconds in [0, 60]"]),
        ({"dispatch_delay_s": float("nan")}, ["dispatch delay must be"]),
    ],
)
def test_bad_input_is_refused_naming_what_and_what_is_allowed(kw, words):
    with pytest.raises(RecommendError) as e:
        _inputs(**kw).check()
    assert all(w in str(e.value) for w in words), str(e.value)


def test_a_request_body_is_checked_field_by_field():
    with pytest.raises(RecommendError, match="unknown field"):
        inputs_from_body({"layout": "agg:1xh100-sxm", "poisson": 2, "gpus": 3})
    with pytest.raises(RecommendError, match=r"requests\[1\]"):
        inputs_from_body({"layout": "agg:1xh100-sxm", "requests": [[0, 10, 10], [1, 0, 10]]})
    with pytest.raises(RecommendError, match="exactly one of"):
        inputs_from_body({"layout": "agg:1xh100-sxm"})
    inputs, gain = inputs_from_body(
        {"layout": "agg:1xh100-sxm", "poisson": 2, "num_requests": 5, "min_gain_pct": 5}
    )
    assert len(inputs.trace) == 5 and gain == 5.0 and inputs.slo == SloTarget(1.0, 0.03, 0.9)


def test_the_chunk_size_flips_the_verdict_on_disaggregation():
    """The issue's check (70B on 8 H100s, TTFT <= 1 s, TPOT <= 30 ms): against the aggregated layout
    with vLLM's 8192-token chunks a disaggregated layout carries more goodput per GPU; against the
    same aggregated layout with 256-token chunks it carries less."""
    trace = load_azure_trace(vendored_trace_path(), limit=200)
    shape, slo, prices = preset("llama-3.1-70b"), SloTarget(1.0, 0.03), load_prices()

    def goodput(layout: str) -> float:
        return run_slice(layout, shape, trace, slo, prices, rel_tol=0.05, max_evals=9).goodput_rps_per_gpu

    disagg = goodput("2p1d:h100-sxm:prefill.tp=2:decode.tp=4")
    big, small = goodput("agg:8xh100-sxm:tp4"), goodput("agg:8xh100-sxm:tp4:max_num_batched_tokens=256")
    assert disagg / big > 1.1, (disagg, big)
    assert disagg / small < 0.95, (disagg, small)


def test_the_bottleneck_is_named_per_pool():
    trace = load_azure_trace(vendored_trace_path(), limit=200)
    shape = preset("llama-3.1-70b")
    hot = scale_arrivals(trace, rate_scale=6.0)
    slo = SloTarget(1.0, 0.03)
    # one decode replica for three prefill ones: the decode pool's batch is what misses (TPOT)
    ev = evaluation_of(
        simulate(parse_layout("3p1d:h100-sxm:tp2:decode.tp=2"), shape, hot),
        SloTarget(1.0, 0.05),
        load_prices(),
    )
    assert ev.bottleneck in ("decode", "mixed") and "decode pool" in ev.bottleneck_text + str(ev.busy_share)
    # aggregated with vLLM's 8192-token chunks at 3x the rate: the misses are named with the mixed pool's load
    ev = evaluation_of(
        simulate(parse_layout("agg:8xh100-sxm:tp4"), shape, scale_arrivals(trace, rate_scale=3.0)),
        slo,
        load_prices(),
    )
    assert ev.bottleneck in ("prefill", "decode", "mixed") and "mixed busy" in ev.bottleneck_text
    ok = evaluation_of(simulate(parse_layout("agg:8xh100-sxm:tp4"), shape, trace), slo, load_prices())
    assert ok.bottleneck == "none" and "meets the SLOs" in ok.bottleneck_text


def test_prefill_heavy_under_tight_slos_recommends_a_disaggregated_layout():
    """Long prompts, short outputs, TTFT <= 500 ms and TPOT <= 15 ms on 4 H100s (8B): the current
    aggregated layout (vLLM's 8192-token chunks) misses the TPOT SLO — its decode steps carry prefill
    chunks — and three prefill replicas feeding one decode replica meet both."""
    trace = poisson_trace(7.0, 80, prompt_tokens=(7000, 8000), output_tokens=(32, 64), seed=1)
    rec = recommend(
        RecommendInputs(trace, "llama-3.1-8b", "agg:4xh100-sxm", SloTarget(0.5, 0.015)),
        SearchOptions(slice_requests=80),
    )
    assert not rec.stay and rec.proposed.mode == "disaggregated", rec.rationale
    assert rec.proposed.layout.startswith("3p1d:") and rec.predicted["slo_attainment"] >= 0.9
    cur = rec.candidates[0]
    assert cur["current"] and cur["meets_slo"] is False and cur["bottleneck"] == "decode"
    assert "prefill chunks riding in it" in cur["bottleneck_text"]
    assert (
        "the current layout misses the SLOs" in rec.rationale
        and "Bottleneck of the proposed layout" in rec.rationale
    )
    # the search tried the engine settings that decide it: aggregated with small chunks, ranked below
    small = [
        c for c in rec.candidates if c["layout"].startswith("agg:4xh100-sxm:tp2:max_num_batched_tokens=512")
    ]
    assert small and small[0]["goodput_rps_per_gpu"] <= rec.predicted["goodput_rps_per_gpu"]


def test_light_short_prompts_keep_the_aggregated_layout_and_say_why():
    light = poisson_trace(5.0, 150, prompt_tokens=(32, 256), output_tokens=(4, 16), seed=2)
    rec = recommend(_inputs(trace=light, gpu_budget=2), SearchOptions(slice_requests=150, refine=1))
    assert rec.stay and rec.proposed.layout == "agg:1xh100-sxm", rec.rationale
    assert rec.rationale.startswith("stay as is (aggregated)")
    disagg = [c for c in rec.candidates if c["mode"] == "disaggregated"]
    assert disagg and all(c["layout"] != rec.proposed.layout for c in disagg)
    assert rec.bottleneck == "none" and rec.est_cost_change_usd_per_h == 0.0
    assert rec.confidence["level"] == "low" and "not checked" in rec.confidence["text"]
    cur = rec.candidates[0]
    assert cur["current"] and cur["evaluated_on"] == "trace" and cur["meets_slo"] is True
    assert {"goodput_rps_per_gpu", "usd_per_1m_tokens", "j_per_token", "usd_per_year", "pareto"} <= set(cur)


def test_candidates_cover_the_budget_the_tp_per_pool_and_the_allowed_gpus():
    from analytics.recommend.candidates import coarse, structures

    shape = preset("llama-3.1-70b")
    found = list(structures(shape, ["h100-sxm", "h200"], 8))
    assert all(s.gpus == 8 for s in found)
    texts = {c.layout.split(":max_num")[0].split(":prefill.max")[0] for s in found for c in coarse(s)}
    assert {"agg:8xh100-sxm:tp2", "agg:8xh100-sxm:tp4", "agg:8xh100-sxm:tp8", "agg:8xh200:tp2"} <= texts
    assert "2p1d:h100-sxm:prefill.tp=2:decode.tp=4" in texts and "1p2d:h200:prefill.tp=4:decode.tp=2" in texts
    # 70B bf16 fits neither one H100 nor one H200 at the default 0.9 memory utilization
    assert not any(":tp1" in t or "tp=1" in t for t in texts)
    # every coarse candidate parses and keeps the GPU count
    assert all(parse_layout(c.layout).gpus == 8 for s in found for c in coarse(s))
