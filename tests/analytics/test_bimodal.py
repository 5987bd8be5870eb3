"""Bimodality of SM activity and the idle split: known distributions, hand cases, simulated stores."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from analytics.attribution import STATES, IntervalTable, phase_breakdown
from analytics.bimodal import (
    CATEGORIES,
    _min_gpu_values,
    _moments_sql,
    _points_sql,
    bimodality,
    idle_split,
)
from analytics.bimodal_stats import (
    MIN_POINTS,
    NO_SPREAD_STD_PCT,
    SARLE_THRESHOLD,
    dip_and_modes,
    histogram_modes,
    sarle_coefficient,
)
from analytics.trust import ESTIMATED, SIMULATED
from analytics.window import resolve_window, scenarios
from phaselens.cli import main
from tests.analytics.test_attribution import (
    HAND_ITERATIONS,
    HAND_REQUESTS,
    WINDOW,
    counter_mj,
    hand_energy_j,
    iteration,
    make_store,
    samples,
)


def test_modes_of_two_known_components():
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.normal(20.0, 3.0, 7000), rng.normal(70.0, 5.0, 3000)])
    m = histogram_modes(x)
    assert m.low_pct == pytest.approx(20.0, abs=0.5) and m.high_pct == pytest.approx(70.0, abs=0.8)
    assert m.std_low == pytest.approx(3.0, abs=0.2) and m.std_high == pytest.approx(5.0, abs=0.3)
    assert m.weight_low == pytest.approx(0.7, abs=0.005) and m.weight_low + m.weight_high == pytest.approx(
        1.0
    )
    assert 35.0 < m.valley_pct < 55.0


def test_a_pile_of_equal_values_with_rare_spikes_has_its_modes_at_the_pile_and_the_spikes():
    # an idle prefill GPU (seen in the demo): 94 % of intervals at exactly 0.527 % SM activity, 6 %
    # of prefill spikes near 44 %. A two-Gaussian mixture started at the 10th and 90th percentiles
    # (both in the pile) kept two identical components: "0.527 % (50 %) / 0.527 % (50 %)".
    rng = np.random.default_rng(3)
    x = np.concatenate([np.full(1470, 0.527), rng.normal(44.0, 5.0, 97)])
    out = dip_and_modes(x)
    assert out["bimodal"] is True
    assert out["mode_low_pct"] == pytest.approx(0.527) and out["mode_high_pct"] == pytest.approx(
        44.0, abs=1.5
    )
    assert out["weight_low"] == pytest.approx(1470 / 1567) and out["std_low_pct"] == pytest.approx(
        0.0, abs=1e-9
    )
    assert 0.527 < out["valley_pct"] < 44.0 - 3 * 5.0


def test_a_pile_with_idle_time_and_a_prefill_tail_has_its_modes_at_idle_and_the_pile():
    # the demo's simulated 70B fleet (aggregated): 10 % of the samples idle at 0 %, 75 % piled at
    # 23.8 % (decode), the rest spread to 50 % (prefill). The mixture's maximum likelihood put a
    # narrow component on the pile and a broad one (mean 22 %, std 20) over everything else, read
    # as "modes 22 % and 24 %".
    rng = np.random.default_rng(5)
    x = np.concatenate([np.zeros(600), rng.normal(23.8, 0.1, 4500), rng.uniform(25.0, 50.0, 900)])
    m = histogram_modes(x)
    assert m.low_pct == pytest.approx(0.0) and m.high_pct == pytest.approx(23.8, abs=0.2)
    assert m.weight_low == pytest.approx(0.1) and 0.0 < m.valley_pct < 23.0


@pytest.mark.parametrize("n", [20, 50, 200, 1000, 5000])
def test_one_peaked_samples_get_one_mode(n):
    draws = {
        "normal": lambda r: r.normal(50.0, 10.0, n),
        "uniform": lambda r: r.uniform(0.0, 100.0, n),
        "exponential": lambda r: r.exponential(10.0, n),
        "gamma": lambda r: r.gamma(4.0, 5.0, n),
    }
    for name, draw in draws.items():
        seeds = [s for s in range(40) if histogram_modes(draw(np.random.default_rng(s))).high_pct is not None]
        assert seeds == [], f"{name} of {n}: a second mode of chance with seeds {seeds}"
    m = histogram_modes(np.random.default_rng(1).normal(50.0, 10.0, n))
    assert m.high_pct is None and m.valley_pct is None and m.weight_low == 1.0
    assert m.low_pct == pytest.approx(50.0, abs=40 / n**0.5)


def test_values_within_one_histogram_bin_still_get_a_mode():
    out = dip_and_modes(np.array([20.0, 20.1, 20.05, 20.2, 20.15]))
    assert out["mode_low_pct"] == pytest.approx(20.1, abs=0.1) and out["dip"] is not None
    assert out["mode_high_pct"] is None and out["weight_low"] == 1.0


def test_modes_of_values_far_out_of_range_take_bounded_memory():
    x = np.array([0.0, 1.0, 2.0, 1e12, np.nan, np.inf])  # a corrupt sample must not allocate 4e12 bins
    m = histogram_modes(x)
    assert m.low_pct == pytest.approx(1.0) and m.high_pct in (None, pytest.approx(1e12))
    with pytest.raises(ValueError, match="finite"):
        histogram_modes(np.array([np.nan]))


def test_sarle_coefficient_by_hand():
    # n = 10, g = 0, κ = -1.5: (0 + 1) / (-1.5 + 3·81/(8·7)) = 1 / 2.839285...
    assert sarle_coefficient(0.0, -1.5, 10) == pytest.approx(1.0 / (-1.5 + 243.0 / 56.0))
    assert sarle_coefficient(0.0, 0.0, 3) is None
    rng = np.random.default_rng(1)
    normal = rng.normal(0, 1, 5000)
    two = np.concatenate([rng.normal(-3, 1, 2500), rng.normal(3, 1, 2500)])
    con = duckdb.connect()
    for x, bimodal in ((normal, False), (two, True)):
        g, k = con.execute(
            "SELECT skewness(x), kurtosis(x) FROM (SELECT unnest(?) AS x)", [x.tolist()]
        ).fetchone()
        assert (sarle_coefficient(g, k, len(x)) > SARLE_THRESHOLD) is bimodal


def _store_with_sm(tmp_path: Path, values: np.ndarray, name: str) -> duckdb.DuckDBPyConnection:
    ts = [100.0 + 0.1 * i for i in range(len(values))]
    rows = samples(ts, counter_mj([10.0] * (len(values) - 1)))
    for r, v in zip(rows, values, strict=True):
        r["sm_active_pct"] = float(v)
    return make_store(tmp_path / name, {"gpu_samples": rows})


@pytest.mark.parametrize("bucket_s", [0.0, None])
def test_dip_test_tells_a_bimodal_from_a_unimodal_gpu(tmp_path, bucket_s):
    rng = np.random.default_rng(5)
    w = type(WINDOW)(100.0, 300.0)
    two = np.clip(np.concatenate([rng.normal(15, 3, 600), rng.normal(60, 4, 400)]), 0, 100)
    one = np.clip(rng.normal(40, 5, 1000), 0, 100)
    for values, bimodal, name in ((two, True, "two.duckdb"), (one, False, "one.duckdb")):
        bm = bimodality(_store_with_sm(tmp_path, rng.permutation(values), name), w, bucket_s=bucket_s)
        gpu = bm.table[bm.table["scope"] == "gpu"].iloc[0]
        n = 999 if bucket_s == 0 else 1000  # sample intervals: the first sample only opens
        assert gpu["n"] == n and gpu["dip_n"] == n
        assert bool(gpu["bimodal"]) is bimodal, (gpu["dip"], gpu["dip_p_value"])
        if bimodal:
            assert gpu["mode_low_pct"] == pytest.approx(15, abs=1) and gpu["mode_high_pct"] == pytest.approx(
                60, abs=1
            )
            assert gpu["weight_low"] == pytest.approx(0.6, abs=0.03)
            assert gpu["sarle"] > SARLE_THRESHOLD
        assert set(bm.table["scope"]) == {"fleet", "pool", "pool_hour", "gpu"}


@pytest.mark.parametrize("bucket_s", [0.0, None])
def test_a_near_constant_gpu_has_no_bimodality_not_two_equal_modes(tmp_path, bucket_s):
    # an idle prefill GPU: SM activity 0.1 % with a few spikes to 3 % (std ≈ 0.2 points): the dip
    # test said unimodal (p = 1), Sarle's b 0.9 "bimodal" and a mixture two centres at 0.1 %
    values = np.full(1000, 0.1)
    values[::200] = 3.0
    bm = bimodality(
        _store_with_sm(tmp_path, values, "flat.duckdb"), type(WINDOW)(100.0, 300.0), bucket_s=bucket_s
    )
    gpu = bm.table[bm.table["scope"] == "gpu"].iloc[0]
    assert gpu["std_sm_pct"] < NO_SPREAD_STD_PCT and bool(gpu["no_spread"]) is True
    for col in ("bimodal", "dip_p_value", "sarle", "mode_low_pct", "mode_high_pct", "weight_low"):
        assert gpu[col] is None or pd.isna(gpu[col]), col
    assert any("constant / no spread" in m and "bimodality not defined" in m for m in bm.missing)
    assert json.loads(json.dumps(bm.to_dict()))["table"][-1]["no_spread"] is True


def test_per_phase_activity_and_the_utilization_gap_by_hand(hand_con):
    bm = bimodality(hand_con, WINDOW, bucket_s=0)
    fleet = bm.table[bm.table["scope"] == "fleet"].iloc[0]
    # every interval reads 50 % SM, 90 % utilization: the gap is 40 points
    assert fleet["util_sm_gap_pct"] == pytest.approx(40.0) and fleet["util_pct"] == pytest.approx(90.0)
    assert fleet["n"] == 4 and fleet["std_sm_pct"] == pytest.approx(0.0)
    assert any("constant" in m for m in bm.missing)


@pytest.fixture
def hand_con(tmp_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    rows = samples([100.0, 101.0, 102.0, 103.0, 104.0], counter_mj(hand_energy_j()))
    con = make_store(
        tmp_path / "hand.duckdb",
        {"gpu_samples": rows, "iterations": HAND_ITERATIONS, "requests": HAND_REQUESTS},
    )
    yield con
    con.close()


def test_idle_split_by_hand(tmp_path):
    # one interval (100, 101]: 0.4 s decode + 0.2 s prefill, SM 30 %, DRAM 36 % of the interval
    rows = samples([100.0, 101.0], [0, 300_000], sm_active_pct=30.0, dram_active_pct=36.0)
    its = [iteration(100.0, 0.2 + 100.0, "prefill"), iteration(100.2, 100.6, "decode")]
    con = make_store(tmp_path / "split.duckdb", {"gpu_samples": rows, "iterations": its})
    sp = idle_split(con, WINDOW)
    g = sp.per_gpu.iloc[0]
    sm_busy, dram_busy = 0.30 / 0.6, 0.36 / 0.6  # activity during the 0.6 GPU-busy seconds
    assert g["productive_prefill_s"] == pytest.approx(0.2 * dram_busy)
    assert g["stranded_bandwidth_s"] == pytest.approx(0.2 * (1 - dram_busy))
    assert g["productive_decode_s"] == pytest.approx(0.4 * sm_busy)
    assert g["stranded_compute_s"] == pytest.approx(0.4 * (1 - sm_busy))
    assert g["host_bound_s"] == pytest.approx(0.0) and g["idle_s"] == pytest.approx(0.4)
    assert sum(g[f"frac_{c}"] for c in CATEGORIES) == pytest.approx(1.0)
    assert sum(g[f"energy_{c}_j"] for c in CATEGORIES) == pytest.approx(300.0)
    assert g["util_sm_gap_pct"] == pytest.approx(60.0)


def test_idle_split_without_activity_says_what_is_unknown(tmp_path):
    rows = samples([100.0, 101.0], [0, 100_000], sm_active_pct=None, gpu_util_pct=None, dram_active_pct=None)
    con = make_store(
        tmp_path / "noact.duckdb", {"gpu_samples": rows, "iterations": [iteration(100.0, 100.5, "decode")]}
    )
    sp = idle_split(con, WINDOW)
    g = sp.per_gpu.iloc[0]
    assert g["productive_decode_s"] == pytest.approx(0.5) and g["stranded_compute_s"] == 0.0
    assert any("no SM activity" in m for m in sp.missing)
    assert np.isnan(g["util_sm_gap_pct"])


def test_empty_window(tmp_path):
    con = make_store(tmp_path / "empty.duckdb", {})
    bm = bimodality(con, WINDOW)
    assert bm.table.empty and bm.missing and bm.to_dict()["table"] == []
    sp = idle_split(con, WINDOW)
    assert sp.per_gpu.empty and any("no GPU sample intervals" in m for m in sp.missing)


def test_utilization_fallback_is_flagged(tmp_path):
    rows = samples([100.0, 101.0, 102.0, 103.0, 104.0, 105.0], [0, 1, 2, 3, 4, 5], sm_active_pct=None)
    for r, u in zip(rows, [0, 10, 80, 20, 90, 30], strict=True):
        r["gpu_util_pct"] = float(u)
    bm = bimodality(make_store(tmp_path / "util.duckdb", {"gpu_samples": rows}), type(WINDOW)(100.0, 106.0))
    assert ESTIMATED in bm.trust.labels
    assert bm.table["sm_fallback_intervals"].iloc[0] > 0
    assert bm.table[bm.table["scope"] == "fleet"].iloc[0]["util_sm_gap_pct"] is None


# -- on simulated stores ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim(tmp_path_factory) -> Iterator[dict[str, tuple[duckdb.DuckDBPyConnection, object]]]:
    """5 simulated minutes of the bundled conversation-trace slice on 2 aggregated H100s and 1P1D."""
    db = tmp_path_factory.mktemp("sim") / "sim.duckdb"
    rc = main(
        ["simulate", "--no-progress", "--layout", "agg:2xh100-sxm", "--layout", "1p1d:h100-sxm",
         "--duration", "300", "--db", str(db)]
    )  # fmt: skip
    assert rc == 0
    con = duckdb.connect(str(db), read_only=True)
    out = {}
    for sc in scenarios(con):
        out["agg" if sc["name"].startswith("agg") else "1p1d"] = (
            con,
            resolve_window(con, dataset=sc["scenario_id"]),
        )
    yield out
    con.close()


def test_simulated_aggregated_gpus_show_the_bimodal_signature(sim):
    con, w = sim["agg"]
    bm = bimodality(con, w)
    assert SIMULATED in bm.trust.labels
    for _, g in bm.table[bm.table["scope"] == "gpu"].iterrows():
        # SM activity higher in prefill than in decode; utilization % high in both (issue 23: the
        # modeled SM activity follows the SMs the work fills, so a CUDA-graph engine's memory-bound
        # decode reads ~48 %, not the old constant 25 %; its idle compute shows in MFU, analytics/roofline)
        assert g["sm_prefill_pct"] > 40 and g["sm_decode_pct"] < 52
        assert g["sm_prefill_pct"] > g["sm_decode_pct"] + 3
        assert g["util_prefill_pct"] > 90 and g["util_decode_pct"] > 90
        assert g["util_sm_gap_pct"] > 40
        assert g["mode_high_pct"] > g["mode_low_pct"]


def test_simulated_1p1d_separates_the_two_modes_by_gpu(sim):
    con, w = sim["1p1d"]
    bm = bimodality(con, w, min_busy_frac=0.5, bucket_s=0)  # busy share per sample interval
    gpus = bm.table[bm.table["scope"] == "gpu"].set_index("role")
    assert set(gpus.index) == {"prefill", "decode"}
    pre, dec = gpus.loc["prefill"], gpus.loc["decode"]
    assert pre["sm_prefill_pct"] > 40 and dec["sm_decode_pct"] < 52
    assert pre["sm_prefill_pct"] > dec["sm_decode_pct"] + 3  # the prefill GPU busier in SM activity
    assert np.isnan(pre["sm_decode_pct"]) and np.isnan(dec["sm_prefill_pct"])  # one phase per GPU
    fleet = bm.table[bm.table["scope"] == "fleet"].iloc[0]
    assert fleet["mode_low_pct"] < fleet["mode_high_pct"]
    # on buckets (the default) the per-phase activity separates the GPUs the same way
    gb = bimodality(con, w).table
    gb = gb[gb["scope"] == "gpu"].set_index("role")
    assert gb.loc["prefill", "sm_prefill_pct"] > 40 and gb.loc["decode", "sm_decode_pct"] < 52
    assert gb.loc["prefill", "sm_prefill_pct"] > gb.loc["decode", "sm_decode_pct"] + 3
    # a decode pool runs no prefill (and vice versa) by design: not a missing item
    missing = bimodality(con, w).missing
    assert not any("no prefill time" in m and "decode" in m for m in missing), missing
    assert not any("no decode time" in m and "prefill" in m for m in missing), missing


@pytest.mark.parametrize("bucket_s", [0.0, None])
@pytest.mark.parametrize("layout", ["agg", "1p1d"])
def test_simulated_reconciliation(sim, layout, bucket_s):
    con, w = sim[layout]
    with IntervalTable(con, w, bucket_s) as iv:
        pb = phase_breakdown(con, w, intervals=iv)
        counter_j = con.execute(
            """SELECT sum(e) / 1000.0 FROM (SELECT max(energy_mj) - min(energy_mj) AS e FROM gpu_samples
                WHERE node = ? AND ts_s >= ? AND ts_s < ? GROUP BY device, "index")""",
            ["sim:" + w.dataset, w.start_s, w.end_s],
        ).fetchone()[0]
        fit_r2 = [f.r2 for f in pb.fits.values()]
    sp = idle_split(con, w, breakdown=pb)
    bm = bimodality(con, w)
    for result in (pb, sp, bm):
        json.dumps(result.to_dict())
    assert pb.missing == [] and pb.trust.labels == {SIMULATED}
    for _, g in pb.per_gpu.iterrows():
        assert sum(g[f"frac_{s[:-2]}"] for s in STATES) == pytest.approx(1.0, abs=1e-9)
        assert sum(g[f"energy_{s[:-2]}_j"] for s in STATES) == pytest.approx(g["energy_j"], rel=1e-9)
    attributed = sum(pb.per_gpu[f"energy_{s[:-2]}_j"].sum() for s in STATES)
    assert attributed == pytest.approx(counter_j, rel=0.01)
    assert all(r2 is not None and r2 > 0.8 for r2 in fit_r2)
    for _, g in sp.per_gpu.iterrows():
        assert sum(g[f"frac_{c}"] for c in CATEGORIES) == pytest.approx(1.0, abs=1e-9)
        assert sum(g[f"energy_{c}_j"] for c in CATEGORIES) == pytest.approx(g["energy_j"], rel=1e-6)
    # the decode GPU's time is largely stranded compute. This split prices it by SM activity, which the
    # GPU model v3 derives from the SMs a kernel fills (decode ~50-60 %, was a constant 25 %), so the
    # figure sits near 0.4 where the roofline's decode time x (1 - MFU) is above 0.9 (analytics/roofline)
    pools = sp.per_pool.set_index("role")
    dec = pools.loc["mixed" if layout == "agg" else "decode"]
    assert dec["frac_stranded_compute"] > 0.3
    if layout == "1p1d":
        assert dec["frac_stranded_compute"] > pools.loc["prefill", "frac_stranded_compute"]


@pytest.mark.parametrize("min_busy_frac", [0.0, 0.5])
@pytest.mark.parametrize("layout", ["agg", "1p1d"])
def test_the_draws_loosest_bound_as_a_constant_draws_the_same_values(sim, layout, min_busy_frac):
    """The hashed draw's loosest bound, computed from the moments rows and put in the SQL as a
    constant (so that DuckDB filters the samples with it before any join), draws exactly the values
    of the bound as a subquery; with few points per GPU, so that the bound does cut.

    The draw hashes the sample time, which every GPU of a simulated scenario shares, and the
    scenario's times follow the wall clock: with 4 points per GPU the whole draw came back empty in
    about 2 % of runs (a Poisson draw of mean 4). 40 per GPU still thins ~3,000 values per GPU."""
    con, w = sim[layout]
    where = (
        "TRUE"
        if min_busy_frac == 0
        else "attributed AND coalesce(prefill_s, 0) + coalesce(mixed_prefill_s, 0) + coalesce(decode_s, 0)"
        f" + coalesce(mixed_decode_s, 0) >= {min_busy_frac} * interval_s"
    )
    with IntervalTable(con, w) as iv:
        base = con.execute(_moments_sql(iv.name, where)).df()
        least = _min_gpu_values(base)
        n_gpu = con.execute(
            f"SELECT min(n) FROM (SELECT sum(sm_n) AS n FROM {iv.name} WHERE {where} "
            'GROUP BY node, source, device, "index" HAVING sum(sm_n) > 0)'
        ).fetchone()[0]
        max_points = 10 * MIN_POINTS
        assert least == n_gpu and least > 4 * max_points
        key = ["gh", "rh", "hour_s", "x"]
        drawn = [
            con.execute(*_points_sql(iv, where, max_points, bound))
            .df()
            .sort_values(key)
            .reset_index(drop=True)
            for bound in (None, least)
        ]
    assert 0 < len(drawn[0]) < n_gpu  # the draw thins
    pd.testing.assert_frame_equal(drawn[0], drawn[1])


def test_the_drawn_cells_are_the_same_whatever_order_the_points_came_in():
    from analytics.bimodal import _cells

    rng = np.random.default_rng(5)
    n = 500
    pts = {
        "gh": rng.integers(1, 4, n).astype(np.uint64),
        "rh": rng.integers(7, 9, n).astype(np.uint64),
        "hour_s": rng.choice([0.0, 3600.0, 7200.0], n),
        "x": rng.uniform(0.0, 100.0, n).round(1),  # ties in x too
    }
    pts["n_gpu"] = pts["gh"].astype(np.int64) * 1000
    cells, per_gpu_n = _cells(pts)
    perm = rng.permutation(n)
    cells2, per_gpu_n2 = _cells({k: v[perm] for k, v in pts.items()})
    assert list(cells) == list(cells2) == sorted(cells)  # in order of their key
    assert all(np.array_equal(cells[k], cells2[k]) for k in cells)
    assert per_gpu_n == per_gpu_n2 == {1: 1000.0, 2: 2000.0, 3: 3000.0}
    for (gh, rh, hour), x in cells.items():
        sel = (pts["gh"] == gh) & (pts["rh"] == rh) & (pts["hour_s"] == hour)
        assert np.array_equal(x, np.sort(pts["x"][sel]))
    # a NULL key (a masked value) is no cell; no points, no cells
    masked = {**pts, "hour_s": np.ma.masked_array(pts["hour_s"], mask=pts["gh"] == 1)}
    assert {k[0] for k in _cells(masked)[0]} == {2, 3}
    assert _cells({k: v[:0] for k, v in pts.items()}) == ({}, {})
