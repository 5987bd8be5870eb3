"""Latency percentiles, SLO attainment (over time), trust labels, histogram estimates, simulated data."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest

from analytics.latency import SloSpec, bucket_quantile, histogram_percentiles, latency_summary
from analytics.trust import EMULATED, ESTIMATED, HOST_BOUND, MEASURED, SIMULATED
from analytics.window import AnalyticsError, Window, resolve_window, scenarios
from collector.store import Store

NODE = "n1"
SLO = SloSpec(ttft_s=0.5, tpot_s=0.05)


def make_store(path: Path, tables: dict[str, list[dict[str, Any]]]) -> duckdb.DuckDBPyConnection:
    with Store.open(path) as store:
        for table, rows in tables.items():
            if rows:
                store.append(table, rows)
    return duckdb.connect(str(path), read_only=True)


def request(rid: str, arrival_s: float, ttft_s: float | None, e2e_s: float, out: int, **kw: Any) -> dict:
    return {
        "node": NODE,
        "source": "router",
        "request_id": rid,
        "arrival_s": arrival_s,
        "first_token_s": None if ttft_s is None else arrival_s + ttft_s,
        "finish_s": arrival_s + e2e_s,
        "prompt_tokens": 10,
        "output_tokens": out,
        "prefill_worker": "w0",
        "decode_worker": "w0",
        "status": "ok",
        **kw,
    }


# r1: TTFT 0.2, TPOT (1.2 - 0.2) / 10 = 0.1 → misses TPOT; r2: TTFT 0.3, TPOT 0.7/20 = 0.035 → meets;
# r3: one token, TTFT 0.4 → meets (no TPOT); r4: error → misses; r5: TTFT 0.9 → misses TTFT
REQUESTS = [
    request("r1", 10.0, 0.2, 1.2, 11),
    request("r2", 10.5, 0.3, 1.0, 21),
    request("r3", 11.2, 0.4, 0.4, 1),
    request("r4", 11.5, None, 0.1, 0, status="error"),
    request("r5", 12.1, 0.9, 1.9, 26),
]
TOKENS = [
    {"node": NODE, "request_id": "r2", "idx": i, "ts_s": 10.8 + 0.035 * i, "itl_s": None if i == 0 else itl}
    for i, itl in enumerate([0.0, 0.02, 0.03, 0.05])
]


def device(emulated: bool, worker: str = "w0") -> dict[str, Any]:
    return {
        "node": NODE,
        "source": "nvml" if not emulated else "emulated",
        "device": "cuda:0",
        "index": 0,
        "since_s": 0.0,
        "kind": "emulated" if emulated else "cuda",
        "uuid": "GPU-a",
        "name": "NVIDIA H100 80GB HBM3" + (" (emulated)" if emulated else ""),
        "emulated": emulated,
        "worker": worker,
        "role": "mixed",
    }


@pytest.fixture
def hand(tmp_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    con = make_store(
        tmp_path / "lat.duckdb", {"requests": REQUESTS, "tokens": TOKENS, "devices": [device(False)]}
    )
    yield con
    con.close()


def test_hand_percentiles_and_attainment(hand: duckdb.DuckDBPyConnection) -> None:
    s = latency_summary(hand, Window(0.0, 20.0), SLO)
    assert (s.requests, s.ok, s.failed) == (5, 4, 1)
    assert s.by_status == {"ok": 4, "error": 1}
    ttft = np.array([0.2, 0.3, 0.4, 0.9])
    assert s.percentiles["ttft"].p50_s == pytest.approx(np.percentile(ttft, 50))
    assert s.percentiles["ttft"].p99_s == pytest.approx(np.percentile(ttft, 99))
    assert s.percentiles["ttft"].n == 4
    tpot = np.array([0.1, 0.035, 0.04])  # r1, r2, r5 (r3 has one token)
    assert s.percentiles["tpot"].p90_s == pytest.approx(np.percentile(tpot, 90))
    assert s.percentiles["e2e"].mean_s == pytest.approx(np.mean([1.2, 1.0, 0.4, 1.9]))
    assert s.percentiles["itl"].n == 3
    assert s.percentiles["itl"].p50_s == pytest.approx(0.03)
    assert s.attainment["both"] == pytest.approx(2 / 5)  # r2, r3
    assert s.attainment["ttft"] == pytest.approx(3 / 5)  # r1, r2, r3
    assert s.attainment["tpot"] == pytest.approx(3 / 5)  # r2, r3, r5
    assert s.attainment["met"] == 2
    assert any("1 of 5 requests did not finish ok (error: 1)" in n for n in s.trust.notes)
    assert s.trust.labels == {MEASURED}
    json.dumps(s.to_dict())


def test_attainment_over_time(hand: duckdb.DuckDBPyConnection) -> None:
    s = latency_summary(hand, Window(10.0, 13.0), SLO, bucket_s=1.0)
    t = s.over_time
    assert t["bucket_start_s"].tolist() == [10.0, 11.0, 12.0]
    assert t["requests"].tolist() == [2, 2, 1]
    assert t["failed"].tolist() == [0, 1, 0]
    assert t["attainment"].tolist() == [0.5, 0.5, 0.0]
    assert t.loc[0, "ttft_p50_s"] == pytest.approx(0.25)
    assert t.loc[0, "itl_p50_s"] == pytest.approx(0.03)  # r2's tokens at 10.8–10.9
    assert math.isnan(t.loc[1, "itl_p50_s"])


def test_slo_changes_attainment(hand: duckdb.DuckDBPyConnection) -> None:
    loose = latency_summary(hand, Window(0.0, 20.0), SloSpec(ttft_s=1.0, tpot_s=0.2))
    assert loose.attainment["both"] == pytest.approx(4 / 5)  # all but the failed one
    with pytest.raises(AnalyticsError, match="SLOs must be > 0"):
        latency_summary(hand, Window(0.0, 20.0), SloSpec(ttft_s=0.0, tpot_s=0.1))


def test_emulated_and_host_bound_labels(tmp_path: Path) -> None:
    lagged = {
        "node": NODE,
        "source": "worker-0",
        "worker": "w0",
        "gpu_uuid": "GPU-a",
        "start_s": 10.0,
        "end_s": 10.2,
        "phase": "prefill",
        "lag_s": 0.05,
        "modeled_s": 0.15,
    }
    con = make_store(
        tmp_path / "emu.duckdb", {"requests": REQUESTS, "devices": [device(True)], "iterations": [lagged]}
    )
    s = latency_summary(con, Window(0.0, 20.0), SLO)
    assert s.by_trust == {EMULATED: 5}
    assert EMULATED in s.trust.labels and HOST_BOUND in s.trust.labels and MEASURED not in s.trust.labels
    assert any("1 of 1 iterations" in n for n in s.trust.notes)
    con.close()


def test_unknown_gpu_is_said(tmp_path: Path) -> None:
    con = make_store(tmp_path / "nodev.duckdb", {"requests": REQUESTS})
    s = latency_summary(con, Window(0.0, 20.0), SLO)
    assert s.trust.labels == {MEASURED}
    assert any("no devices row" in n for n in s.trust.notes)
    con.close()


def test_empty_window(hand: duckdb.DuckDBPyConnection) -> None:
    s = latency_summary(hand, Window(100.0, 200.0), SLO)
    assert s.requests == 0 and math.isnan(s.attainment["both"])
    assert all(math.isnan(p.p50_s) and p.n == 0 for p in s.percentiles.values())
    assert s.over_time.empty
    assert any("nothing to report" in n for n in s.trust.notes)


# -- histograms ---------------------------------------------------------------------------------------


def test_bucket_quantile_by_hand() -> None:
    bounds = [0.1, 0.5, 1.0, math.inf]
    cum = [10.0, 60.0, 90.0, 100.0]
    assert bucket_quantile(0.5, bounds, cum) == (pytest.approx(0.1 + 0.4 * 40 / 50), (0.1, 0.5))
    assert bucket_quantile(0.05, bounds, cum) == (pytest.approx(0.05), (0.0, 0.1))
    assert bucket_quantile(0.9, bounds, cum) == (pytest.approx(1.0), (0.5, 1.0))
    assert bucket_quantile(0.99, bounds, cum) == (1.0, (1.0, math.inf))  # in +Inf: the largest bound
    est, b = bucket_quantile(0.5, bounds, [0.0, 0.0, 0.0, 0.0])
    assert math.isnan(est) and math.isnan(b[0])
    assert math.isnan(bucket_quantile(0.5, [0.1, 0.5], [1.0, 2.0])[0])  # no +Inf bucket
    with pytest.raises(AnalyticsError):
        bucket_quantile(1.5, bounds, cum)


def hist_rows(ts: float, counts: dict[str, float], total_sum: float, model: str = "m") -> list[dict]:
    rows = [
        {
            "node": NODE,
            "endpoint": "http://vllm:8000/metrics",
            "engine": "vllm",
            "ts_s": ts,
            "metric": "ttft_seconds_bucket",
            "labels": {"le": le, "model_name": model},
            "value": v,
        }
        for le, v in counts.items()
    ]
    rows.append(
        {
            **rows[0],
            "metric": "ttft_seconds_sum",
            "labels": {"model_name": model},
            "value": total_sum,
        }
    )
    rows.append({**rows[-1], "metric": "ttft_seconds_count", "value": counts["+Inf"]})
    return rows


def test_histogram_percentiles_from_engine_metrics(tmp_path: Path) -> None:
    rows = (
        hist_rows(10.0, {"0.1": 5, "0.5": 5, "1.0": 5, "+Inf": 5}, 1.0)
        + hist_rows(20.0, {"0.1": 15, "0.5": 55, "1.0": 85, "+Inf": 95}, 31.0)
        # the engine restarted: counters start over; the increase is the new value
        + hist_rows(30.0, {"0.1": 0, "0.5": 5, "1.0": 5, "+Inf": 10}, 5.0)
    )
    con = make_store(tmp_path / "hist.duckdb", {"engine_metrics": rows})
    est = histogram_percentiles(con, Window(0.0, 40.0))
    ttft = est["ttft"]
    # increases: le 0.1: 10 + 0 = 10; 0.5: 50 + 5 = 55; 1.0: 80 + 5 = 85; +Inf: 90 + 10 = 100
    assert ttft.n == 100 and ttft.method == "histogram"
    assert ttft.p50_s == pytest.approx(0.1 + 0.4 * (50 - 10) / 45)
    assert ttft.bounds_s["p50"] == (0.1, 0.5)
    assert ttft.p90_s == 1.0 and ttft.bounds_s["p90"] == (1.0, math.inf)
    assert ttft.mean_s == pytest.approx((30.0 + 5.0) / 100)
    s = latency_summary(con, Window(0.0, 40.0), SLO)
    assert s.requests == 0 and s.percentiles["ttft"].method == "histogram"
    assert ESTIMATED in s.trust.labels
    assert "tpot" not in s.estimated
    con.close()


# -- on simulated data --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[duckdb.DuckDBPyConnection]:
    db = tmp_path_factory.mktemp("sim") / "sim.duckdb"
    cmd = [sys.executable, "-m", "phaselens.cli", "simulate", "--no-progress", "--model", "llama-3.1-8b"]
    cmd += ["--layout", "1p1d:h100-sxm", "--duration", "120", "--slo-ttft-ms", "50", "--slo-tpot-ms", "8.5"]
    cmd += ["--db", str(db)]
    subprocess.run(cmd, check=True, capture_output=True)
    con = duckdb.connect(str(db), read_only=True)
    yield con
    con.close()


def test_simulated_latency_matches_the_simulators_summary(sim_store: duckdb.DuckDBPyConnection) -> None:
    (sc,) = scenarios(sim_store)
    summary = json.loads(
        sim_store.execute(
            "SELECT summary FROM scenarios WHERE scenario_id = ?", [sc["scenario_id"]]
        ).fetchone()[0]
    )
    w = resolve_window(sim_store, dataset=sc["scenario_id"])
    w = Window(w.start_s, w.end_s + 1.0, w.dataset)  # the last request arrives before end_s anyway
    s = latency_summary(sim_store, w, SloSpec(ttft_s=0.05, tpot_s=0.0085))
    assert s.trust.labels == {SIMULATED}
    assert s.requests == summary["requests"]
    assert s.percentiles["ttft"].p50_s == pytest.approx(summary["ttft_p50_s"], rel=1e-6)
    assert s.percentiles["tpot"].p99_s == pytest.approx(summary["tpot_p99_s"], rel=1e-6)
    assert s.percentiles["itl"].p50_s == pytest.approx(summary["itl_p50_s"], abs=1e-6)  # stored ts: µs
    assert s.attainment["both"] == pytest.approx(summary["slo_attainment"], abs=1e-9)
    assert 0 < s.attainment["both"] < 1  # the tight SLOs bite
    assert s.over_time["requests"].sum() == s.requests


def test_clock_skew_is_said(tmp_path: Path) -> None:
    skewed = request("s1", 10.0, -0.2, 1.0, 5)  # first token stamped before arrival
    con = make_store(tmp_path / "skew.duckdb", {"requests": [*REQUESTS, skewed], "devices": [device(False)]})
    s = latency_summary(con, Window(0.0, 20.0), SLO)
    assert any("clock skew" in n and n.startswith("1 ok requests") for n in s.trust.notes)
    assert s.percentiles["ttft"].n == 5
    con.close()


def test_a_live_window_narrowed_to_nodes(hand: duckdb.DuckDBPyConnection) -> None:
    assert latency_summary(hand, Window(0.0, 20.0, nodes=("n1",)), SLO).requests == 5
    assert latency_summary(hand, Window(0.0, 20.0, nodes=("n2", "n3")), SLO).requests == 0
    assert latency_summary(hand, Window(0.0, 20.0, "some-scenario"), SLO).requests == 0


def test_attainment_basis_states_the_denominator_and_the_failures() -> None:
    from analytics.latency import attainment_basis

    assert attainment_basis({"requests": 20, "failed": 10, "attainment": {"met": 10}}) == (
        "10 of 20 requests; 10 failed, each a miss"
    )
    assert (
        attainment_basis({"requests": 50, "failed": 0, "attainment": {"met": 50}})
        == "50 of 50 requests; none failed"
    )
