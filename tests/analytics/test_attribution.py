"""Phase attribution: hand-computed intervals, the power model, reconciliation, bad input."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pytest

from analytics.attribution import STATES, gpu_buckets, gpu_intervals, phase_breakdown
from analytics.power_model import (
    MODEL_TERMS,
    PowerFit,
    bounded_lsq_gram,
    gpu_key,
    nnls_gram,
    poor_fit_notes,
)
from analytics.trust import ESTIMATED, HOST_BOUND, MEASURED
from analytics.window import Window
from collector.store import Store

NODE = "n1"
GPU = {"node": NODE, "source": "nvml", "device": "cuda:0", "index": 0}
KEY = gpu_key(NODE, "nvml", "cuda:0", 0)
WINDOW = Window(100.0, 105.0, "live")
# true power per model term, W: the hand case's energies are generated from them
TRUE_W = {"prefill": 500.0, "decode": 250.0, "idle": 100.0}  # host-bound time draws idle power


def samples(ts: list[float], energy_mj: list[int | None], **cols: Any) -> list[dict[str, Any]]:
    """gpu_samples rows (wide: the device attributes go to ``devices``) of GPU ``cuda:0``."""
    base = {
        **GPU,
        "kind": "cuda",
        "uuid": "GPU-a",
        "name": "NVIDIA H100 80GB HBM3",
        "emulated": False,
        "worker": "w0",
        "role": "mixed",
        "sm_active_pct": 50.0,
        "gpu_util_pct": 90.0,
        "dram_active_pct": 40.0,
        "power_w": 200.0,
    }
    return [{**base, "ts_s": t, "energy_mj": e, **cols} for t, e in zip(ts, energy_mj, strict=True)]


def iteration(start_s: float, end_s: float, phase: str, **cols: Any) -> dict[str, Any]:
    return {
        "node": NODE,
        "source": "worker-0",
        "worker": "w0",
        "gpu_uuid": "GPU-a",
        "gpu_index": 0,
        "start_s": start_s,
        "end_s": end_s,
        "phase": phase,
        **cols,
    }


def request(rid: str, arrival_s: float, finish_s: float, **cols: Any) -> dict[str, Any]:
    return {
        "node": NODE,
        "source": "router",
        "request_id": rid,
        "arrival_s": arrival_s,
        "finish_s": finish_s,
        "prefill_worker": "w0",
        "decode_worker": "w0",
        "status": "ok",
        **cols,
    }


HAND_ITERATIONS = [
    iteration(100.2, 100.7, "prefill", prefill_tokens=500),
    iteration(100.9, 101.3, "decode", decode_seqs=8),
    iteration(101.5, 102.5, "mixed", prefill_tokens=300, decode_seqs=100),  # 3/4 prefill by tokens
    iteration(102.6, 103.0, "decode", decode_seqs=8, modeled_s=0.3, lag_s=0.0),  # 0.1 s host first
]
HAND_REQUESTS = [request("r1", 100.0, 101.3), request("r2", 101.4, 103.0)]
# expected state seconds per interval (100,101], (101,102], (102,103], (103,104]
HAND_STATES = {
    "prefill_s": [0.5, 0.0, 0.0, 0.0],
    "decode_s": [0.1, 0.3, 0.3, 0.0],
    "mixed_prefill_s": [0.0, 0.375, 0.375, 0.0],
    "mixed_decode_s": [0.0, 0.125, 0.125, 0.0],
    "host_s": [0.0, 0.0, 0.1, 0.0],
    "gap_s": [0.4, 0.1, 0.1, 0.0],
    "idle_s": [0.0, 0.1, 0.0, 1.0],
}


def hand_energy_j() -> list[float]:
    """Interval energies made from TRUE_W and HAND_STATES."""
    term = {
        "prefill_s": "prefill",
        "mixed_prefill_s": "prefill",
        "decode_s": "decode",
        "mixed_decode_s": "decode",
        "host_s": "idle",
        "gap_s": "idle",
        "idle_s": "idle",
    }
    return [sum(TRUE_W[term[s]] * HAND_STATES[s][i] for s in HAND_STATES) for i in range(4)]


def counter_mj(energies_j: list[float], start_mj: int = 1_000_000) -> list[int]:
    out = [start_mj]
    for e in energies_j:
        out.append(out[-1] + round(e * 1000))
    return out


def make_store(path: Path, tables: dict[str, list[dict[str, Any]]]) -> duckdb.DuckDBPyConnection:
    """A store file with these rows, reopened read-only (as analytics read it)."""
    with Store.open(path) as store:
        for table, rows in tables.items():
            if rows:
                store.append(table, rows)
    return duckdb.connect(str(path), read_only=True)


@pytest.fixture
def hand(tmp_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    con = make_store(
        tmp_path / "hand.duckdb",
        {
            "gpu_samples": samples([100.0, 101.0, 102.0, 103.0, 104.0], counter_mj(hand_energy_j())),
            "iterations": HAND_ITERATIONS,
            "requests": HAND_REQUESTS,
        },
    )
    yield con
    con.close()


@pytest.mark.parametrize("rows", ["intervals", "buckets"])
def test_interval_states_are_the_hand_computed_seconds(hand, rows):
    # 1 s buckets over 1 s samples: the same rows as the sample intervals
    df = gpu_intervals(hand, WINDOW) if rows == "intervals" else gpu_buckets(hand, WINDOW, 1.0)
    assert list(df["t0_s"]) == [100.0, 101.0, 102.0, 103.0]  # the first sample only opens
    assert list(df["interval_s"]) == [1.0, 1.0, 1.0, 1.0]
    for state, expected in HAND_STATES.items():
        np.testing.assert_allclose(df[state], expected, atol=1e-9, err_msg=state)
    np.testing.assert_allclose(df[list(STATES)].sum(axis=1), df["interval_s"], atol=1e-9)
    np.testing.assert_allclose(df["energy_j"], hand_energy_j(), atol=1e-3)
    assert set(df["energy_source"]) == {"counter"}
    assert set(df["worker"]) == {"w0"} and set(df["role"]) == {"mixed"}
    assert set(df["trust"]) == {MEASURED} and not df["host_bound"].any()


@pytest.mark.parametrize("bucket_s", [0.0, 1.0])
def test_power_model_recovers_the_watts_and_apportions_exactly(hand, bucket_s):
    pb = phase_breakdown(hand, WINDOW, bucket_s=bucket_s)
    fit = pb.fits[KEY]
    for term in MODEL_TERMS:
        assert fit.coef_w[term] == pytest.approx(TRUE_W[term], rel=1e-6)
    assert fit.r2 == pytest.approx(1.0, abs=1e-9) and fit.intervals == 4
    g = pb.per_gpu.iloc[0]
    expected_j = {
        "prefill": 0.5 * 500,
        "mixed_prefill": 0.75 * 500,
        "decode": 0.7 * 250,
        "mixed_decode": 0.25 * 250,
        "host": 0.1 * 100,
        "gap": 0.6 * 100,
        "idle": 1.1 * 100,
    }
    for state, joules in expected_j.items():
        assert g[f"energy_{state}_j"] == pytest.approx(joules, rel=1e-6), state
    assert g["energy_j"] == pytest.approx(sum(hand_energy_j()), rel=1e-9)
    assert sum(g[f"frac_{s[:-2]}"] for s in STATES) == pytest.approx(1.0)
    assert g["frac_idle"] == pytest.approx(1.1 / 4)
    assert pb.trust.labels == {MEASURED}
    assert pb.missing == []
    assert pb.per_pool.iloc[0]["role"] == "mixed" and pb.per_pool.iloc[0]["gpus"] == 1
    assert len(pb.per_hour) == 1 and pb.per_hour.iloc[0]["energy_j"] == pytest.approx(g["energy_j"])
    d = json.loads(json.dumps(pb.to_dict()))  # JSON as it is
    assert d["fits"][KEY]["coef_w"]["decode"] == pytest.approx(250.0)
    assert d["per_gpu"][0]["index"] == 0 and d["per_gpu"][0]["energy_j"] == pytest.approx(g["energy_j"])


@pytest.mark.parametrize("bucket_s", [None, 0.0, 1.0, 2.0])
def test_attributed_energy_equals_the_counter_delta_even_when_the_model_does_not_fit(tmp_path, bucket_s):
    # energies that no non-negative model reproduces (noise): apportionment still sums to them
    rng = np.random.default_rng(3)
    noisy = [e * f for e, f in zip(hand_energy_j(), rng.uniform(0.5, 1.6, 4), strict=True)]
    con = make_store(
        tmp_path / "noisy.duckdb",
        {
            "gpu_samples": samples([100.0, 101.0, 102.0, 103.0, 104.0], counter_mj(noisy)),
            "iterations": HAND_ITERATIONS,
            "requests": HAND_REQUESTS,
        },
    )
    pb = phase_breakdown(con, WINDOW, bucket_s=bucket_s)
    g = pb.per_gpu.iloc[0]
    attributed = sum(g[f"energy_{s[:-2]}_j"] for s in STATES)
    assert sum(g[f"frac_{s[:-2]}"] for s in STATES) == pytest.approx(1.0)
    assert g["attributed_s"] == pytest.approx(4.0)
    delta_j = (counter_mj(noisy)[-1] - counter_mj(noisy)[0]) / 1000.0
    assert attributed == pytest.approx(delta_j, rel=0.01)
    assert g["energy_j"] == pytest.approx(delta_j, rel=1e-9)


def test_nnls_keeps_coefficients_non_negative_and_matches_unconstrained_when_feasible():
    x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    y = np.array([2.0, -1.0, 1.0])  # unconstrained: b2 < 0
    b = nnls_gram(x.T @ x, x.T @ y)
    assert b[1] == 0.0 and b[0] == pytest.approx(1.5)  # argmin over b1 of (b1-2)²+(b1-1)²
    y2 = np.array([2.0, 1.0, 3.0])
    assert nnls_gram(x.T @ x, x.T @ y2) == pytest.approx(np.linalg.lstsq(x, y2, rcond=None)[0])


def test_bounded_lsq_matches_nnls_and_respects_upper_bounds():
    x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    y = np.array([20.0, 1.0, 21.0])  # unconstrained: b = (20, 1)
    g, r = x.T @ x, x.T @ y
    assert bounded_lsq_gram(g, r, np.zeros(2), np.full(2, np.inf)) == pytest.approx([20.0, 1.0])
    # b1 capped at 5: b2 = argmin (b2-1)² + (5+b2-21)² = 8.5
    assert bounded_lsq_gram(g, r, np.zeros(2), np.array([5.0, 100.0])) == pytest.approx([5.0, 8.5])
    # b1 fixed at 3 (lo = hi): b2 = argmin (b2-1)² + (3+b2-21)² = 9.5
    assert bounded_lsq_gram(g, r, np.array([3.0, 0.0]), np.array([3.0, 100.0])) == pytest.approx([3.0, 9.5])


def test_bounded_lsq_meets_the_optimality_conditions_whatever_bounds_came_before():
    """KKT: a free coefficient has zero gradient, one at its lower bound a gradient >= 0, one at its
    upper bound <= 0 — on random problems whose bound patterns change from call to call."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        k = int(rng.integers(1, 4))
        x = rng.uniform(0.0, 1.0, size=(30, k))
        y = x @ rng.uniform(-50.0, 400.0, size=k) + rng.normal(0.0, 5.0, size=30)
        g, r = x.T @ x, x.T @ y
        lo = np.zeros(k)
        hi = rng.choice([np.inf, 0.0, 100.0, 300.0], size=k)
        b = bounded_lsq_gram(g, r, lo, hi)
        grad = g @ b - r
        tol = 1e-6 * max(1.0, float(np.abs(r).max()))
        assert np.all(b >= lo - 1e-9) and np.all(b <= hi + 1e-9)
        for i in range(k):
            if lo[i] < b[i] < hi[i]:
                assert abs(grad[i]) <= tol
            elif b[i] <= lo[i] and lo[i] < hi[i]:
                assert grad[i] >= -tol
            elif b[i] >= hi[i] and lo[i] < hi[i]:
                assert grad[i] <= tol


def _one_gpu_store(
    path: Path, joules: list[float], its: list[dict[str, Any]], **cols: Any
) -> duckdb.DuckDBPyConnection:
    """GPU cuda:0 sampled every 1 s from 100 s, with these interval energies and iterations."""
    ts = [100.0 + i for i in range(len(joules) + 1)]
    return make_store(path, {"gpu_samples": samples(ts, counter_mj(joules), **cols), "iterations": its})


@pytest.mark.parametrize("bucket_s", [0.0, 1.0])
def test_a_state_with_too_little_time_is_not_fitted_and_said_so(tmp_path, bucket_s):
    # 100 s at ~100 W (noisy) and one 0.5 s prefill in an interval with a 1.5 kJ spike: the
    # unbounded fit made that prefill draw > 3 kW on a 700 W GPU
    rng = np.random.default_rng(5)
    joules = list(100.0 + rng.normal(0.0, 5.0, 100))
    joules[50] += 1500.0
    con = _one_gpu_store(tmp_path / "thin.duckdb", joules, [iteration(150.2, 150.7, "prefill")])
    pb = phase_breakdown(con, Window(100.0, 201.0, "live"), bucket_s=bucket_s)
    fit = pb.fits[KEY]
    assert fit.coef_w["prefill"] is None and fit.coef_w["decode"] is None
    assert 90.0 < fit.coef_w["idle"] < 130.0
    assert fit.bound_w == 700.0 and "H100" in fit.bound_source  # the spec TDP (no power limit sampled)
    assert any("0.50 s of prefill in 1 intervals" in m and "not fitted" in m for m in fit.missing)
    assert any(m.startswith(KEY) and "prefill power not fitted" in m for m in pb.missing)
    g = pb.per_gpu.iloc[0]
    assert g["energy_prefill_j"] == 0.0  # named in missing: its interval's energy went to idle
    assert sum(g[f"energy_{s[:-2]}_j"] for s in STATES) == pytest.approx(sum(joules), rel=1e-6)
    assert g["energy_j"] == pytest.approx(sum(joules), rel=1e-6)


@pytest.mark.parametrize("bucket_s", [0.0, 1.0])
def test_power_coefficients_stay_within_the_power_limit(tmp_path, bucket_s):
    # 10 intervals of 0.5 s prefill drawing an impossible 2 kW (limit 700 W), 10 idle at 100 W
    joules = [0.5 * 2000.0 + 0.5 * 100.0] * 10 + [100.0] * 10
    its = [iteration(100.25 + i, 100.75 + i, "prefill") for i in range(10)]
    con = _one_gpu_store(tmp_path / "bound.duckdb", joules, its, power_limit_w=700.0, power_w=650.0)
    pb = phase_breakdown(con, Window(100.0, 121.0, "live"), bucket_s=bucket_s)
    fit = pb.fits[KEY]
    assert fit.coef_w["prefill"] == pytest.approx(700.0)
    # idle given prefill at 700 W: argmin 10·(0.5·I + 350 − 1050)² + 10·(I − 100)² → I = 360
    assert fit.coef_w["idle"] == pytest.approx(360.0)
    assert fit.bound_source == "the GPU's power limit"
    assert any("prefill power at its bound 700 W" in n for n in fit.notes)
    g = pb.per_gpu.iloc[0]
    assert sum(g[f"energy_{s[:-2]}_j"] for s in STATES) == pytest.approx(sum(joules), rel=1e-6)


def test_a_thin_state_takes_the_pooled_fit_of_its_models_gpus(tmp_path):
    # GPU 0: 0.5 s of prefill in 100 s (thin); GPU 1, same model: 10 × 0.5 s at 500 W
    rows = []
    for idx, uuid, prefill_at in (
        (0, "GPU-a", [150.2]),
        (1, "GPU-b", [100.2 + i for i in range(0, 100, 10)]),
    ):
        joules = [100.0] * 100
        for t in prefill_at:
            joules[int(t - 100.0)] = 0.5 * 500.0 + 0.5 * 100.0
        ts = [100.0 + i for i in range(101)]
        rows += [
            {**r, "index": idx, "device": f"cuda:{idx}", "uuid": uuid, "worker": f"w{idx}"}
            for r in samples(ts, counter_mj(joules))
        ]
    its = [iteration(150.2, 150.7, "prefill")] + [
        {**iteration(100.2 + i, 100.7 + i, "prefill"), "gpu_uuid": "GPU-b", "gpu_index": 1, "worker": "w1"}
        for i in range(0, 100, 10)
    ]
    con = make_store(tmp_path / "pooled.duckdb", {"gpu_samples": rows, "iterations": its})
    pb = phase_breakdown(con, Window(100.0, 201.0, "live"), bucket_s=0.0)
    fit0, fit1 = pb.fits[KEY], pb.fits[gpu_key(NODE, "nvml", "cuda:1", 1)]
    assert fit1.coef_w["prefill"] == pytest.approx(500.0, rel=1e-6) and fit1.notes == [
        "no decode time in the window: its power is not fitted"
    ]
    # the pooled fit over both GPUs: exact as well (both were made from 500 / 100 W)
    assert fit0.coef_w["prefill"] == pytest.approx(500.0, rel=1e-6)
    assert any("pooled fit of the 2 GPUs" in n for n in fit0.notes) and fit0.missing == []


@pytest.mark.parametrize("bucket_s", [None, 0.0, 1.0, 10.0])
def test_a_gap_in_the_samples_is_counted_and_reported(tmp_path, hand, bucket_s):
    # 1 s sampling, 100..110 and 130..140: one 20 s gap (> max(5 s, 5 × the mean period 40/21 s))
    ts = [100.0 + i for i in range(11)] + [130.0 + i for i in range(11)]
    con = make_store(tmp_path / "gap.duckdb", {"gpu_samples": samples(ts, counter_mj([100.0] * 21))})
    w = Window(100.0, 141.0, "live")
    pb = phase_breakdown(con, w, bucket_s=bucket_s)
    gaps = pb.gaps
    assert gaps[KEY]["gaps"] == 1 and gaps[KEY]["gap_s"] == pytest.approx(20.0)
    assert gaps[KEY]["longest_s"] == pytest.approx(20.0)
    assert gaps[KEY]["threshold_s"] == pytest.approx(5 * 40 / 21)
    assert any(m.startswith(KEY) and "not sampled for 20.0 s (1 gap(s)" in m for m in pb.missing), pb.missing
    g = pb.per_gpu.iloc[0]  # no work: the sampled time is idle, the gap unsampled (its own state)
    assert g["unsampled_s"] == pytest.approx(20.0) and g["idle_s"] == pytest.approx(20.0)
    assert g["frac_unsampled"] == pytest.approx(0.5) and g["energy_unsampled_j"] == pytest.approx(100.0)
    assert phase_breakdown(hand, WINDOW, bucket_s=bucket_s).gaps == {}  # regular 1 s samples: no gap
    # a GPU without serving telemetry: its sampled time is unattributed, its gap still unsampled
    rows = samples(ts, counter_mj([100.0] * 21), worker=None)
    g = phase_breakdown(
        make_store(tmp_path / "un.duckdb", {"gpu_samples": rows}), w, bucket_s=bucket_s
    ).per_gpu
    g = g.iloc[0]
    assert g["unsampled_s"] == pytest.approx(20.0) and g["unattributed_s"] == pytest.approx(20.0)
    assert g["attributed_s"] == pytest.approx(20.0) and g["frac_unsampled"] == pytest.approx(1.0)
    assert g["energy_unsampled_j"] == pytest.approx(100.0)
    assert g["energy_unsampled_j"] + g["energy_unattributed_j"] == pytest.approx(g["energy_j"])


def test_empty_window_says_so(tmp_path):
    con = make_store(tmp_path / "empty.duckdb", {})
    pb = phase_breakdown(con, WINDOW)
    assert pb.per_gpu.empty and pb.fits == {}
    assert any("no GPU sample intervals" in m for m in pb.missing)
    # the window in UTC for people, not epoch seconds (the JSON's window keeps those)
    assert any("(live, 1970-01-01 00:01:40 UTC – 00:01:45 UTC)" in m for m in pb.missing), pb.missing
    assert not any("100.000" in m for m in pb.missing)
    assert pb.to_dict()["window"]["start_s"] == 100.0
    assert str(pb.trust) == "no data"
    assert gpu_intervals(con, WINDOW).empty


def test_a_gpu_with_iterations_but_no_samples_is_reported(tmp_path):
    con = make_store(
        tmp_path / "nosamples.duckdb", {"iterations": HAND_ITERATIONS, "requests": HAND_REQUESTS}
    )
    pb = phase_breakdown(con, WINDOW)
    assert any("no samples" in m and "4 iterations" in m for m in pb.missing)


def test_counter_reset_and_missing_counter_fall_back_to_integrated_power_flagged(tmp_path):
    energy = [
        5_000_000,
        5_300_000,
        1_000,
        None,
        400_000,
    ]  # (101,102]: reset; (102,103], (103,104]: no counter
    rows = samples([100.0, 101.0, 102.0, 103.0, 104.0], energy)
    for r, p in zip(rows, [200.0, 200.0, 300.0, 100.0, 100.0], strict=True):
        r["power_w"] = p
    con = make_store(tmp_path / "reset.duckdb", {"gpu_samples": rows, "iterations": HAND_ITERATIONS})
    df = gpu_intervals(con, WINDOW)
    assert list(df["energy_source"]) == [
        "counter",
        "integrated-reset",
        "integrated-no-counter",
        "integrated-no-counter",
    ]
    np.testing.assert_allclose(df["energy_j"], [300.0, 250.0, 200.0, 100.0])  # trapezoid rule
    pb = phase_breakdown(con, WINDOW, bucket_s=0)
    assert ESTIMATED in pb.trust.labels
    assert pb.per_gpu.iloc[0]["energy_estimated_j"] == pytest.approx(550.0)
    assert any("reset/wrap" in m for m in pb.missing) and any("no energy counter" in m for m in pb.missing)
    # on 1 s buckets: the same intervals flagged (the bucket's mean power times its length)
    b = gpu_buckets(con, WINDOW, 1.0)
    assert list(b["energy_source"]) == [
        "counter",
        "integrated-reset",
        "integrated-no-counter",
        "integrated-no-counter",
    ]
    pb = phase_breakdown(con, WINDOW, bucket_s=1.0)
    assert ESTIMATED in pb.trust.labels
    assert any("reset/wrap" in m for m in pb.missing) and any("no energy counter" in m for m in pb.missing)


def test_no_counter_and_no_power_leave_energy_unknown_not_zero(tmp_path):
    rows = samples([100.0, 101.0, 102.0], [None, None, None], power_w=None)
    con = make_store(tmp_path / "nopower.duckdb", {"gpu_samples": rows})
    df = gpu_intervals(con, WINDOW)
    assert df["energy_j"].isna().all()
    pb = phase_breakdown(con, WINDOW)
    assert any("neither energy counter nor power on" in m for m in pb.missing)
    assert pb.fits[KEY].coef_w["idle"] is None and pb.fits[KEY].intervals == 0


def test_overlapping_iterations_count_each_gpu_second_once(tmp_path):
    its = [iteration(100.0, 100.8, "decode"), iteration(100.5, 101.0, "prefill")]  # overlap 0.3 s
    con = make_store(
        tmp_path / "overlap.duckdb",
        {"gpu_samples": samples([100.0, 101.0], [0, 200_000]), "iterations": its},
    )
    df = gpu_intervals(con, WINDOW)
    assert df.iloc[0]["decode_s"] == pytest.approx(0.8) and df.iloc[0]["prefill_s"] == pytest.approx(0.2)
    assert df.iloc[0][list(STATES)].sum() == pytest.approx(1.0)
    pb = phase_breakdown(con, WINDOW, bucket_s=0)
    assert any("1 iterations overlap" in m for m in pb.missing)
    b = gpu_buckets(con, WINDOW, 1.0).iloc[0]  # buckets scale the excess away instead
    assert b[list(STATES)].sum() == pytest.approx(1.0) and b["excess_s"] == pytest.approx(0.3)
    assert b["decode_s"] == pytest.approx(0.8 / 1.3)
    pb = phase_breakdown(con, WINDOW)
    assert any("0.300 s of iteration time beyond their bucket" in m for m in pb.missing)


def test_clock_skew_iterations_outside_the_samples_are_reported(tmp_path):
    skewed = [iteration(t + 3600.0, t + 3600.5, "decode") for t in (100.0, 101.0)]
    con = make_store(
        tmp_path / "skew.duckdb",
        {"gpu_samples": samples([100.0, 101.0, 102.0], [0, 100_000, 200_000]), "iterations": skewed},
    )
    w = Window(100.0, 4000.0)
    df = gpu_intervals(con, w)
    assert df["idle_s"].sum() == pytest.approx(2.0)  # nothing ran while it was sampled
    assert gpu_buckets(con, w, 1.0)["idle_s"].sum() == pytest.approx(2.0)
    for bucket_s in (0.0, None):
        pb = phase_breakdown(con, w, bucket_s=bucket_s)
        assert any("outside their GPU's samples" in m for m in pb.missing)


def test_a_gpu_without_serving_telemetry_is_unattributed_not_idle(tmp_path):
    rows = samples([100.0, 101.0, 102.0], [0, 100_000, 200_000], worker=None, role=None, uuid="GPU-x")
    con = make_store(tmp_path / "ext.duckdb", {"gpu_samples": rows})
    df = gpu_intervals(con, WINDOW)
    assert not df["attributed"].any() and df["idle_s"].isna().all()
    pb = phase_breakdown(con, WINDOW)
    g = pb.per_gpu.iloc[0]
    assert g["unattributed_s"] == pytest.approx(2.0) and g["energy_unattributed_j"] == pytest.approx(200.0)
    assert np.isnan(g["frac_idle"])
    assert any("phase states unknown" in m for m in pb.missing)


@pytest.mark.parametrize("rows", ["intervals", "buckets"])
def test_a_gpu_whose_devices_rows_name_no_worker_is_owned_by_its_iterations_worker(tmp_path, rows):
    # the devices rows (from the samples) name no worker; the iterations carrying the GPU's uuid do
    con = make_store(
        tmp_path / "noworker.duckdb",
        {
            "gpu_samples": samples(
                [100.0, 101.0, 102.0, 103.0, 104.0], counter_mj(hand_energy_j()), worker=None
            ),
            "iterations": HAND_ITERATIONS,
            "requests": HAND_REQUESTS,
        },
    )
    df = gpu_intervals(con, WINDOW) if rows == "intervals" else gpu_buckets(con, WINDOW, 1.0)
    assert df["attributed"].all() and set(df["worker"]) == {"w0"}
    for state, expected in HAND_STATES.items():  # in-flight gaps need the owner worker's requests
        np.testing.assert_allclose(df[state], expected, atol=1e-9, err_msg=state)


def test_sm_activity_falls_back_to_utilization_flagged(tmp_path):
    rows = samples([100.0, 101.0, 102.0], [0, 100_000, 200_000], sm_active_pct=None)
    con = make_store(tmp_path / "dcgm.duckdb", {"gpu_samples": rows, "iterations": HAND_ITERATIONS[:1]})
    df = gpu_intervals(con, WINDOW)
    assert set(df["sm_source"]) == {"gpu_util"} and set(df["sm_active_pct"]) == {90.0}
    pb = phase_breakdown(con, WINDOW)
    assert ESTIMATED in pb.trust.labels and any("utilization %" in n for n in pb.trust.notes)


def test_host_bound_emulated_windows_are_labelled(tmp_path):
    rows = samples([100.0, 101.0, 102.0], [0, 100_000, 200_000], emulated=True, host_bound_pct=25.0)
    lagged = [iteration(100.2, 100.7, "decode", modeled_s=0.2, lag_s=0.3)]
    con = make_store(tmp_path / "emu.duckdb", {"gpu_samples": rows, "iterations": lagged})
    df = gpu_intervals(con, WINDOW)
    assert df["host_bound"].all() and set(df["trust"]) == {"emulated"}
    assert gpu_buckets(con, WINDOW)["host_bound"].all()
    # the step's wall time beyond the modeled GPU time is host time with the GPU idle
    assert df.iloc[0]["decode_s"] == pytest.approx(0.2) and df.iloc[0]["host_s"] == pytest.approx(0.3)
    pb = phase_breakdown(con, WINDOW)
    assert {HOST_BOUND, "emulated"} <= pb.trust.labels


def test_mig_energy_is_counted_once_per_physical_gpu(tmp_path):
    whole = samples([100.0, 101.0, 102.0], [0, 300_000, 600_000], sm_active_pct=None, gpu_util_pct=None)
    for r in whole:
        r["uuid"] = "GPU-phys"
    inst = [
        {
            **r,
            "device": "cuda:0/gi1",
            "uuid": None,
            "parent_uuid": "GPU-phys",
            "mig_instance_id": 1,
            "mig_profile": "3g.40gb",
            "power_w": None,
            "energy_mj": None,
            "sm_active_pct": 30.0,
        }
        for r in whole
    ]
    con = make_store(tmp_path / "mig.duckdb", {"gpu_samples": whole + inst})
    df = gpu_intervals(con, WINDOW)
    by_dev = df.groupby("device")["energy_j"].sum(min_count=1)
    assert by_dev["cuda:0"] == pytest.approx(600.0) and np.isnan(by_dev["cuda:0/gi1"])
    assert set(df.loc[df["device"] == "cuda:0/gi1", "energy_source"]) == {"mig-parent"}
    assert set(df.loc[df["device"] == "cuda:0/gi1", "sm_active_pct"]) == {30.0}
    assert gpu_buckets(con, WINDOW, 1.0).groupby("device")["energy_j"].sum(min_count=1)[
        "cuda:0"
    ] == pytest.approx(600.0)
    pb = phase_breakdown(con, WINDOW)
    assert pb.per_gpu["energy_j"].sum() == pytest.approx(600.0)
    assert any("MIG instance" in m for m in pb.missing)


def test_disaggregated_request_spans_make_gaps_only_where_the_worker_had_work(tmp_path):
    # w0 prefills r1 (arrival 100.0 → KV hand-off at 100.5); decode happens elsewhere
    rows = samples([100.0, 101.0], [0, 100_000])
    req = request("r1", 100.0, 102.0, decode_worker="w1", prefill_end_s=100.4, kv_transfer_start_s=100.5)
    con = make_store(
        tmp_path / "disagg.duckdb",
        {"gpu_samples": rows, "iterations": [iteration(100.1, 100.4, "prefill")], "requests": [req]},
    )
    for r in (gpu_intervals(con, WINDOW).iloc[0], gpu_buckets(con, WINDOW, 1.0).iloc[0]):
        assert r["prefill_s"] == pytest.approx(0.3)
        assert r["gap_s"] == pytest.approx(0.2)  # in flight 100.0–100.5, minus 0.3 s of iteration
        assert r["idle_s"] == pytest.approx(0.5)


def test_a_tensor_parallel_replica_gives_both_gpus_its_iterations_and_gaps(tmp_path):
    rows = samples([100.0, 101.0], [0, 100_000]) + [
        {**r, "device": "cuda:1", "index": 1, "uuid": "GPU-b"} for r in samples([100.0, 101.0], [0, 100_000])
    ]
    its = [
        iteration(100.2, 100.6, "decode"),
        iteration(100.2, 100.6, "decode", gpu_uuid="GPU-b", gpu_index=1),
    ]
    con = make_store(
        tmp_path / "tp.duckdb",
        {"gpu_samples": rows, "iterations": its, "requests": [request("r1", 100.0, 101.0)]},
    )
    for df in (gpu_intervals(con, WINDOW), gpu_buckets(con, WINDOW, 1.0)):
        assert len(df) == 2
        np.testing.assert_allclose(df["decode_s"], [0.4, 0.4])
        np.testing.assert_allclose(df["gap_s"], [0.6, 0.6])
        np.testing.assert_allclose(df["idle_s"], [0.0, 0.0], atol=1e-12)


@pytest.mark.parametrize("bucket_s", [0.0, 1.0])
def test_a_role_change_and_an_hour_boundary_split_the_tables(tmp_path, bucket_s):
    # the GPU decodes until 3600 s, then serves as a mixed worker; samples straddle the hour
    ts = [3597.0, 3598.0, 3599.0, 3600.0, 3601.0, 3602.0]
    rows = samples(ts, counter_mj([100.0] * 5))
    for r in rows:
        r["role"] = "decode" if r["ts_s"] < 3600.0 else "mixed"
    con = make_store(
        tmp_path / "role.duckdb", {"gpu_samples": rows, "iterations": [iteration(3597.5, 3601.5, "decode")]}
    )
    w = Window(3597.0, 3603.0)
    pb = phase_breakdown(con, w, bucket_s=bucket_s)
    pools = pb.per_pool.set_index("role")
    assert set(pools.index) == {"decode", "mixed"}
    assert pools["interval_s"].sum() == pytest.approx(5.0) and pools["energy_j"].sum() == pytest.approx(500.0)
    assert pools["decode_s"].sum() == pytest.approx(4.0)
    hours = pb.per_hour.groupby("hour_s")["interval_s"].sum()
    assert list(hours.index) == [0.0, 3600.0]
    assert sum(pb.per_gpu["interval_s"]) == pytest.approx(5.0) and len(pb.per_gpu) == 2  # one row per role


def test_a_window_narrowed_to_nodes_sees_only_them(hand):
    for nodes, expect in ((("n1",), 4.0), (("elsewhere",), 0.0)):
        w = Window(100.0, 105.0, "live", nodes)
        for bucket_s in (0.0, 1.0):
            pb = phase_breakdown(hand, w, bucket_s=bucket_s)
            assert float(pb.per_gpu["interval_s"].sum()) == pytest.approx(expect)


def test_a_cpu_device_is_not_a_gpu(tmp_path):
    cpu = [
        {**r, "device": "cpu", "index": None, "kind": "cpu", "uuid": None}
        for r in samples([100.0, 101.0], [None, None])
    ]
    con = make_store(tmp_path / "cpu.duckdb", {"gpu_samples": samples([100.0, 101.0], [0, 100_000]) + cpu})
    assert set(gpu_intervals(con, WINDOW)["device"]) == {"cuda:0"}
    assert set(gpu_buckets(con, WINDOW)["device"]) == {"cuda:0"}


def test_the_coefficient_table_keys_each_fitted_gpu_by_its_identity_a_null_index_included():
    from analytics.power_model import PowerFit, coef_frame

    stats = pd.DataFrame(
        {
            "node": ["n1", "n1", "n2"],
            "source": ["dcgm", "dcgm", "local"],
            "device": ["GPU-a", "GPU-b", "cpu"],
            "index": [0.0, 1.0, float("nan")],  # a device without an index
        }
    )
    fit = {t: w for t, w in zip(MODEL_TERMS, (300.0, None, 80.0), strict=True)}
    fits = {
        gpu_key("n1", "dcgm", "GPU-a", 0): PowerFit(fit, 0.9, 10, 1.0),
        gpu_key("n2", "local", "cpu", None): PowerFit(dict(fit, decode=200.0), 0.8, 10, 1.0),
    }  # GPU-b: not attributed, no fit
    t = coef_frame(fits, stats)
    assert t.column_names == ["node", "source", "device", "index", *[f"w_{m}" for m in MODEL_TERMS]]
    assert t.to_pylist() == [
        {"node": "n1", "source": "dcgm", "device": "GPU-a", "index": 0, "w_prefill": 300.0, "w_decode": 0.0, "w_idle": 80.0},
        {"node": "n2", "source": "local", "device": "cpu", "index": None, "w_prefill": 300.0, "w_decode": 200.0, "w_idle": 80.0},
    ]  # fmt: skip


def _fit(r2: float | None) -> PowerFit:
    return PowerFit(coef_w=dict.fromkeys(MODEL_TERMS, 100.0), r2=r2, intervals=50, rmse_j=1.0)


def test_a_few_poor_fits_are_named_one_by_one_and_many_in_one_note():
    few = {"g1": _fit(0.9), "g2": _fit(0.31), "g3": _fit(None), "g4": _fit(0.02)}
    assert poor_fit_notes(few) == [
        "g4: power model fits poorly (R² 0.02); energy shares uncertain",
        "g2: power model fits poorly (R² 0.31); energy shares uncertain",
    ]
    many = {f"g{i:02d}": _fit(i / 100) for i in range(60)}  # R² 0.00–0.59: 50 below 0.5
    (note,) = poor_fit_notes(many)
    assert note.startswith("power model fits poorly on 50 of 60 GPUs (R² 0.00–0.49; lowest: g00 (R² 0.00)")
    assert "g49" not in note and "fit table" in note
