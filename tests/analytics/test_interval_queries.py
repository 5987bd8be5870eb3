"""The named queries of the sample intervals (analytics/interval_queries.py) and the grid buckets
(analytics/bucket_queries.py, analytics/bucket_iterations.py), each read on its own
(analytics/query.py's ``select_from``) from a small real store with hand-computed contents: the
hand case of tests/analytics/test_attribution.py (one GPU sampled each second from 100 s, four
iterations, two requests) and a GPU with a 20 s sample gap."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from analytics.bucket_queries import bucket_ctes, buckets_sql
from analytics.interval_queries import interval_ctes, intervals_sql
from analytics.intervals import edge_seconds, registered_islands
from analytics.query import Cte, Query, select_from, with_ctes
from analytics.window import Window
from tests.analytics.test_attribution import (
    HAND_ITERATIONS,
    HAND_REQUESTS,
    HAND_STATES,
    counter_mj,
    hand_energy_j,
    iteration,
    make_store,
    request,
    samples,
)

HAND_WINDOW = Window(100.0, 105.0, "live")
GAP_WINDOW = Window(100.0, 150.0, "live")


def _rows(con: duckdb.DuckDBPyConnection, ctes: list[Cte], name: str, cols: str) -> list[tuple[Any, ...]]:
    """``cols`` of the named query ``name``, ordered by them, floats rounded to 1e-6."""
    sql, params = select_from(ctes, name)
    rows = con.execute(f"SELECT {cols} FROM ({sql}) ORDER BY ALL", params).fetchall()
    return [tuple(round(v, 6) if isinstance(v, float) else v for v in r) for r in rows]


@pytest.fixture
def hand(tmp_path: Path) -> Iterator[tuple[duckdb.DuckDBPyConnection, str]]:
    ts = [100.0, 101.0, 102.0, 103.0, 104.0]
    con = make_store(
        tmp_path / "hand.duckdb",
        {
            "gpu_samples": samples(ts, counter_mj(hand_energy_j())),
            "iterations": HAND_ITERATIONS,
            "requests": HAND_REQUESTS,
        },
    )
    with registered_islands(con, HAND_WINDOW) as islands:
        yield con, islands
    con.close()


@pytest.fixture
def gap(tmp_path: Path) -> Iterator[tuple[duckdb.DuckDBPyConnection, str]]:
    """Samples each second over [100, 110] and [130, 140] (a 20 s gap; threshold 5 × 40/21 s), one
    decode iteration 108–133 s and a request in flight 105–135 s."""
    ts = [100.0 + i for i in range(11)] + [130.0 + i for i in range(11)]
    con = make_store(
        tmp_path / "gap.duckdb",
        {
            "gpu_samples": samples(ts, [1_000_000 + 1000 * int(t) for t in ts]),
            "iterations": [iteration(108.0, 133.0, "decode")],
            "requests": [request("r", 105.0, 135.0)],
        },
    )
    with registered_islands(con, GAP_WINDOW) as islands:
        yield con, islands
    con.close()


def test_with_ctes_names_each_query_and_keeps_the_parameters_in_text_order():
    ctes = [
        Cte("a", Query("SELECT ? AS x", (2,))),
        Cte("b", Query("SELECT x * ? AS y FROM a", (5,)), inline=True),
    ]
    sql, params = with_ctes(ctes, Query("SELECT y - ? FROM b", (1,)))
    assert params == [2, 5, 1] and "b AS NOT MATERIALIZED (" in sql
    con = duckdb.connect()
    assert con.execute(sql, params).fetchall() == [(9,)]
    sql, params = select_from(ctes, "a")
    assert con.execute(sql, params).fetchall() == [(2,)]
    with pytest.raises(KeyError, match="no query named 'c'; names: a, b"):
        select_from(ctes, "c")


# -- sample intervals ---------------------------------------------------------------------------


def test_interval_segments_and_their_cumulative_states(hand):
    con, islands = hand
    ctes = interval_ctes(HAND_WINDOW, islands)
    # the last decode: modeled 0.3 s of a 0.4 s step, its host part (0.1 s) first
    assert _rows(con, ctes, "seg", "a_s, hl_s, bl_s, phase") == [
        (100.2, 0.0, 0.5, "prefill"),
        (100.9, 0.0, 0.4, "decode"),
        (101.5, 0.0, 1.0, "mixed"),
        (102.6, 0.1, 0.3, "decode"),
    ]
    assert _rows(con, ctes, "segc", "a_s, c_p, c_d, c_mp, c_md, c_host") == [
        (100.2, 0.0, 0.0, 0.0, 0.0, 0.0),
        (100.9, 0.5, 0.0, 0.0, 0.0, 0.0),
        (101.5, 0.5, 0.4, 0.0, 0.0, 0.0),
        (102.6, 0.5, 0.4, 0.75, 0.25, 0.0),  # the mixed step: 3/4 prefill by tokens
    ]
    assert _rows(con, ctes, "islc", "a_s, len_s, c_in") == [(100.0, 1.3, 0.0), (101.4, 1.6, 1.3)]


def test_interval_read_points_carry_the_cumulative_functions(hand):
    con, islands = hand
    ctes = interval_ctes(HAND_WINDOW, islands)
    assert _rows(con, ctes, "ordered", "ts_s, t0_s, gap_threshold_s, worker") == [
        (100.0, None, 5.0, "w0"),
        (101.0, 100.0, 5.0, "w0"),
        (102.0, 101.0, 5.0, "w0"),
        (103.0, 102.0, 5.0, "w0"),
        (104.0, 103.0, 5.0, "w0"),
    ]
    assert _rows(con, ctes, "pts", "t_s, extra") == [(t, 0) for t in (100.0, 101.0, 102.0, 103.0, 104.0)]
    assert _rows(con, ctes, "ptv", "t_s, p_c, d_c, mp_c, md_c, host_c, in_c") == [
        (100.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
        (101.0, 0.5, 0.1, 0.0, 0.0, 0.0, 1.0),
        (102.0, 0.5, 0.4, 0.375, 0.125, 0.0, 1.9),
        (103.0, 0.5, 0.7, 0.75, 0.25, 0.1, 2.9),
        (104.0, 0.5, 0.7, 0.75, 0.25, 0.1, 2.9),
    ]
    assert _rows(con, ctes, "attributed", "device") == [("cuda:0",)]


def test_intervals_sql_gives_the_hand_computed_states(hand):
    con, islands = hand
    sql, params = intervals_sql(HAND_WINDOW, islands)
    df = con.execute(f"SELECT * FROM ({sql}) ORDER BY t0_s", params).df()
    for state, want in HAND_STATES.items():
        assert df[state].round(9).tolist() == want, state


# -- grid buckets ---------------------------------------------------------------------------------


def test_bucket_cells_of_one_sub_cell_and_their_ends(hand):
    con, islands = hand
    ctes = bucket_ctes(HAND_WINDOW, 1.0, islands)
    assert _rows(con, ctes, "sub", "k, n, f_ts, l_ts") == [
        (k, 1, float(k), float(k)) for k in range(100, 105)
    ]
    counter = counter_mj(hand_energy_j())
    assert _rows(con, ctes, "sb", "k, samples, f_e, l_e") == [
        (100 + i, 1, e, e) for i, e in enumerate(counter)
    ]
    # a bucket reaches to the next one's start; the last ends at its last sample
    assert _rows(con, ctes, "cov", "k, t0_s, t1_s, k_end") == [
        (100, 100.0, 101.0, 101),
        (101, 101.0, 102.0, 102),
        (102, 102.0, 103.0, 103),
        (103, 103.0, 104.0, 104),
        (104, 104.0, 104.0, 105),
    ]
    ends = _rows(con, ctes, "en", "k, e0, e1, has_counter")
    assert [(k, e0, e1) for k, e0, e1, _ in ends[:4]] == [
        (100 + i, float(counter[i]), float(counter[i + 1])) for i in range(4)
    ]
    assert all(ok for *_, ok in ends)
    assert _rows(con, ctes, "span", "uuid, s0, s1, g") == [("GPU-a", 100.0, 104.0, 1)]


def test_bucket_iteration_and_in_flight_seconds_per_cell(hand):
    con, islands = hand
    ctes = bucket_ctes(HAND_WINDOW, 1.0, islands)
    per_cell = [
        (100, 0.5, 0.1, 0.0, 0.0, 0.0),
        (101, 0.0, 0.3, 0.375, 0.125, 0.0),
        (102, 0.0, 0.3, 0.375, 0.125, 0.1),
    ]
    assert _rows(con, ctes, "itagg", "j, p_s, d_s, mp_s, md_s, h_s") == per_cell
    assert _rows(con, ctes, "itb", "k, p_s, d_s, mp_s, md_s, h_s") == per_cell
    assert _rows(con, ctes, "inagg", "worker, j, in_s") == [
        ("w0", 100, 1.0),
        ("w0", 101, 0.9),
        ("w0", 102, 1.0),
        ("w0", 103, 0.0),
    ]
    assert _rows(con, ctes, "inb", "k, in_s") == [(100, 1.0), (101, 0.9), (102, 1.0), (103, 0.0)]
    # a 10 s bucket (two sub-cells of 5 s): one cell holding it all
    wide = bucket_ctes(HAND_WINDOW, 10.0, islands)
    assert _rows(con, wide, "sb", "k, samples, f_ts, l_ts") == [(10, 5, 100.0, 104.0)]
    assert _rows(con, wide, "itagg", "j, p_s, d_s, mp_s, md_s, h_s") == [(10, 0.5, 0.7, 0.75, 0.25, 0.1)]
    assert _rows(con, wide, "inb", "k, in_s") == [(10, 2.9)]


def test_the_rollup_side_gives_the_raw_sides_cell_seconds(hand):
    con, islands = hand
    raw = bucket_ctes(HAND_WINDOW, 1.0, islands)
    rolled = bucket_ctes(HAND_WINDOW, 1.0, islands, rollup=True, edge_seconds=edge_seconds(con, HAND_WINDOW))
    assert [c.name for c in rolled if c.name in ("edges", "ite", "itr")] == ["edges", "ite", "itr"]
    cols = "j, p_s, d_s, mp_s, md_s, h_s"
    assert _rows(con, rolled, "itagg", cols) == _rows(con, raw, "itagg", cols)
    assert (
        _rows(con, rolled, "ow", "g, worker") == _rows(con, raw, "ow", "g, worker") == []
    )  # devices name w0


def test_buckets_of_one_second_are_the_sample_intervals(hand):
    con, islands = hand
    sql, params = buckets_sql(HAND_WINDOW, 1.0, islands)
    df = con.execute(f"SELECT * FROM ({sql}) ORDER BY t0_s", params).df()
    assert df["k"].tolist() == [100, 101, 102, 103]  # the last cell's bucket holds no time
    for state, want in HAND_STATES.items():
        assert df[state].round(9).tolist() == want, state


@pytest.mark.parametrize("bucket_s", [5.0, 10.0])
def test_a_sample_gap_is_found_and_its_work_taken_off_its_edge_cells(gap, bucket_s):
    con, islands = gap
    ctes = bucket_ctes(GAP_WINDOW, bucket_s, islands)
    last, after = int(110 // bucket_s), int(130 // bucket_s)  # the cells of the gap's two ends
    sg = [r for r in _rows(con, ctes, "sg", "k, f_ts, pl_ts, gap_s, gap_e_j") if r[3] > 0]
    assert sg == [(after, 130.0, 110.0, 20.0, 20.0)]  # 20 s, 20,000 mJ of counter across it
    cov = {r[0]: r[1:] for r in _rows(con, ctes, "cov", "k, t0_s, t1_s, unsampled_s")}
    assert cov[after] == (110.0, after * bucket_s + bucket_s, 20.0)  # from the last sample before it
    assert cov[last][1] == 110.0  # the bucket before it ends at its last sample
    assert _rows(con, ctes, "gpart", "k, lo, hi") == [
        (last, 110.0, (last + 1) * bucket_s),
        (after, 130.0, 130.0),
    ]
    # the decode step 108-133 s: its seconds in the gap's part of the cell of 110 s are taken off
    assert _rows(con, ctes, "itgap", "k, d_s") == [(last, -((last + 1) * bucket_s - 110.0)), (after, -0.0)]
    assert _rows(con, ctes, "ingap", "k, in_gap_s") == [(last, (last + 1) * bucket_s - 110.0), (after, 0.0)]
    sql, params = buckets_sql(GAP_WINDOW, bucket_s, islands)
    df = con.execute(f"SELECT * FROM ({sql})", params).df()
    assert df["unsampled_s"].sum() == pytest.approx(20.0)
    # the step's 25 s less the 20 s inside the gap
    assert df["decode_s"].sum() == pytest.approx(5.0)


@pytest.mark.parametrize("statement", ["intervals", "buckets", "buckets-rollup", "buckets-10s"])
def test_every_named_query_reads_on_its_own(hand, statement):
    con, islands = hand
    ctes = {
        "intervals": lambda: interval_ctes(HAND_WINDOW, islands),
        "buckets": lambda: bucket_ctes(HAND_WINDOW, 1.0, islands),
        "buckets-rollup": lambda: bucket_ctes(HAND_WINDOW, 1.0, islands, rollup=True),
        "buckets-10s": lambda: bucket_ctes(HAND_WINDOW, 10.0, islands, long_iterations=False),
    }[statement]()
    assert len({c.name for c in ctes}) == len(ctes)  # each name once
    for cte in ctes:
        sql, params = select_from(ctes, cte.name)
        con.execute(f"SELECT count(*) FROM ({sql})", params).fetchall()
