"""GET /api/v1/analytics/overview of a real collector on a simulated scenario, and its cache."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from analytics.overview import overview
from phaselens.overview import LIVE_ROUND_S, OverviewCache, cache_key
from tests.collector.conftest import start_collector

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict]]:
    db = tmp_path_factory.mktemp("overview") / "sim.duckdb"
    cmd = [sys.executable, "-m", "phaselens.cli", "simulate", "--no-progress", "--limit", "60"]
    done = subprocess.run(
        [*cmd, "--db", str(db), "--layout", "agg:2xh100-sxm"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    proc, url = start_collector(db)
    try:
        sc = httpx.get(f"{url}/api/v1/scenarios").json()["scenarios"][0]
        yield url, sc
    finally:
        proc.terminate()
        proc.wait(20)


def _get(url: str, path: str, **params) -> httpx.Response:
    return httpx.get(f"{url}{path}", params=params, timeout=120)


def test_overview_equals_the_pure_function_of_two_summaries(scenario):
    url, sc = scenario
    mid = (sc["start_s"] + sc["end_s"]) / 2
    body = _get(
        url, "/api/v1/analytics/overview", dataset=sc["scenario_id"], start_s=mid, fleet_gpus=8
    ).json()
    w = body["window"]
    assert w["start_s"] == mid and body["previous_window"]["end_s"] == mid
    current = _get(
        url, "/api/v1/analytics/summary", dataset=sc["scenario_id"], start_s=mid, fleet_gpus=8
    ).json()
    prev_start = body["previous_window"]["start_s"]
    assert prev_start == pytest.approx(mid - w["duration_s"])
    previous = _get(
        url,
        "/api/v1/analytics/summary",
        dataset=sc["scenario_id"],
        start_s=prev_start,
        end_s=mid,
        fleet_gpus=8,
    ).json()
    want = overview(current, previous, fleet_gpus=8)
    for key, fig in want["figures"].items():
        got = body["figures"][key]
        for field in ("value", "previous", "delta"):
            assert got[field] == pytest.approx(fig[field], rel=1e-9), (key, field)
        assert got["trust"] == ["simulated"]
    assert body["money"]["sentence"] == want["money"]["sentence"]
    assert "(8 GPUs)" in body["money"]["sentence"]
    assert body["figures"]["output_tokens_per_s"]["delta"] is not None


def test_a_scenario_answer_is_cached(scenario):
    url, sc = scenario
    a = _get(url, "/api/v1/analytics/overview", dataset=sc["scenario_id"]).json()
    b = _get(url, "/api/v1/analytics/overview", dataset=sc["scenario_id"]).json()
    assert a["computed_at_s"] == b["computed_at_s"]  # computed once
    assert a["previous_window"] is None  # the whole scenario: nothing before it
    assert a["figures"]["idle_share"]["previous_no_data"].startswith("no data: the previous period")


def test_empty_live_window_is_no_data(scenario):
    url, _sc = scenario
    body = _get(url, "/api/v1/analytics/overview", since="5m").json()
    assert body["empty"] is True
    assert all(f["value"] is None and f["no_data"] for f in body["figures"].values())
    assert body["money"]["sentence"] is None


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"colour": "red"}, "unknown parameter(s) colour; allowed:"),
        ({"dataset": "nope"}, "unknown data set 'nope'"),
        ({"fleet_gpus": "0"}, "fleet_gpus must be >= 1"),
        ({"since": "soon"}, "'soon' is not a time span"),
    ],
)
def test_bad_parameters_are_a_400_naming_them(scenario, params, says):
    url, _sc = scenario
    r = _get(url, "/api/v1/analytics/overview", **params)
    assert r.status_code == 400
    assert says in r.json()["error"]["message"]


def test_cache_computes_once_for_concurrent_callers():
    cache = OverviewCache()
    started, release = threading.Event(), threading.Event()
    calls = []

    def compute():
        calls.append(1)
        started.set()
        release.wait(10)
        return "result"

    results = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.get("k", 60.0, compute))) for _ in range(4)
    ]
    threads[0].start()
    started.wait(10)
    for t in threads[1:]:
        t.start()
    release.set()
    for t in threads:
        t.join(10)
    assert results == ["result"] * 4 and len(calls) == 1
    assert cache.get("k", 60.0, compute) == "result" and len(calls) == 1
    assert cache.get("k", 0.0, compute) == "result" and len(calls) == 2  # expired: computed again


def test_a_failed_computation_is_not_cached():
    cache = OverviewCache()

    def fail():
        raise ValueError("bad window")

    with pytest.raises(ValueError, match="bad window"):
        cache.get("k", 60.0, fail)
    assert cache.get("k", 60.0, lambda: "ok") == "ok"


def test_cache_keys_round_live_windows_and_follow_imports():
    k1, ttl, p1 = cache_key({"dataset": "live", "since": "5m"}, imports=0, now_s=1000.3)
    k2, _, p2 = cache_key({"dataset": "live", "since": "5m"}, imports=5, now_s=1000.3 + LIVE_ROUND_S / 4)
    assert k1 == k2 and p1["end_s"] == p2["end_s"] == 1000.0 and ttl < 60
    k3, _, _ = cache_key({"dataset": "live", "since": "5m"}, imports=0, now_s=1000.3 + LIVE_ROUND_S)
    assert k3 != k1  # the window moved on
    s1, sttl, _ = cache_key({"dataset": "abc"}, imports=1, now_s=1000.0)
    s2, _, _ = cache_key({"dataset": "abc"}, imports=1, now_s=9000.0)
    s3, _, _ = cache_key({"dataset": "abc"}, imports=2, now_s=1000.0)
    assert s1 == s2 and s1 != s3 and sttl == float("inf")  # a scenario: until the store takes an import


def test_a_rolling_live_window_answers_its_newest_result_while_recomputing(tmp_path, monkeypatch):
    import phaselens.overview as ov
    from collector.store import Store

    with Store.open(tmp_path / "empty.duckdb") as store:
        service = ov.OverviewService(store, lambda: 0)
        first = service.get({"dataset": "live", "since": "1h"})
        assert service.get({"dataset": "live", "since": "1h"}) is first  # young: as it is
        fixed = {
            "dataset": "live",
            "start_s": 1_700_000_000.0,
            "end_s": 1_700_000_060.0,
        }  # a fixed window: the plain cache
        assert service.get(fixed) is service.get(fixed)
        monkeypatch.setattr(ov, "LIVE_TTL_S", 0.0)  # every answer is now due for a recomputation
        monkeypatch.setattr(ov, "LIVE_ROUND_S", 0.001)
        assert service.get({"dataset": "live", "since": "1h"}) is first  # answered at once ...
        deadline = time.monotonic() + 30
        while (newer := service.get({"dataset": "live", "since": "1h"})) is first:  # ... then replaced
            assert time.monotonic() < deadline, "no background recomputation"
            time.sleep(0.05)
        assert newer.computed_at_s > first.computed_at_s
        assert newer.overview["window"]["end_s"] > first.overview["window"]["end_s"]
        monkeypatch.setattr(ov, "LIVE_STALE_S", 0.0)  # too old to answer: computed in the foreground
        fresh = service.get({"dataset": "live", "since": "1h"})
        assert fresh.computed_at_s >= newer.computed_at_s
