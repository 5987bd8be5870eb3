"""Rows handed over as columns (what the high-rate sources produce): same checks as dict rows."""

from __future__ import annotations

import pytest

from collector.sources.base import SourceResult
from collector.store import Store, StoreError
from collector.store.columns import ColumnBlock


def _block(ts: list[float], power: list, **constants: object) -> ColumnBlock:
    return ColumnBlock.of(
        {
            "ts_s": ts,
            "device": [f"cuda:{i}" for i in range(len(ts))],
            "index": list(range(len(ts))),
            "power_w": power,
            "emulated": [False] * len(ts),
        },
        {"node": "n1", "source": "nvml", **constants},
    )


def test_blocks_of_many_polls_are_one_append_with_constants_and_device_rows(store: Store) -> None:
    blocks = [
        _block([1.0, 1.0], [100, 200.5], uuid="GPU-a", worker="worker-0", role="decode"),
        _block([2.0, 2.0], [None, float("nan")], uuid="GPU-a", worker="worker-0", role="prefill"),
    ]
    assert store.append_columns("gpu_samples", blocks) == 4
    got = store.query(
        'SELECT ts_s, "index", power_w, role, worker FROM gpu_samples_full ORDER BY ts_s, "index"'
    )
    assert got["power_w"].tolist()[:2] == [100.0, 200.5] and got["power_w"][2:].isna().all()
    assert got["role"].tolist() == ["decode", "decode", "prefill", "prefill"]
    roles = store.query('SELECT "index", since_s, role FROM devices ORDER BY "index", since_s')
    assert roles.values.tolist() == [
        [0, 1.0, "decode"],
        [0, 2.0, "prefill"],
        [1, 1.0, "decode"],
        [1, 2.0, "prefill"],
    ]


def test_a_value_of_the_wrong_type_is_refused_naming_the_column_and_nothing_is_written(store: Store) -> None:
    blocks = [_block([1.0], [100.0]), _block([2.0], ["lots"])]
    with pytest.raises(StoreError, match=r"gpu_samples\.power_w"):
        store.append_columns("gpu_samples", blocks)
    with pytest.raises(StoreError, match=r"unknown column\(s\) 'watts'"):
        store.append_columns("gpu_samples", [ColumnBlock.of({"watts": [1.0]}, {"node": "n1"})])
    with pytest.raises(StoreError, match=r"gpu_samples\.node must not be NULL"):
        store.append_columns(
            "gpu_samples", [ColumnBlock.of({"ts_s": [1.0], "device": ["c"], "emulated": [False]})]
        )
    store.flush()
    assert store.query("SELECT count(*) AS n FROM gpu_samples")["n"][0] == 0


def test_integral_floats_fit_an_integer_column_and_json_columns_take_objects(store: Store) -> None:
    store.append_columns(
        "gpu_samples",
        [
            ColumnBlock.of(
                {"ts_s": [1.0], "sm_clock_mhz": [1980.0], "device": ["c"], "emulated": [False]},
                {"node": "n", "source": "s"},
            )
        ],
    )
    store.append_columns(
        "control_events",
        [
            ColumnBlock.of(
                {"ts_s": [1.0], "action": ["set"], "after": [{"role": "decode"}]},
                {"node": "n", "source": "router"},
            )
        ],
    )
    assert store.query("SELECT sm_clock_mhz FROM gpu_samples")["sm_clock_mhz"][0] == 1980
    assert store.query("SELECT after->>'role' AS r FROM control_events")["r"][0] == "decode"


def test_source_result_columns_count_as_rows_and_unequal_lengths_are_refused() -> None:
    res = SourceResult("s", 0.0)
    res.add_columns("gpu_samples", {"ts_s": [1.0, 2.0], "device": ["a", "b"]}, {"node": "n"})
    res.add_rows("host_samples", [{"pid": 1}])
    assert res.n_rows == 3
    with pytest.raises(ValueError, match="equal lengths"):
        res.add_columns("gpu_samples", {"ts_s": [1.0], "device": ["a", "b"]})


def test_polls_with_none_ints_and_floats_in_one_column_are_one_float_column(store: Store) -> None:
    # a poll where a metric is missing (all None) or integral, beside polls where it is a float
    blocks = [_block([1.0], [None]), _block([2.0], [300]), _block([3.0], [250.5])]
    assert store.append_columns("gpu_samples", blocks) == 3
    assert store.query("SELECT power_w FROM gpu_samples ORDER BY ts_s")["power_w"].tolist()[1:] == [
        300.0,
        250.5,
    ]
