"""The service's summary cache (phaselens/summary_cache.py): a window's summary computed once, the
variants of a page (SLO, fleet size, prices, skipped parts) reusing its parts, every figure equal to
a fresh summary of the window (what ``phaselens analyze`` prints) — on a real store of a simulated
scenario, and through a real collector's GET /api/v1/analytics/summary."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from analytics.reads import run_summary
from collector.store import Store
from phaselens.summary_cache import SummaryCache
from phaselens.summary_warm import ENV, warm_enabled
from tests.collector.conftest import start_collector

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    db = tmp_path_factory.mktemp("summary_cache") / "sim.duckdb"
    cmd = [sys.executable, "-m", "phaselens.cli", "simulate", "--no-progress", "--limit", "60"]
    done = subprocess.run(
        [*cmd, "--db", str(db), "--layout", "1p1d:h100-sxm"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    sid = next(x for x in done.stdout.splitlines() if x.startswith("scenario ")).split()[1].rstrip(":")
    yield db, sid


def _norm(x: object) -> object:
    """Floats to 9 significant digits (DuckDB's parallel sums differ in the last bits from one run
    to the next)."""
    if isinstance(x, dict):
        return {k: _norm(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_norm(v) for v in x]
    return float(f"{x:.9g}") if isinstance(x, float) else x


def _figures(summary: dict) -> dict:
    """The summary without its run times, :func:`_norm`'d."""
    body = json.loads(json.dumps(summary))
    body.pop("seconds")
    return _norm(body)  # type: ignore[return-value]


VARIANTS = [
    ({}, frozenset({"bimodal"})),  # the Overview's
    ({}, frozenset()),  # the Bimodal page's
    ({"slo_ttft_ms": 500, "slo_tpot_ms": 40}, frozenset()),  # the Latency page's
    ({"fleet_gpus": 100}, frozenset()),  # the Cost page's
    ({"fleet_gpus": 100, "pue": 1.2, "gpu_usd_per_hour": 3.5}, frozenset()),  # other prices
    ({"start_s_half": True}, frozenset()),  # another window: computed afresh
]


def test_every_variant_equals_a_fresh_summary_and_reuses_the_window(scenario):
    db, sid = scenario
    with Store.open(db) as store:
        cache = SummaryCache(store, lambda: 0)
        with store.reader() as cur:
            span = cur.execute("SELECT start_s, end_s FROM scenarios WHERE scenario_id = ?", [sid]).fetchone()
        reused = []
        for extra, skip in VARIANTS:
            params = {"dataset": sid} | {k: v for k, v in extra.items() if k != "start_s_half"}
            if "start_s_half" in extra:
                params["start_s"] = (span[0] + span[1]) / 2
            got = cache.get(params, skip=skip)
            with store.reader() as cur:
                want = run_summary(cur, params, skip=skip)
            assert _figures(got) == _figures(want), (extra, skip)
            assert ("bimodal" in got["parts"]) == ("bimodal" not in skip)
            reused.append(got["seconds"]["intervals"] == 0.0)  # no GPU-interval table built
        # the Overview's computed the window; every later variant of it reused its parts (the
        # Bimodal page's built the interval table for the bimodality alone); the other window not
        assert reused == [False, False, True, True, True, False]
        assert cache.part_reuses == 4
        # asked again: the very same answer (not recomputed)
        again = cache.get({"dataset": sid, "fleet_gpus": 100})
        assert again is cache.get({"dataset": sid, "fleet_gpus": 100})
        assert cache.answers.hits >= 2


def test_the_service_answers_a_page_variant_from_the_window_it_computed(scenario):
    db, sid = scenario
    copy = db.with_name("served.duckdb")
    copy.write_bytes(db.read_bytes())
    with Store.open(copy, read_only=True) as store, store.reader() as cur:
        s0, s1 = cur.execute("SELECT start_s, end_s FROM scenarios WHERE scenario_id = ?", [sid]).fetchone()
    # the second half: a window the service does not compute ahead (phaselens/summary_warm.py)
    half = {"dataset": sid, "start_s": (s0 + s1) / 2}
    proc, url = start_collector(copy)
    try:
        get = lambda **p: httpx.get(f"{url}/api/v1/analytics/summary", params=p, timeout=120)  # noqa: E731
        first = get(**half).json()
        latency = get(**half, slo_ttft_ms=300, slo_tpot_ms=30).json()
        assert first["seconds"]["intervals"] > 0 and latency["seconds"]["intervals"] == 0.0
        assert latency["parts"]["latency"]["slo"]["ttft_s"] == pytest.approx(0.3)
        assert first["parts"]["phases"] == latency["parts"]["phases"]
        bad = get(dataset=sid, slo_ttft_ms=-1)
        assert bad.status_code == 400 and "slo_ttft_ms" in bad.text  # refused, not cached
    finally:
        proc.terminate()
        proc.wait(20)
    with Store.open(copy, read_only=True) as store, store.reader() as cur:
        want = run_summary(cur, half | {"slo_ttft_ms": 300, "slo_tpot_ms": 30})
    assert _figures(latency) == _figures(want)


def test_the_histogram_is_cached_like_the_summary(scenario):
    db, sid = scenario
    with Store.open(db) as store:
        cache = SummaryCache(store, lambda: 0)
        from analytics.reads import run_histogram

        calls = []

        def run(con, params):
            calls.append(params)
            return run_histogram(con, params)

        with store.reader() as cur:
            a = cache.read("histogram", {"dataset": sid}, run, cur)
            b = cache.read("histogram", {"dataset": sid}, run, cur)
            c = cache.read("histogram", {"dataset": sid, "bin_pct": 5}, run, cur)
            assert a is b and len(calls) == 2  # the same window and bins: computed once
            assert _norm(a) == _norm(run_histogram(cur, {"dataset": sid})) and c != a


def test_the_overview_has_the_whole_summary_completed_for_the_bimodal_page(scenario):
    db, sid = scenario
    with Store.open(db) as store:
        cache = SummaryCache(store, lambda: 0)
        first = cache.get({"dataset": sid, "fleet_gpus": 8}, skip=frozenset({"bimodal"}), complete_later=True)
        assert "bimodal" not in first["parts"]
        deadline = time.monotonic() + 120  # the completion started above, on its own thread
        while cache.completing() and time.monotonic() < deadline:
            time.sleep(0.05)
        # the Bimodal page's read reuses its parts (one arriving during it waits for it)
        whole = cache.get({"dataset": sid})
        assert whole["seconds"]["intervals"] == 0.0 and "bimodal" in whole["parts"]
        with store.reader() as cur:
            assert _figures(whole) == _figures(run_summary(cur, {"dataset": sid}))
        cache.close()


def _warm_state(url: str, imports: int, timeout_s: float = 120.0) -> dict:
    """/health's summary_warm once it has done the store's ``imports``-th import count."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = httpx.get(f"{url}/health", timeout=30).json().get("summary_warm") or {}
        if got.get("imports") == imports and got.get("state") in ("computed", "failed", "no scenario"):
            return got
        time.sleep(0.1)
    raise AssertionError(f"no warm-up of import count {imports} within {timeout_s:g} s: {got}")


def test_the_newest_scenarios_overview_is_computed_at_start_and_after_each_import(
    scenario, tmp_path, monkeypatch
):
    """The service computes the Overview the dashboard asks first (the newest scenario's whole span,
    its GPUs as the fleet size) before anyone asks: the page's request is answered with that result,
    equal to a fresh computation; a scenario merged later is computed in its turn."""
    from phaselens.overview import compute_overview

    monkeypatch.setenv(ENV, "on")  # the tests' collectors run without it (tests/conftest.py)

    db, sid = scenario
    copy = tmp_path / "warm.duckdb"
    copy.write_bytes(db.read_bytes())
    with Store.open(copy, read_only=True) as store, store.reader() as cur:
        s0, s1 = cur.execute("SELECT start_s, end_s FROM scenarios WHERE scenario_id = ?", [sid]).fetchone()
    # what the Overview sends first for a scenario (the sidebar's whole range, 1p1d: 2 GPUs), by hand
    page = {"dataset": sid, "start_s": s0, "end_s": s0 + round(s1 - s0, 1), "fleet_gpus": 2}
    proc, url = start_collector(copy, "--control-token", "warm-token")
    try:
        warm = _warm_state(url, 0)
        assert warm["state"] == "computed" and warm["scenario"] == sid, warm
        asked_s = time.time()
        got = httpx.get(f"{url}/api/v1/analytics/overview", params=page, timeout=120).json()
        assert got["computed_at_s"] < asked_s  # computed ahead, not for this request
        # a second scenario merged through the running service: the newest, computed in its turn
        cmd = [sys.executable, "-m", "phaselens.cli", "simulate", "--no-progress", "--limit", "30"]
        cmd += ["--collector", url, "--token", "warm-token", "--layout", "1p1d:h100-sxm"]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        sid2 = next(x for x in done.stdout.splitlines() if x.startswith("scenario ")).split()[1].rstrip(":")
        warm2 = _warm_state(url, 1)
        assert warm2["state"] == "computed" and warm2["scenario"] == sid2, warm2
    finally:
        proc.terminate()
        proc.wait(20)
    with Store.open(copy, read_only=True) as store, store.reader() as cur:
        want = compute_overview(cur, {k: str(v) for k, v in page.items()}).overview
    got.pop("computed_at_s"), got.pop("compute_s")
    assert _norm(json.loads(json.dumps(got))) == _norm(json.loads(json.dumps(want)))


def test_the_warm_up_is_off_with_the_flag_or_the_variable_and_a_bad_value_is_refused(
    scenario, tmp_path, monkeypatch
):
    """--no-summary-warm (over $PHASELENS_SUMMARY_WARM=on) or the variable off: the service computes
    nothing ahead (its /health says off) and the page's Overview is computed when asked; a value of
    the variable that is neither on nor off stops `phaselens collect` with one naming it."""
    assert warm_enabled(env={}) and warm_enabled(env={ENV: " ON "}) and warm_enabled(env={ENV: "1"})
    assert not warm_enabled(env={ENV: "off"}) and not warm_enabled(env={ENV: "0"})
    assert not warm_enabled(True, env={ENV: "on"})
    with pytest.raises(ValueError, match=r"\$PHASELENS_SUMMARY_WARM='maybe': allowed: 1, on, true, yes"):
        warm_enabled(env={ENV: "maybe"})

    db, sid = scenario
    copy = tmp_path / "cold.duckdb"
    copy.write_bytes(db.read_bytes())
    monkeypatch.setenv(ENV, "on")
    proc, url = start_collector(copy, "--no-summary-warm")
    try:
        # "off" from the start (an enabled warm-up says "not started", then what it did)
        assert httpx.get(f"{url}/health", timeout=30).json()["summary_warm"] == {"state": "off"}
        asked_s = time.time()
        got = httpx.get(f"{url}/api/v1/analytics/overview", params={"dataset": sid}, timeout=120).json()
        assert got["computed_at_s"] >= asked_s  # computed for this request
    finally:
        proc.terminate()
        proc.wait(20)

    monkeypatch.setenv(ENV, "maybe")
    cmd = [sys.executable, "-m", "phaselens.cli", "collect", "--db", str(copy), "--no-nvml", "--port", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2 and "$PHASELENS_SUMMARY_WARM='maybe': allowed" in done.stderr, done.stderr
