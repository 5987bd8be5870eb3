"""Request islands (analytics.intervals.request_islands): the union of request spans per worker."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from analytics.intervals import request_islands, span_order
from analytics.window import Window
from tests.analytics.test_attribution import make_store, request


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


def test_thespan_order_is_lexsorts_with_ties_out_of_order_and_many_workers():
    rng = np.random.default_rng(7)
    for trial in range(300):
        n = int(rng.integers(1, 80))
        a = rng.integers(0, 6, n).astype(float)  # many spans starting together
        b = a + rng.integers(0, 4, n)
        if trial % 3 == 0:
            a, b = np.sort(a), np.sort(b)  # in order, as stored: the fast path
        gid = rng.integers(0, 3 if trial % 2 else 70_000, n).astype(np.int64)  # few ids, or > 16 bits
        assert np.array_equal(span_order(gid, a, b), np.lexsort((b, a, gid)))


def test_spans_stored_out_of_order_and_starting_together_merge_per_worker(tmp_path):
    rows = [
        request("r1", 105.0, 106.0),
        request("r2", 100.0, 101.0, prefill_worker="w1", decode_worker="w1"),
        request("r3", 100.0, 103.0),  # starts with r4, ends later: stored before it
        request("r4", 100.0, 100.5),
        request("r5", 103.0, 104.0),  # touches r3's end
        request("r6", 102.0, 102.5, prefill_worker="w1", decode_worker="w1"),
    ]
    assert _islands(tmp_path, rows, Window(0.0, 1000.0)) == [
        ("w0", 100.0, 104.0),
        ("w0", 105.0, 106.0),
        ("w1", 100.0, 101.0),
        ("w1", 102.0, 102.5),
    ]
