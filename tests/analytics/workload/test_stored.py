"""The workloads table: an observed and a synthesized description stored side by side (through the
store's writer) and read back whole, for the recommender and the daily report's staleness check."""

from __future__ import annotations

import pytest

from analytics.window import AnalyticsError
from analytics.workload import workload_drift
from analytics.workload.stored import latest_observed, list_workloads, load_workload
from collector.store import Store
from phaselens.workload_api import run_workload, save_workload


def test_both_descriptions_are_stored_linked_and_read_back_whole(simulated, tmp_path):
    sim = simulated["bursty"]
    with Store.open(sim.db, read_only=True) as src, src.reader() as con:
        result = run_workload(con, {"dataset": sim.scenario_id, "seed": 4})
    db = tmp_path / "w.duckdb"
    with Store.open(db) as store:
        ids = save_workload(store, result, "host-a")
        later = save_workload(store, result, "host-a")
        with store.reader() as con:
            listed = list_workloads(con, limit=10)
            assert [w["kind"] for w in list_workloads(con, kind="synthesized")] == ["synthesized"] * 2
            with pytest.raises(AnalyticsError, match="kind must be one of observed, synthesized"):
                list_workloads(con, kind="guess")
            back = load_workload(con, ids["observed_id"])
            newest_id, newest = latest_observed(con, dataset=sim.scenario_id)
            with pytest.raises(AnalyticsError, match="no stored workload 'wl-0-000000'"):
                load_workload(con, "wl-0-000000")
            assert latest_observed(con, dataset="live") is None
    assert len(listed) == 4 and newest_id == later["observed_id"]
    syn = next(w for w in listed if w["workload_id"] == ids["synthesized_id"])
    assert syn["observed_id"] == ids["observed_id"] and syn["trust"]["labels"] == ["simulated"]
    assert syn["request_count"] == result["synthesized"]["request_count"]
    assert back.to_dict() == result["observed"]  # the whole description, curves and histograms
    assert workload_drift(back, newest).score == 0.0
