"""The collector's analytics reads: GET /api/v1/analytics/histogram and /gpu-series, and the summary's price
parameters — real HTTP against a collector on a simulated fleet (the dashboard tests' fixture)."""

from __future__ import annotations

import httpx
import pytest

from analytics.cost import CATEGORIES  # every cost category, unsampled included
from tests.conftest import Fleet

AGG, DISAGG = "agg:2xh100-sxm", "1p1d:h100-sxm"


def _get(fleet: Fleet, path: str, **params) -> httpx.Response:
    return httpx.get(f"{fleet.url}/api/v1/analytics/{path}", params=params, timeout=120)


def test_histogram_counts_every_sample_of_each_pool(fleet: Fleet):
    r = _get(fleet, "histogram", dataset=fleet.scenarios[DISAGG], bin_pct=5)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["bin_pct"] == 5 and body["edges_pct"][0] == 0 and body["edges_pct"][-1] == 100
    groups = {g["pool"]: g for g in body["groups"]}
    assert set(groups) == {"fleet", "prefill", "decode"}
    for g in groups.values():
        assert len(g["sm_active"]["counts"]) == 20
        assert (
            sum(g["sm_active"]["counts"]) == g["sm_active"]["n"] == g["samples"]
        )  # the simulator has SM activity
    fleet_counts = groups["fleet"]["gpu_util"]["counts"]
    pooled = [
        a + b
        for a, b in zip(
            groups["prefill"]["gpu_util"]["counts"], groups["decode"]["gpu_util"]["counts"], strict=True
        )
    ]
    assert fleet_counts == pooled
    # the decode GPU of 1p1d is the busy one: it reads high utilization at low SM activity
    dec = groups["decode"]
    assert dec["gpu_util"]["mean_pct"] > 50 > dec["sm_active"]["mean_pct"]
    assert body["trust"]["labels"] == ["simulated"]


def test_gpu_series_is_bucketed_by_the_service_within_max_points(fleet: Fleet):
    """The GPU series of a scenario: at most max_points values per metric, each bucket the mean of
    the raw samples in it (read back through GET /api/v1/tables/gpu_samples)."""
    sid = fleet.scenarios[DISAGG]
    r = _get(fleet, "gpu-series", dataset=sid, max_points=200)
    assert r.status_code == 200, r.text
    body = r.json()
    n_gpus, n_buckets = len(body["gpus"]), len(body["times_s"])
    assert n_gpus == 2 and n_gpus * n_buckets == body["points_per_metric"] <= 200
    assert [g["role"] for g in body["gpus"]] == ["prefill", "decode"] and body["trust"]["labels"] == [
        "simulated"
    ]
    raw = httpx.get(
        f"{fleet.url}/api/v1/tables/gpu_samples",
        params={
            "node": f"sim:{sid}",
            "start": body["window"]["start_s"],
            "end": body["window"]["end_s"],
            "limit": 100_000,
        },
        timeout=60,
    ).json()["rows"]
    bucket_ms = round(body["bucket_s"] * 1000)
    first = round(body["times_s"][0] * 1000) // bucket_ms
    for row, gpu in enumerate(body["gpus"]):
        mine = [x for x in raw if x["index"] == gpu["index"] and x["device"] == gpu["device"]]
        per_bucket: dict[int, list[float]] = {}
        for x in mine:
            per_bucket.setdefault(round(x["ts_s"] * 1000) // bucket_ms - first, []).append(x["power_w"])
        for col, values in per_bucket.items():
            assert body["series"]["power_w"][row][col] == pytest.approx(sum(values) / len(values), abs=1e-3)
            assert body["samples"][row][col] == len(values)
        assert sum(body["samples"][row]) == len(mine) > 0
    finer = _get(fleet, "gpu-series", dataset=sid, max_points=20_000).json()
    assert finer["bucket_s"] < body["bucket_s"] and finer["points_per_metric"] <= 20_000


def test_gpu_series_agrees_with_the_summary_of_the_same_window(fleet: Fleet):
    """The GPUs page's figures and `phaselens analyze` (the summary) on one window: each GPU's
    mean SM activity agrees with the summary's (a mean over the sample intervals there, over the
    samples here: within 1 %), its samples with the summary's intervals (one interval per sample
    after the first)."""
    sid = fleet.scenarios[AGG]
    series = _get(fleet, "gpu-series", dataset=sid).json()
    summary = _get(fleet, "summary", dataset=sid).json()
    rows = {r["gpu"]: r for r in summary["parts"]["bimodal"]["table"] if r["scope"] == "gpu"}
    assert len(rows) == len(series["gpus"]) == 2
    for i, gpu in enumerate(series["gpus"]):
        assert series["means"]["sm_active_pct"][i] == pytest.approx(rows[gpu["key"]]["mean_sm_pct"], rel=0.01)
        assert sum(series["samples"][i]) - rows[gpu["key"]]["n"] in (0, 1)


@pytest.mark.parametrize(
    ("path", "params", "param", "says"),
    [
        (
            "gpu-series",
            {"max_points": "50"},
            "max_points",
            "max_points must be a whole number in [100, 200000]",
        ),
        ("gpu-series", {"max_points": "lots"}, "max_points", "got 'lots'"),
        (
            "gpu-series",
            {"max_buckets": "0"},
            "max_buckets",
            "max_buckets must be a whole number in [10, 200000]",
        ),
        ("gpu-series", {"bin_pct": "5"}, "bin_pct", "unknown parameter(s) bin_pct"),
        ("histogram", {"bin_pct": "3"}, "bin_pct", "bin_pct must be one of 1, 2, 2.5, 5, 10"),
        ("histogram", {"fleet_gpus": "4"}, "fleet_gpus", "unknown parameter(s) fleet_gpus"),
        (
            "summary",
            {"gpu_usd_per_hour": "-1"},
            "gpu_usd_per_hour",
            "gpu_usd_per_hour must be a number in [0, 1000]",
        ),
        ("summary", {"gpu_usd_per_hour": "abc"}, "gpu_usd_per_hour", "got 'abc'"),
        (
            "summary",
            {"electricity_usd_per_kwh": "11"},
            "electricity_usd_per_kwh",
            "in [0, 10] (US $ per kWh)",
        ),
        ("summary", {"pue": "0.9"}, "pue", "pue must be a number in [1, 5]"),
        ("summary", {"pue": "inf"}, "pue", "pue must be a number in [1, 5]"),
        # a span or a typo for a time: 1970, not data (the CLI refused it, the API took it)
        ("summary", {"start_s": "3600"}, "start_s", "give UTC epoch seconds from 2000 on"),
        ("summary", {"end_s": "-5"}, "end_s", "or since=SPAN for the last SPAN"),
        ("summary", {"since": "-5m"}, "since", "time span since='-5m' must be > 0"),
    ],
)
def test_bad_parameters_are_a_400_naming_them(fleet: Fleet, path, params, param, says):
    r = _get(fleet, path, dataset=fleet.scenarios[AGG], **params)
    assert r.status_code == 400
    err = r.json()["error"]
    assert says in err["message"] and err["param"] == param


def test_prices_in_the_request_reprice_the_window(fleet: Fleet):
    sid = fleet.scenarios[AGG]
    base = _get(fleet, "summary", dataset=sid).json()["parts"]["cost"]
    mine = _get(
        fleet, "summary", dataset=sid, gpu_usd_per_hour=4.0, electricity_usd_per_kwh=0.26, pue=1.56
    ).json()
    cost = mine["parts"]["cost"]
    # GPU-time dollars scale with the GPU price ($2.00 → $4.00), energy dollars with $/kWh (0.13 → 0.26)
    assert cost["total"]["gpu_cost_usd"] == pytest.approx(2 * base["total"]["gpu_cost_usd"])
    assert cost["total"]["energy_cost_usd"] == pytest.approx(2 * base["total"]["energy_cost_usd"])
    assert cost["total"]["energy_j"] == pytest.approx(base["total"]["energy_j"])
    for row in cost["by_pool"]:
        assert sum(row[f"cost_usd_{c}"] for c in CATEGORIES) == pytest.approx(row["cost_usd"])
    sources = cost["prices"]["sources"]
    assert sources["electricity_usd_per_kwh"] == "set in the request (electricity_usd_per_kwh=0.26)"
    simulated = [k for k in cost["prices"]["gpu_usd_per_hour"] if k.endswith("(simulated)")]
    assert simulated and all(sources[k] == "set in the request (gpu_usd_per_hour=4)" for k in simulated)
    assert "https://" in base["prices"]["sources"]["NVIDIA H100 80GB HBM3"]  # defaults keep their citation
