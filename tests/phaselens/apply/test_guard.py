"""The guard's figures and verdict on hand-made request events, and the store's few updates."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.store import Store, StoreError
from collector.store.updates import set_recommendation_status, update_row
from phaselens.apply.guard import GuardSpec, judge, measure, realised_vs_predicted, slo_of
from phaselens.apply.testing import recommendation_row
from serving.sim.summary import SloSpec


def ev(arrival: float, first: float, n: int, itl: float, status: str = "ok") -> dict:
    return {"arrival_s": arrival, "token_ts_s": [first + i * itl for i in range(n)], "status": status}


def test_measure_counts_attainment_latency_tokens_energy_and_labels() -> None:
    events = [
        ev(100.0, 100.1, 11, 0.02),  # meets TTFT 0.5 s / TPOT 0.05 s
        ev(101.0, 101.9, 11, 0.02),  # TTFT 0.9 s: misses
        ev(102.0, 102.1, 11, 0.08),  # TPOT 0.08 s: misses
        ev(103.0, 103.0, 0, 0.0, status="error"),
        ev(90.0, 109.91, 11, 0.02),  # arrived before the window: only its tokens inside count
        ev(104.0, 104.1, 5, 0.01, status="aborted"),  # the client left: not judged
    ]
    m = measure(events, 100.0, 110.0, slo=SloSpec(0.5, 0.05), gpus=2, energy_j=330.0, host_bound_share=0.2)
    assert m["requests"] == 4 and m["errors"] == 1 and m["error_rate"] == 0.25
    assert m["slo_attainment"] == 0.25 and m["goodput_rps_per_gpu"] == pytest.approx(1 / 10 / 2)
    assert m["output_tokens"] == 33 + 5 + 5  # 3 whole requests, 5 of the early one, 5 of the aborted one
    assert m["output_tokens_per_s_per_gpu"] == pytest.approx(43 / 10 / 2)
    assert m["j_per_token"] == pytest.approx(330 / 43)
    assert m["ttft_p50_s"] == pytest.approx(0.1) and m["tpot_p90_s"] == pytest.approx(0.068)
    assert m["trust"] == ["emulated", "host-bound"]
    ok, why = judge(m, GuardSpec(slo=SloSpec(0.5, 0.05), target=0.9, max_error_rate=0.5))
    assert not ok and why.startswith("SLO attainment 25.0% under 90%")
    ok, why = judge(m, GuardSpec(max_error_rate=0.1))
    assert not ok and "error rate 25.0% over 10.0%" in why
    quiet = measure([], 0.0, 5.0, slo=SloSpec(), gpus=1)
    assert judge(quiet, GuardSpec())[0] and quiet["trust"] == ["emulated"]


def test_realised_vs_predicted_and_the_recommendation_slo() -> None:
    cmp = realised_vs_predicted(
        {"ttft_p90_s": 0.11, "j_per_token": 5.0}, {"ttft_p90_s": 0.1, "j_per_token": None}
    )
    assert cmp["figures"]["ttft_p90_s"]["error_pct"] == pytest.approx(10.0)
    assert cmp["figures"]["j_per_token"]["error_pct"] is None and cmp["worst_error_pct"] == pytest.approx(
        10.0
    )
    assert realised_vs_predicted({}, None)["worst_error_pct"] is None
    assert slo_of({"inputs": {"slo": {"ttft_s": 1.0, "tpot_s": 0.03, "target": 0.95}}}) == (
        SloSpec(1.0, 0.03),
        0.95,
    )
    assert slo_of(None) == (SloSpec(), 0.9)


def test_store_updates_are_few_and_checked(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.duckdb")
    try:
        row = recommendation_row("http://127.0.0.1:1", "agg:2xh200", "1p1d:h200")
        store.append("recommendations", [row])
        set_recommendation_status(store, row["recommendation_id"], "applied")
        assert store.query("SELECT status FROM recommendations").iloc[0, 0] == "applied"
        with pytest.raises(StoreError, match="status 'done' of recommendations; allowed: proposed"):
            set_recommendation_status(store, row["recommendation_id"], "done")
        with pytest.raises(StoreError, match="no recommendations row 'rec-nope'"):
            set_recommendation_status(store, "rec-nope", "applied")
        with pytest.raises(StoreError, match="table 'requests' is append-only"):
            update_row(store, "requests", "x", {"status": "ok"})
        with pytest.raises(StoreError, match=r"cannot update \['kind'\] of recommendations"):
            update_row(store, "recommendations", row["recommendation_id"], {"kind": "power_limit"})
    finally:
        store.close()
