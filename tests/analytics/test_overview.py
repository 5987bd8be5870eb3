"""analytics.overview: headline figures of two summaries, by hand-computed examples."""

from __future__ import annotations

import copy

import pytest

from analytics.overview import FIGURES, gpu_time, headline, money_sentence, overview

COST_TRUST = {"labels": ["simulated"], "notes": []}


def _summary(
    *,
    duration_s: float = 100.0,
    seconds: dict[str, float] | None = None,
    usd: dict[str, float | None] | None = None,
    output_tokens: float = 5000.0,
    requests: int = 100,
    both: float | None = 0.9,
    gpus: int = 2,
) -> dict:
    """A summary's JSON form with only the fields the overview reads (2 GPUs × 100 s by default)."""
    seconds = seconds or {
        "prefill_s": 40.0,
        "decode_s": 60.0,
        "stranded_prefill_s": 10.0,
        "stranded_decode_s": 40.0,
        "host_bound_s": 30.0,
        "idle_s": 20.0,
    }
    usd = usd or {
        "prefill": 0.02,
        "decode": 0.03,
        "stranded_prefill": 0.005,
        "stranded_decode": 0.02,
        "host_bound": 0.015,
        "idle": 0.01,
    }
    total = {
        "gpu_seconds": sum(seconds.values()),
        **seconds,
        **{f"cost_usd_{k}": v for k, v in usd.items()},
        "output_tokens": output_tokens,
        "input_tokens": 20_000.0,
        "usd_per_1m_input": 0.5,
        "usd_per_1m_output": 2.0,
        "usd_per_1m_tokens": 0.8,
        "usd_per_request": 0.004,
        "j_per_output_token": 0.4,
        "j_per_input_token": 0.05,
    }
    return {
        "window": {
            "dataset": "live",
            "start_s": 1000.0,
            "end_s": 1000.0 + duration_s,
            "duration_s": duration_s,
        },
        "trust": {"labels": ["simulated"], "notes": ["a note"]},
        "parts": {
            "phases": {"per_pool": [{"role": "mixed", "gpus": gpus}]},
            "cost": {
                "total": total,
                "by_pool": [{"pool": "mixed", **total}],
                "trust": COST_TRUST,
            },
            "latency": {
                "requests": requests,
                "attainment": {"both": both},
                "trust": {"labels": ["simulated"], "notes": []},
            },
        },
        "missing": {},
    }


def test_headline_figures_by_hand():
    h = headline(_summary())
    assert h["output_tokens_per_s"] == (50.0, None)  # 5000 tokens / 100 s
    assert h["usd_per_1m_tokens"] == (0.8, None)  # all in: the figures that compare periods
    assert h["usd_per_request"] == (0.004, None)
    assert h["j_per_output_token"] == (0.4, None)
    assert h["stranded_share"][0] == pytest.approx(50 / 200)  # (10 + 40) of 200 GPU-seconds
    assert h["host_bound_share"][0] == pytest.approx(30 / 200)
    assert h["idle_share"][0] == pytest.approx(20 / 200)
    assert h["slo_attainment"] == (0.9, None)
    assert set(h) == {f.key for f in FIGURES}


def test_trend_against_the_previous_period():
    prev = _summary(output_tokens=4000.0, both=0.75)
    prev["parts"]["cost"]["total"]["usd_per_1m_tokens"] = 1.0
    out = overview(_summary(), prev)
    tps = out["figures"]["output_tokens_per_s"]
    assert (tps["value"], tps["previous"], tps["delta"]) == (50.0, 40.0, 10.0)
    assert tps["delta_ratio"] == pytest.approx(0.25)
    assert tps["trust"] == ["simulated"] and tps["higher_is_better"] is True
    usd = out["figures"]["usd_per_1m_tokens"]
    assert usd["delta"] == pytest.approx(-0.2) and usd["delta_ratio"] == pytest.approx(-0.2)
    assert usd["higher_is_better"] is False
    slo = out["figures"]["slo_attainment"]
    assert slo["delta"] == pytest.approx(0.15)
    assert out["figures"]["j_per_output_token"]["j_per_input_token"] == 0.05
    assert out["empty"] is False and out["trust"] == ["simulated"]


def test_gpu_time_shares_sum_to_one():
    g = gpu_time(_summary())
    assert g["shares"] == pytest.approx(
        {
            "productive_prefill": 0.20,
            "productive_decode": 0.30,
            "stranded": 0.25,
            "host_bound": 0.15,
            "other_busy": 0.0,  # an external fleet's busy time no engine work explains
            "idle": 0.10,
            "unsampled": 0.0,
        }
    )
    assert sum(g["shares"].values()) == pytest.approx(1.0)
    assert g["per_pool"]["mixed"] == pytest.approx(g["shares"])
    assert g["gpu_seconds"] == 200.0 and g["trust"] == ["simulated"]


def test_unsampled_time_is_its_own_share_not_idle():
    # 50 of the 250 GPU-seconds fell in gaps of the samples: a share of their own, idle unchanged
    seconds = {"prefill_s": 40.0, "decode_s": 60.0, "stranded_prefill_s": 10.0, "stranded_decode_s": 40.0,
               "host_bound_s": 30.0, "idle_s": 20.0, "unsampled_s": 50.0}  # fmt: skip
    s = _summary(seconds=seconds)
    g = gpu_time(s)
    assert g["shares"]["unsampled"] == pytest.approx(0.2) and g["shares"]["idle"] == pytest.approx(0.08)
    assert sum(g["shares"].values()) == pytest.approx(1.0)
    assert g["names"]["unsampled"] == "unsampled (no samples)"
    assert headline(s)["idle_share"] == (pytest.approx(20.0 / 250.0), None)


STRANDED = "stranded (busy, with the compute or the memory bandwidth idle)"


def test_money_sentence_at_a_fleet_size():
    m = money_sentence(_summary(), fleet_gpus=10)
    # scale = 10 GPUs × 3600 × 8760 / 200 GPU-s = 1,576,800; stranded $0.02 + $0.005 → $39,420 a year
    assert m["category"] == "stranded" and m["figure"] == "stranded_share"
    assert m["usd"] == pytest.approx(39_420.0)
    assert m["share"] == pytest.approx(0.25)  # 50 of all 200 GPU-seconds: the tile's base
    assert m["sentence"] == f"25.0 % of GPU-time is {STRANDED}: $39k/yr at this fleet size (10 GPUs)."
    observed = money_sentence(_summary())  # the 2 GPUs observed: $7,884
    assert observed["fleet_gpus"] == 2 and observed["usd"] == pytest.approx(7884.0)
    assert observed["sentence"].endswith("$7.9k/yr at the observed fleet size (2 GPUs).")


def test_the_sentence_states_its_tiles_value_on_the_tiles_base():
    """Issue 25: the headline said "40 % of decode GPU-time" beside a 25 % stranded tile."""
    for s in (_summary(), _summary(usd={"stranded_decode": 0.0, "stranded_prefill": 0.0, "host_bound": 1.0,
                                        "idle": 0.0, "prefill": 0.0, "decode": 0.0})):  # fmt: skip
        out = overview(s, None, fleet_gpus=4)
        money, tile = out["money"], out["figures"][out["money"]["figure"]]
        assert money["share"] == tile["value"]
        assert money["sentence"].startswith(f"{100 * tile['value']:.1f} % of GPU-time is ")


def test_money_sentence_uses_the_annual_part_of_that_fleet():
    s = _summary()
    s["parts"]["annual"] = {
        "fleet_gpus": 64,
        "usd_per_year": {"stranded_decode": 1.0, "stranded_prefill": 2.0, "host_bound": 3.0e6, "idle": 4.0},
    }
    m = money_sentence(s, fleet_gpus=64)
    assert m["category"] == "host_bound" and m["usd"] == 3.0e6
    assert m["sentence"] == (
        "15.0 % of GPU-time is host-bound (the GPU waits on the host): $3.0M/yr at this fleet size (64 GPUs)."
    )


def test_unpriced_gpu_says_so_instead_of_a_dollar_figure():
    usd = {"prefill": None, "decode": None, "stranded_prefill": None, "stranded_decode": None}
    m = money_sentence(_summary(usd=usd | {"host_bound": None, "idle": None}), fleet_gpus=4)
    assert m["usd"] is None
    assert m["sentence"] == f"25.0 % of GPU-time is {STRANDED}: no price for this GPU."


def test_empty_window_is_no_data_never_zero():
    empty = copy.deepcopy(_summary())
    empty["parts"] = {"latency": {"requests": 0, "attainment": {"both": None}, "trust": {"labels": []}}}
    empty["missing"] = {"intervals": "AnalyticsError: no GPU samples in the window"}
    out = overview(empty, None, previous_missing="no data: before the scenario")
    for key, fig in out["figures"].items():
        assert fig["value"] is None, key
        assert fig["no_data"].startswith("no data"), key
        assert fig["delta"] is None and fig["previous_no_data"] == "no data: before the scenario"
        assert fig["trust"] == []
    assert "no GPU samples in the window" in out["figures"]["usd_per_1m_tokens"]["no_data"]
    assert out["figures"]["slo_attainment"]["no_data"] == "no data: no request arrived in the window"
    assert out["empty"] is True
    assert out["gpu_time"]["shares"] is None and out["gpu_time"]["no_data"]
    assert out["money"]["sentence"] is None


def test_missing_previous_period_keeps_the_figures():
    out = overview(_summary(), None)
    tps = out["figures"]["output_tokens_per_s"]
    assert tps["value"] == 50.0 and tps["previous"] is None and tps["delta"] is None
    assert tps["previous_no_data"] == "no data: no previous period"


def test_previous_period_without_data_has_no_delta():
    prev = _summary()
    prev["parts"] = {}
    prev["missing"] = {"phases": "ValueError: no GPU samples"}
    fig = overview(_summary(), prev)["figures"]["stranded_share"]
    assert fig["value"] == pytest.approx(0.25)
    assert fig["previous"] is None and fig["delta"] is None
    assert "no GPU samples" in fig["previous_no_data"]


def test_no_tokens_or_requests_leave_the_per_token_and_per_request_figures_without_data():
    s = _summary(output_tokens=0.0)
    for key in ("usd_per_1m_tokens", "usd_per_request", "j_per_output_token"):
        s["parts"]["cost"]["total"][key] = None
    h = headline(s)
    assert h["output_tokens_per_s"] == (0.0, None)  # a measured zero: GPU time, no tokens
    assert h["usd_per_1m_tokens"][0] is None and "no tokens" in h["usd_per_1m_tokens"][1]
    assert h["usd_per_request"][0] is None and "no request finished" in h["usd_per_request"][1]
    assert h["j_per_output_token"][0] is None


def test_output_tokens_per_s_is_the_window_average_and_the_busy_rate_is_named_beside_it():
    # 5000 tokens in a 1 h window that served for 2 min: the headline is the window average (1.39
    # tokens/s, what `phaselens analyze` prints), the 41.7 while serving only under its own name
    cur = _summary(duration_s=3600.0)
    cur["parts"]["serving"] = {"requests": 100, "span_s": 120.0}
    prev = _summary(duration_s=3600.0, output_tokens=2400.0)
    prev["parts"]["serving"] = {"requests": 50, "span_s": 60.0}
    assert headline(cur)["output_tokens_per_s"] == (pytest.approx(5000 / 3600), None)
    tps = overview(cur, prev)["figures"]["output_tokens_per_s"]
    assert tps["label"] == "Output tokens/s (window average)"
    assert tps["value"] == pytest.approx(5000 / 3600) and tps["previous"] == pytest.approx(2400 / 3600)
    assert tps["window_s"] == 3600.0
    assert tps["basis"] == "5,000 output tokens over the 60.0 min window"
    assert tps["busy_label"] == "tokens/s while serving (busy time)"
    assert tps["busy_value"] == pytest.approx(5000 / 120) and tps["busy_s"] == 120.0
    assert tps["busy_basis"] == "over the 2.0 min with a request in flight (3% of the window)"
    # no request span in the window: the same headline, no busy-time rate
    tps = overview(_summary(duration_s=100.0), None)["figures"]["output_tokens_per_s"]
    assert tps["value"] == 50.0 and tps["busy_value"] is None and tps["busy_basis"] is None


def test_serving_span_is_the_union_of_the_request_spans_in_the_window(tmp_path):
    from analytics.summary import serving_span
    from analytics.window import Window
    from tests.analytics.test_attribution import make_store, request

    con = make_store(
        tmp_path / "spans.duckdb",
        {
            "requests": [
                request("r1", 99.0, 101.3),  # clipped to the window's start
                request("r2", 101.4, 103.0),
                request("r3", 102.0, 102.5),  # inside r2
                request(
                    "r4", 104.0, None, first_token_s=104.5, status=None
                ),  # unfinished: to its first token
                request("r5", 120.0, 121.0),  # after the window
            ]
        },
    )
    span = serving_span(con, Window(100.0, 110.0, "live"))
    assert span["requests"] == 4 and span["first_s"] == 100.0 and span["last_s"] == 104.5
    assert span["span_s"] == pytest.approx(1.3 + 1.6 + 0.5)
    assert serving_span(con, Window(200.0, 300.0, "live"))["span_s"] is None


def test_serving_span_of_spans_stored_out_of_order_and_starting_together(tmp_path):
    from analytics.summary import serving_span
    from analytics.window import Window
    from tests.analytics.test_attribution import make_store, request

    con = make_store(
        tmp_path / "spans-unordered.duckdb",
        {
            "requests": [
                request("r1", 105.0, 106.0),
                request("r2", 101.0, 104.0),  # starts with r3, ends later: stored first
                request("r3", 101.0, 101.5),
                request("r4", 104.0, 104.5),  # touches r2's end
                request("r5", 102.0, 103.0),  # inside r2
            ]
        },
    )
    span = serving_span(con, Window(100.0, 110.0, "live"))
    assert span["requests"] == 5 and span["first_s"] == 101.0 and span["last_s"] == 106.0
    assert span["span_s"] == pytest.approx(3.5 + 1.0)
