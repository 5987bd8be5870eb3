"""Request islands (analytics.intervals.request_islands): the union of request spans per worker."""

from __future__ import annotations

from pathlib import Path

from analytics.intervals import any_cell_crossers, buckets_sql, registered_islands, request_islands
from analytics.window import Window
from tests.analytics.test_attribution import (
    HAND_ITERATIONS,
    HAND_REQUESTS,
    counter_mj,
    hand_energy_j,
    make_store,
    request,
    samples,
)


def _islands(tmp_path: Path, rows: list[dict], window: Window) -> list[tuple[str, float, float]]:
    con = make_store(tmp_path / f"islands-{window.start_s:g}.duckdb", {"requests": rows})
    try:
        t = request_islands(con, window)
        return sorted(zip(t["worker"].to_pylist(), t["a_s"].to_pylist(), t["b_s"].to_pylist(), strict=True))
    finally:
        con.close()


def test_overlapping_touching_and_nested_spans_merge_separate_ones_do_not(tmp_path):
    rows = [
        request("r1", 100.0, 102.0),
        request("r2", 101.0, 103.0),  # overlaps r1
        request("r3", 103.0, 104.0),  # touches r2's end: same island
        request("r4", 100.5, 100.7),  # inside r1
        request("r5", 105.0, 106.0),  # after a gap: an island of its own
        request("r6", 100.0, 101.0, prefill_worker="w1", decode_worker="w1"),  # another worker
        request("r7", 107.0, 107.0),  # zero length: no time in flight
    ]
    assert _islands(tmp_path, rows, Window(0.0, 1000.0)) == [
        ("w0", 100.0, 104.0),
        ("w0", 105.0, 106.0),
        ("w1", 100.0, 101.0),
    ]


def test_a_handed_off_request_is_on_each_worker_for_its_part(tmp_path):
    rows = [
        request("r1", 10.0, 20.0, decode_worker="d0", kv_transfer_start_s=12.0, kv_transfer_end_s=13.0),
        request("r2", 11.0, 12.5),  # on w0 only, overlapping r1's prefill part
    ]
    assert _islands(tmp_path, rows, Window(0.0, 100.0)) == [("d0", 13.0, 20.0), ("w0", 10.0, 12.5)]


def test_spans_outside_the_window_are_left_out_and_an_empty_window_has_no_islands(tmp_path):
    rows = [request("r1", 10.0, 20.0), request("r2", 50.0, 60.0)]
    assert _islands(tmp_path, rows, Window(30.0, 100.0)) == [("w0", 50.0, 60.0)]
    assert _islands(tmp_path, rows, Window(200.0, 300.0)) == []


def test_the_later_cells_scan_is_left_out_only_where_no_iteration_crosses_a_cell(tmp_path):
    con = make_store(
        tmp_path / "cross.duckdb",
        {
            "gpu_samples": samples([100.0, 101.0, 102.0, 103.0, 104.0], counter_mj(hand_energy_j())),
            "iterations": HAND_ITERATIONS,
            "requests": HAND_REQUESTS,
        },
    )
    w = Window(100.0, 104.5)

    def decode_s(bucket_s: float, crossers: bool) -> list[tuple]:
        with registered_islands(con, w) as islands:
            sql, params = buckets_sql(w, bucket_s, islands, crossers=crossers)
            return con.execute(
                f"SELECT k, decode_s, host_s, idle_s FROM ({sql}) ORDER BY k", params
            ).fetchall()

    try:
        assert any_cell_crossers(con, w, 1.0)  # the decode step (100.9, 101.3) crosses 101 s
        assert not any_cell_crossers(con, w, 5.0)  # every step lies in [100, 105)
        assert decode_s(5.0, crossers=False) == decode_s(5.0, crossers=True)
        # where one crosses, the branch carries its piece in the later cell: leaving it out would lose it
        assert sum(r[1] for r in decode_s(1.0, crossers=False)) < sum(
            r[1] for r in decode_s(1.0, crossers=True)
        )
    finally:
        con.close()
