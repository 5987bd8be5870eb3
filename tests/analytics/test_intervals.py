"""Request islands (analytics.intervals.request_islands): the union of request spans per worker."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from analytics.attribution import gpu_buckets
from analytics.intervals import (
    buckets_sql,
    edge_seconds,
    has_long_iterations,
    registered_islands,
    request_islands,
    span_order,
    use_rollup,
)
from analytics.window import Window
from collector.store import Store
from tests.analytics.test_attribution import iteration, make_store, request, samples


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


# -- the iteration rollup (collector/store/iteration_seconds.py) against the raw iterations -----------

_STATE_COLUMNS = [
    "prefill_s", "decode_s", "mixed_prefill_s", "mixed_decode_s", "host_s", "gap_s", "idle_s",
    "unsampled_s", "excess_s", "interval_s", "energy_j", "attributed", "worker",
]  # fmt: skip


def _buckets(
    con: duckdb.DuckDBPyConnection, window: Window, bucket_s: float, *, rollup: bool
) -> pd.DataFrame:
    with registered_islands(con, window) as islands:
        sql, params = (
            buckets_sql(window, bucket_s, islands, rollup=True, edge_seconds=edge_seconds(con, window))
            if rollup
            else buckets_sql(
                window, bucket_s, islands, long_iterations=has_long_iterations(con, window, bucket_s)
            )
        )
        df = con.execute(f"SELECT * FROM ({sql}) ORDER BY device, k", params).df()
    return df[["device", "k", *_STATE_COLUMNS]].reset_index(drop=True)


def _awkward_rows() -> dict[str, list[dict]]:
    """Two GPUs sampled every 0.5 s from 100.3 s with a sample gap on one; prefill, decode and mixed
    iterations with host parts, some crossing several seconds or the GPUs' first and last samples;
    the second GPU's devices rows name no worker (its owner comes from the iterations)."""
    ts = [100.3 + 0.5 * i for i in range(40)]
    gap = [t for t in ts if not 106.0 < t < 112.0]  # a 6 s sample gap on the second GPU
    gpu_b = {"device": "cuda:1", "index": 1, "uuid": "GPU-b", "worker": None}
    rows = samples(ts, [1_000_000 + 100_000 * i for i in range(len(ts))])
    rows += samples(gap, [5_000_000 + 150_000 * i for i in range(len(gap))], **gpu_b)
    its = []
    t = 99.8
    for k in range(60):
        phase = ("prefill", "decode", "mixed")[k % 3]
        length = (0.07, 0.31, 1.45, 0.5, 2.6)[k % 5]
        extra = {"prefill_tokens": 5, "decode_seqs": 3} if phase == "mixed" else {}
        its.append(iteration(t, t + length, phase, modeled_s=0.8 * length, **extra))
        its.append(
            {
                **iteration(t + 0.05, t + 0.05 + length / 2, phase, **extra),
                "gpu_uuid": "GPU-b",
                "worker": "w1",
            }
        )
        t += length * 0.37
    reqs = [request(f"r{k}", 100.0 + 2.0 * k, 101.5 + 2.0 * k) for k in range(10)]
    reqs += [
        {**request(f"q{k}", 100.5 + 3.0 * k, 101.0 + 3.0 * k), "prefill_worker": "w1", "decode_worker": "w1"}
        for k in range(6)
    ]
    return {"gpu_samples": rows, "iterations": its, "requests": reqs}


@pytest.mark.parametrize("bucket_s", [1.0, 2.0, 5.0])
def test_the_rollup_gives_the_raw_iterations_buckets(tmp_path, bucket_s):
    con = make_store(tmp_path / "awkward.duckdb", _awkward_rows())
    for window in (Window(100.0, 125.0, "live"), Window(101.37, 118.6, "live"), Window(104.2, 104.9, "live")):
        assert use_rollup(con, window, bucket_s)
        rolled, raw = (
            _buckets(con, window, bucket_s, rollup=True),
            _buckets(con, window, bucket_s, rollup=False),
        )
        assert len(raw) > 0 and raw["prefill_s"].sum() > 0 and raw["mixed_decode_s"].sum() > 0
        assert raw["unsampled_s"].sum() > 0 or window.end_s - window.start_s < 10
        pd.testing.assert_frame_equal(rolled, raw, check_exact=False, atol=1e-9, rtol=0)


def test_iterations_written_around_the_store_are_read_raw(tmp_path):
    path = tmp_path / "around.duckdb"
    make_store(path, _awkward_rows()).close()
    window = Window(100.0, 125.0, "live")
    with Store.open(path) as store, store.transaction() as con:
        con.execute(
            "INSERT INTO iterations SELECT * REPLACE (start_s + 0.13 AS start_s, end_s + 0.13 AS end_s) FROM iterations"
        )
    con = duckdb.connect(str(path), read_only=True)
    assert not use_rollup(con, window, 1.0)  # the rollup lacks the new rows: the raw rows are read
    assert not use_rollup(con, window, 2.5)  # (and a bucket of a part-second never uses it)
    raw = _buckets(con, window, 1.0, rollup=False)
    stale = _buckets(con, window, 1.0, rollup=True)
    assert stale["excess_s"].sum() < raw["excess_s"].sum() - 1.0  # the doubled rows the rollup lacks
    used = gpu_buckets(con, window, 1.0).sort_values(["device", "k"]).reset_index(drop=True)
    for col in ("prefill_s", "decode_s", "excess_s"):
        np.testing.assert_allclose(used[col], raw[col], atol=1e-9, err_msg=col)
