"""The cost over time at the resolution the window needs (issue 25, point 3): a window shorter than a
few hours is summed per period finer than the hour (``parts.cost.by_period``, ``period_s``), and the
periods' dollars, GPU-seconds and joules sum to the window's totals that `phaselens analyze` prints —
on a real simulated store, the whole scenario and a part of it."""

from __future__ import annotations

import json
import math

import pytest

from analytics.cost import COST_PERIODS_S, MAX_COST_BUCKETS, cost_period_s
from analytics.cost_pricing import CATEGORIES
from phaselens.cli import main


@pytest.fixture(scope="module")
def sim_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("cost_periods") / "sim.duckdb"
    rc = main(["simulate", "--no-progress", "--layout", "1p1d:h100-sxm", "--limit", "120", "--db", str(db)])
    assert rc == 0
    return db


def _analyze(capsys, *args) -> dict:
    rc = main(["analyze", "--json", *args])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


def test_the_period_fits_the_window_and_the_grid():
    assert cost_period_s(90.0, 1.0) == 10.0  # 9 buckets of 10 s
    assert cost_period_s(45 * 60.0, 1.0) == 60.0  # 45 one-minute buckets
    assert cost_period_s(45 * 60.0, 120.0) == 120.0  # whole grid buckets only
    assert cost_period_s(3 * 3600.0, 1.0) == 300.0  # 36 five-minute buckets
    assert cost_period_s(2 * 86400.0, 1.0) is None  # hours serve a two-day window
    for window_s in (30.0, 600.0, 7200.0):
        p = cost_period_s(window_s, 5.0)
        assert p in COST_PERIODS_S and window_s / p <= MAX_COST_BUCKETS and 3600 % p == 0


@pytest.mark.parametrize("part", ["whole", "second half"])
def test_the_periods_sum_to_the_windows_totals(sim_db, capsys, part):
    args = ["--dataset", "latest", "--db", str(sim_db)]
    if part == "second half":
        whole = _analyze(capsys, *args)["window"]
        mid = (whole["start_s"] + whole["end_s"]) / 2
        args += ["--start-s", f"{mid!r}", "--end-s", f"{whole['end_s']!r}"]
    summary = _analyze(capsys, *args)
    cost = summary["parts"]["cost"]
    window_s = summary["window"]["end_s"] - summary["window"]["start_s"]
    assert window_s < 3600 and cost["period_s"] is not None and cost["period_s"] < 3600
    periods = cost["by_period"]
    assert 2 <= len(periods) <= MAX_COST_BUCKETS + 1  # a partial period at either end
    starts = [p["hour_start_s"] for p in periods]
    assert starts == sorted(starts) and all(
        math.isclose(s % cost["period_s"], 0.0, abs_tol=1e-6) for s in starts
    )
    total = cost["total"]
    assert sum(p["cost_usd"] for p in periods) == pytest.approx(total["cost_usd"], rel=1e-9)
    assert sum(p["gpu_seconds"] for p in periods) == pytest.approx(total["gpu_seconds"], rel=1e-9)
    assert sum(p["energy_j"] for p in periods) == pytest.approx(total["energy_j"], rel=1e-9)
    for c in CATEGORIES:
        assert sum(p[f"cost_usd_{c}"] for p in periods) == pytest.approx(
            total[f"cost_usd_{c}"], rel=1e-9, abs=1e-12
        )
    # and the hours still sum to the same total
    assert sum(h["cost_usd"] for h in cost["by_hour"]) == pytest.approx(total["cost_usd"], rel=1e-9)
