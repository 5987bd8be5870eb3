"""Rows handed over as columns (what the high-rate sources produce): same checks as dict rows."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from collector.sources.base import SourceResult
from collector.store import Store, StoreError
from collector.store.column_build import build_columns
from collector.store.columns import ColumnBlock, RepeatedColumns
from collector.store.devices import STEADY_SAMPLE_COLUMNS


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


# -- polls that share their GPUs' identity (RepeatedColumns): merged per run, built once ----------


def _polls(source: SourceResult, repeats: RepeatedColumns, ts: list[float], **identity: list) -> None:
    """One 2-GPU poll per ``ts`` through ``add_samples``, as the NVML source makes them."""
    for k, t in enumerate(ts):
        samples = [
            {
                "ts_s": t,
                "device": f"cuda:{i}",
                "index": i,
                "uuid": f"GPU-{i}",
                "emulated": False,
                "power_w": 100.0 + k + i,
                **{name: values[i] for name, values in identity.items()},
            }
            for i in range(2)
        ]
        source.add_samples("gpu_samples", samples, {"node": "n1", "source": "nvml"}, repeats)


def test_repeated_identity_is_one_object_until_a_value_or_its_type_changes() -> None:
    repeats = RepeatedColumns()
    first = repeats.share({"device": ["cuda:0"], "index": [1]})
    assert repeats.share({"device": ("cuda:0",), "index": [1]}) is first
    changed = repeats.share({"device": ["cuda:0"], "index": [True]})  # True == 1, but not an int
    assert changed is not first and changed["index"] == (True,)
    assert repeats.share({"device": ["cuda:1"], "index": [True]}) is not changed


def test_polls_of_mixed_shapes_store_what_the_same_rows_as_dicts_store(store_path: Path) -> None:
    result = SourceResult("nvml", 0.0)
    repeats = RepeatedColumns()
    _polls(result, repeats, [1.0, 2.0, 3.0], worker=["w0", "w1"])
    _polls(result, repeats, [4.0, 5.0], worker=["w0", "w2"])  # a new owner: a new shared object
    _polls(result, repeats, [6.0])  # no worker column at all: another shape
    result.add_columns(
        "gpu_samples",
        {"ts_s": [7.0], "device": ["cuda:0"], "index": [0]},
        {"node": "n1", "source": "nvml", "emulated": False},
    )
    result.add_columns(  # a poll whose values are plain lists (no repeats), other constants
        "gpu_samples",
        {"ts_s": [8.0], "device": ["cuda:0"], "index": [0], "power_w": [1.5], "emulated": [True]},
        {"node": "n2", "source": "other"},
    )
    blocks = result.columns["gpu_samples"]
    assert len({id(b.repeats) for b in blocks[:3]}) == 1 and blocks[3].repeats is not blocks[0].repeats
    rows = result.table_rows("gpu_samples")
    query = (
        'SELECT node, source, ts_s, device, "index", uuid, emulated, power_w, worker '
        'FROM gpu_samples_full ORDER BY ts_s, node, "index"'
    )
    with Store.open(store_path) as store:
        assert store.append_columns("gpu_samples", blocks) == 14
        store.flush()
        as_columns = store.query(query)
        devices_columns = store.query("SELECT * EXCLUDE (since_s) FROM devices ORDER BY ALL")
    with Store.open(store_path.with_name("dicts.duckdb")) as store:
        assert store.append("gpu_samples", rows) == 14
        store.flush()
        assert as_columns.equals(store.query(query))
        assert devices_columns.equals(store.query("SELECT * EXCLUDE (since_s) FROM devices ORDER BY ALL"))
    assert as_columns["worker"].tolist()[:6] == ["w0", "w1"] * 3
    assert as_columns["worker"].tolist()[6:10] == ["w0", "w2"] * 2


def test_a_bad_value_in_one_poll_of_many_is_named_and_nothing_is_written(store: Store) -> None:
    result = SourceResult("nvml", 0.0)
    repeats = RepeatedColumns()
    _polls(result, repeats, [float(t) for t in range(1, 50)], worker=["w0", "w1"])
    _polls(result, repeats, [50.0], worker=["w0", 7])  # an int where the worker name goes
    _polls(result, repeats, [51.0, 52.0], worker=["w0", "w1"])
    with pytest.raises(StoreError, match=r"gpu_samples\.worker"):
        store.append_columns("gpu_samples", result.columns["gpu_samples"])
    bad_power = SourceResult("nvml", 0.0)
    _polls(bad_power, RepeatedColumns(), [1.0, 2.0, 3.0], worker=["w0", "w1"])
    blocks = bad_power.columns["gpu_samples"]
    b = blocks[1]  # the middle poll's second GPU reports a string
    blocks[1] = ColumnBlock.of({**b.values, "power_w": [101.0, "lots"]}, b.constants, b.repeats)
    assert blocks[1].repeats is blocks[0].repeats is blocks[2].repeats
    with pytest.raises(StoreError, match=r"gpu_samples\.power_w"):
        store.append_columns("gpu_samples", bad_power.columns["gpu_samples"])
    store.flush()
    assert store.query("SELECT count(*) AS n FROM gpu_samples")["n"][0] == 0
    assert store.query("SELECT count(*) AS n FROM devices")["n"][0] == 0


def test_devices_rows_follow_changes_across_and_within_flushes(store: Store) -> None:
    result = SourceResult("nvml", 0.0)
    repeats = RepeatedColumns()
    _polls(result, repeats, [3.0, 2.0, 4.0], worker=["w0", "w1"])  # a late poll: its ts counts
    _polls(result, repeats, [5.0, 6.0], worker=["w0", "w2"])
    store.append_columns("gpu_samples", result.columns["gpu_samples"])
    again = SourceResult("nvml", 0.0)
    _polls(again, repeats, [7.0, 8.0], worker=["w0", "w2"])  # unchanged: no devices row
    _polls(again, repeats, [9.0], worker=["w3", "w2"])
    store.append_columns("gpu_samples", again.columns["gpu_samples"])
    store.flush()
    got = store.query('SELECT "index", since_s, worker FROM devices ORDER BY "index", since_s')
    assert got.values.tolist() == [
        [0, 2.0, "w0"],
        [0, 9.0, "w3"],
        [1, 2.0, "w1"],
        [1, 5.0, "w2"],
    ]
    assert store.query("SELECT count(*) AS n FROM gpu_samples")["n"][0] == 16


def test_samples_with_the_same_keys_in_another_order_keep_their_values() -> None:
    result = SourceResult("nvml", 0.0)
    result.add_samples(
        "gpu_samples",
        [{"ts_s": 1.0, "power_w": 10.0}, {"power_w": 20.0, "ts_s": 2.0}],
        {"node": "n1"},
    )
    assert result.table_rows("gpu_samples") == [
        {"ts_s": 1.0, "power_w": 10.0, "node": "n1"},
        {"ts_s": 2.0, "power_w": 20.0, "node": "n1"},
    ]


def test_a_steady_column_is_shared_until_it_changes_then_handed_on_per_poll(store_path: Path) -> None:
    repeats = RepeatedColumns(steady=["power_limit_w"])
    result = SourceResult("nvml", 0.0)
    limits = [300.0, 300.0, 250.0, 300.0, 300.0]  # the limit changes at the third poll, and back
    for k, limit in enumerate(limits):
        samples = [
            {"ts_s": float(k), "device": f"cuda:{i}", "index": i, "uuid": f"GPU-{i}", "power_limit_w": limit}
            for i in range(2)
        ]
        result.add_samples(
            "gpu_samples", samples, {"node": "n1", "source": "nvml", "emulated": False}, repeats
        )
    blocks = result.columns["gpu_samples"]
    assert "power_limit_w" in blocks[0].repeats and blocks[1].repeats is blocks[0].repeats
    assert all("power_limit_w" in b.values for b in blocks[2:])  # handed on per poll from the change
    assert blocks[3].repeats is blocks[2].repeats is blocks[4].repeats  # the identity alone: shared
    with Store.open(store_path) as store:
        assert store.append_columns("gpu_samples", blocks) == 10
        store.flush()
        got = store.query('SELECT power_limit_w FROM gpu_samples ORDER BY ts_s, "index"')
        assert got["power_limit_w"].tolist() == [x for x in limits for _ in range(2)]
        assert store.query("SELECT count(*) AS n FROM devices")["n"][0] == 2


def _shared_polls(polls: int, start_s: float = 0.0, **identity: list) -> list[ColumnBlock]:
    """``polls`` polls of two GPUs, one a second from ``start_s``, whose ``identity`` columns are
    one shared repeats object."""
    shared = RepeatedColumns().share(
        {"device": ["cuda:0", "cuda:1"], "index": [0, 1], "emulated": [False, False], **identity}
    )
    return [
        ColumnBlock.of(
            {"ts_s": [start_s + k] * 2, "power_w": [100.0 + k, 200.0 + k]},
            {"node": "n1", "source": "nvml"},
            shared,
        )
        for k in range(polls)
    ]


def test_repeated_and_constant_columns_keep_their_checks_on_their_distinct_values(store: Store) -> None:
    # stored through the dictionary-encoded path: NaN is NULL, a NULL node is refused, a value
    # that does not fit is named, and nothing of a refused append is written
    assert store.append_columns("gpu_samples", _shared_polls(3, power_limit_w=[float("nan"), 300])) == 6
    got = store.query('SELECT ts_s, "index", power_limit_w, node FROM gpu_samples ORDER BY ts_s, "index"')
    assert got["power_limit_w"].isna().tolist() == [True, False] * 3
    assert got["power_limit_w"].dropna().tolist() == [300.0] * 3 and set(got["node"]) == {"n1"}
    nameless = [
        ColumnBlock.of(b.values, {"node": None, "source": "nvml"}, b.repeats) for b in _shared_polls(2)
    ]
    with pytest.raises(StoreError, match=r"gpu_samples\.node must not be NULL \(4 of 4 rows"):
        store.append_columns("gpu_samples", nameless)
    with pytest.raises(StoreError, match=r"gpu_samples\.mem_clock_mhz"):
        store.append_columns("gpu_samples", _shared_polls(2, mem_clock_mhz=["fast", 1593]))
    with pytest.raises(StoreError, match=r"gpu_samples\.device must not be NULL \(2 of 4 rows"):
        store.append_columns(
            "gpu_samples",
            [
                ColumnBlock.of(b.values, b.constants, {**b.repeats, "device": (None, "cuda:1")})
                for b in _shared_polls(2)
            ],
        )
    store.flush()
    assert store.query("SELECT count(*) AS n FROM gpu_samples")["n"][0] == 6


def test_encoded_and_plain_appends_of_one_buffer_store_what_dict_rows_store(store_path: Path) -> None:
    plain = {
        "node": "n2",
        "source": "nvml",
        "ts_s": 9.0,
        "device": "cuda:0",
        "emulated": True,
        "power_w": 1.0,
    }
    first, second = _shared_polls(4, uuid=["GPU-a", "GPU-b"]), _shared_polls(2, 10.0, uuid=["GPU-a", "GPU-c"])
    query = 'SELECT node, ts_s, device, "index", uuid, power_w FROM gpu_samples_full ORDER BY ALL'
    with Store.open(store_path, buffer_rows=1_000) as store:  # one buffer: one INSERT of all three
        store.append_columns("gpu_samples", first)
        store.append("gpu_samples", [plain])
        store.append_columns("gpu_samples", second)
        store.flush()
        encoded, devices = (
            store.query(query),
            store.query("SELECT * EXCLUDE (since_s) FROM devices ORDER BY ALL"),
        )
    with Store.open(store_path.with_name("dicts.duckdb")) as store:
        for rows in (
            [r for b in first for r in b.to_rows()],
            [plain],
            [r for b in second for r in b.to_rows()],
        ):
            store.append("gpu_samples", rows)
        store.flush()
        assert encoded.equals(store.query(query))
        assert devices.equals(store.query("SELECT * EXCLUDE (since_s) FROM devices ORDER BY ALL"))
    assert len(encoded) == 13 and set(devices["uuid"]) == {"GPU-a", "GPU-b", "GPU-c"}


# -- packed values (ColumnBlock.floats): numeric columns built from one buffer ------------------------


def _unpacked(blocks: list[ColumnBlock]) -> list[ColumnBlock]:
    """The same polls without their packed values: what the writer builds from the lists alone."""
    return [dataclasses.replace(b, floats=None) for b in blocks]


def _sample_polls(*polls: dict[str, list]) -> list[ColumnBlock]:
    """One 2-GPU poll per mapping of metric values, through ``add_samples`` with repeats (as the
    NVML and dcgm-exporter sources make them: the metrics packed)."""
    result = SourceResult("nvml", 0.0)
    repeats = RepeatedColumns(steady=STEADY_SAMPLE_COLUMNS)
    for k, metrics in enumerate(polls):
        samples = [
            {
                "ts_s": 10.0 + k,
                "device": f"cuda:{i}",
                "index": i,
                "uuid": f"GPU-{i}",
                "emulated": False,
                **{name: values[i] for name, values in metrics.items()},
            }
            for i in range(2)
        ]
        result.add_samples("gpu_samples", samples, {"node": "n1", "source": "nvml"}, repeats)
    return result.columns["gpu_samples"]


def _stored(path: Path, blocks: list[ColumnBlock]) -> tuple[str, Any]:
    """What appending ``blocks`` to a fresh store gives: ("rows", every row and devices row, NULL
    as None) or ("error", the StoreError's message) -- and then nothing may be in the store."""
    with Store.open(path) as store:
        try:
            store.append_columns("gpu_samples", blocks)
        except StoreError as e:
            store.flush()
            assert store.query("SELECT count(*) AS n FROM gpu_samples")["n"][0] == 0
            return "error", str(e)
        store.flush()
        rows = store.query("SELECT * FROM gpu_samples_full ORDER BY ts_s, node, device")
        devices = store.query("SELECT * FROM devices ORDER BY ALL")
    return "rows", tuple(t.astype(object).where(t.notna(), None).to_dict("list") for t in (rows, devices))


_BASE = {
    "power_w": [100.5, 200.0],
    "gpu_util_pct": [10.0, 20.0],
    "temperature_c": [40, 41],  # ints in a DOUBLE column
    "sm_clock_mhz": [1980, 1410.0],  # an integral float in an INTEGER column
    "energy_mj": [2**60 + 1, 123_456_789],  # beyond float64's exact integers, in a BIGINT column
    "mem_used_bytes": [0, 1],  # ints 0 and 1 (not booleans) in a BIGINT column
    "lost": [False, False],  # a steady bool column: shared with the identity until it changes
}


def test_packed_polls_store_exactly_what_their_value_lists_store(tmp_path: Path) -> None:
    blocks = _sample_polls(
        _BASE,
        {**_BASE, "power_w": [None, 150.25], "gpu_util_pct": [float("nan"), 5.0], "lost": [False, True]},
        {**_BASE, "power_w": [None, None], "sm_clock_mhz": [None, 1500], "temperature_c": [39.5, None]},
        {**_BASE, "energy_mj": [2**60 + 2, None], "mem_used_bytes": [1, 0]},
    )
    assert all(b.floats is not None for b in blocks)  # None packed as NaN, ints and floats alike
    assert "lost" in blocks[1].values  # the bool column that changed: packed too, built from its lists
    packed = _stored(tmp_path / "packed.duckdb", blocks)
    assert packed == _stored(tmp_path / "lists.duckdb", _unpacked(blocks))
    assert packed[0] == "rows"
    rows = packed[1][0]
    assert rows["energy_mj"][:2] == [2**60 + 1, 123_456_789] and rows["energy_mj"][6] == 2**60 + 2
    assert rows["sm_clock_mhz"][:6] == [1980, 1410, 1980, 1410, None, 1500]
    assert [x is None for x in rows["power_w"]] == [False, False, True, False, True, True, False, False]
    assert rows["lost"] == [False, False, False, True, False, False, False, False]


@pytest.mark.parametrize(
    ("column", "values"),
    [
        ("sm_clock_mhz", [1.5, 1410]),  # a fraction in an INTEGER column
        ("sm_clock_mhz", [True, 1410]),  # a boolean in an INTEGER column (packs as 1.0)
        ("mem_used_bytes", [False, True]),
        ("sm_clock_mhz", [2**40, 1410]),  # out of INTEGER's range
        ("sm_clock_mhz", [1e300, 1410]),
        ("power_w", [True, 200.0]),  # a boolean in a DOUBLE column
        ("power_w", [2**60 + 1, 200.0]),  # an integer float64 cannot hold exactly
        ("power_w", [float("inf"), 200.0]),
        ("power_w", ["1.5", 200.0]),  # a numeric string: that poll is not packed
        ("energy_mj", [float("nan"), -(2**53)]),
    ],
)
def test_a_tricky_value_in_packed_polls_stores_or_fails_as_from_the_lists(
    tmp_path: Path, column: str, values: list
) -> None:
    blocks = _sample_polls(_BASE, {**_BASE, column: values}, _BASE)
    assert blocks[0].floats is not None and blocks[2].floats is not None
    assert (blocks[1].floats is None) == isinstance(values[0], str)
    packed = _stored(tmp_path / "packed.duckdb", blocks)
    assert packed == _stored(tmp_path / "lists.duckdb", _unpacked(blocks))
    if packed[0] == "error":
        assert f"gpu_samples.{column}" in packed[1]


@pytest.mark.parametrize("values", [[1.5, 1410], [None, 1410.25], [1980.0, 1410.5]])
def test_a_fraction_in_an_integer_column_is_refused_naming_the_column(tmp_path: Path, values: list) -> None:
    # Arrow would truncate it (1.5 -> 1); packed or from the lists, the store refuses it and writes nothing
    blocks = _sample_polls(_BASE, {**_BASE, "sm_clock_mhz": values}, _BASE)
    for path, polls in (("packed.duckdb", blocks), ("lists.duckdb", _unpacked(blocks))):
        kind, message = _stored(tmp_path / path, polls)
        assert kind == "error" and "gpu_samples.sm_clock_mhz" in message and "truncated" in message


def test_a_fraction_in_a_telemetry_integer_field_is_refused_not_truncated(tmp_path: Path) -> None:
    with Store.open(tmp_path / "t.duckdb") as store:
        block = ColumnBlock.of(
            {"start_s": [1.0, 2.0], "end_s": [1.5, 2.5], "batch_size": [4, 2.5]},
            {"node": "n1", "source": "worker-0", "worker": "w0", "phase": "decode"},
        )
        with pytest.raises(StoreError, match=r"iterations\.batch_size"):
            store.append_columns("iterations", [block])
        store.flush()
        assert store.query("SELECT count(*) AS n FROM iterations")["n"][0] == 0


def test_runs_of_packed_polls_of_unequal_sizes_and_shapes_keep_their_rows(tmp_path: Path) -> None:
    result = SourceResult("nvml", 0.0)
    for k, gpus in enumerate([2, 1, 3, 3]):  # a GPU missing from a poll, then a third one
        samples = [
            {"ts_s": float(k), "device": f"cuda:{i}", "power_w": 10.0 * k + i, "sm_clock_mhz": 1000 + i}
            for i in range(gpus)
        ]
        if k == 3:
            samples = [{**s, "mem_used_bytes": 5 << 30} for s in samples]  # another shape: a run of its own
        result.add_columns(
            "gpu_samples",
            {name: [s[name] for s in samples] for name in samples[0] if name != "device"},
            {"node": "n1", "source": "nvml", "emulated": False},
            {"device": [s["device"] for s in samples]},
            packed=True,
        )
    blocks = result.columns["gpu_samples"]
    assert [b.n for b in blocks] == [2, 1, 3, 3] and all(b.floats is not None for b in blocks)
    packed = _stored(tmp_path / "packed.duckdb", blocks)
    assert packed == _stored(tmp_path / "lists.duckdb", _unpacked(blocks))
    assert packed[1][0]["power_w"] == [0.0, 1.0, 10.0, 20.0, 21.0, 22.0, 30.0, 31.0, 32.0]


def test_only_blocks_whose_values_are_all_numbers_or_none_are_packed() -> None:
    assert ColumnBlock.of({"ts_s": [1.0], "power_w": [None]}, packed=True).floats is not None
    assert ColumnBlock.of({"ts_s": [1.0], "device": ["cuda:0"]}, packed=True).floats is None
    assert ColumnBlock.of({"ts_s": [1.0], "power_w": [2.5]}).floats is None  # not asked to
    block = ColumnBlock.of({"ts_s": [1.0, 2.0], "power_w": [None, 3]}, packed=True)
    assert block.values["power_w"] == [None, 3]  # the lists stay as given


def test_the_writer_builds_numeric_columns_from_the_packed_values_and_the_rest_from_lists() -> None:
    block = ColumnBlock.of({"ts_s": [1.0, 2.0], "sm_clock_mhz": [7, 8], "lost": [True, False]}, packed=True)
    # packed values that differ from the lists show which the writer read
    other = dataclasses.replace(block, floats=struct.pack("6d", 5.0, 6.0, 70.0, float("nan"), 1.0, 0.0))
    types = {"ts_s": pa.float64(), "sm_clock_mhz": pa.int32(), "lost": pa.bool_()}
    built = build_columns([other, other], types)
    assert built["ts_s"].to_pylist() == [5.0, 6.0, 5.0, 6.0]
    assert (
        built["sm_clock_mhz"].to_pylist() == [70, None, 70, None] and built["sm_clock_mhz"].type == pa.int32()
    )
    assert built["lost"].to_pylist() == [True, False, True, False]  # a bool column: from its lists
    assert build_columns([block], types)["sm_clock_mhz"].to_pylist() == [7, 8]


def test_a_boolean_among_an_integer_columns_packed_values_sends_it_to_its_lists() -> None:
    def polls(odd: object) -> list[ColumnBlock]:  # 20 rows, one odd value packed as 1.0
        return [
            ColumnBlock.of(
                {"ts_s": [float(k)] * 2, "sm_clock_mhz": [odd if k == 3 else 1000 + k, 7]}, packed=True
            )
            for k in range(10)
        ]

    types = {"ts_s": pa.float64(), "sm_clock_mhz": pa.int32()}
    assert build_columns(polls(1), types)["sm_clock_mhz"].to_pylist()[6:8] == [1, 7]
    with pytest.raises(pa.ArrowTypeError, match="bool"):  # built from the lists, as without packing
        build_columns(polls(True), types)


def _packed(block: ColumnBlock) -> dict[str, bytes]:
    """A block's packed values per column (rows read in another key order pack them in that order)."""
    size = 8 * block.n
    return {name: block.floats[j * size : (j + 1) * size] for j, name in enumerate(block.keys)}  # type: ignore[index]


def test_a_block_of_rows_is_what_split_and_of_make_of_the_transposed_rows() -> None:
    # the same polls through both, poll after poll: the same block and columns set apart, and a
    # new shared object exactly where split makes one (a value or its type changed, a key set changed)
    from collector.store.columns import transpose
    from collector.store.devices import IDENTITY_COLUMNS

    def poll(k: int, **changes: object) -> list[dict]:
        rows = [
            {
                "ts_s": float(k),
                "device": f"cuda:{i}",
                "index": i,
                "power_limit_w": 300.0,
                "power_w": 1.0 + k,
                "uptime_s": 2.0 * k,
            }
            for i in range(2)
        ]
        for name, value in changes.items():
            for row in rows:
                if value is ...:
                    del row[name]
                else:
                    row[name] = value
        return rows

    polls = [
        poll(0),
        poll(1),
        poll(2, index=1),  # the same value in both rows
        poll(3, index=1.0),  # equal, another type
        poll(4, index=True),
        poll(5, power_limit_w=300),  # a steady column: equal, another type (then per poll)
        poll(6),
        poll(7, uuid=None),  # a key added
        poll(8, uuid="GPU-a"),
        poll(9, uuid="GPU-a"),
        poll(10, power_w=...),  # a value column dropped
        poll(10, uptime_s=...),  # ... and one set apart
        poll(11),
        [dict(reversed(r.items())) for r in poll(12)],  # another key order
        poll(13)[:1],  # one row fewer
        poll(14),
    ]
    reordered = next(k for k, rows in enumerate(polls) if next(iter(rows[0])) != "ts_s")
    fast, slow = RepeatedColumns(steady=["power_limit_w"]), RepeatedColumns(steady=["power_limit_w"])
    last: list[Any] = [None, None]
    for k, rows in enumerate(polls):
        owners = {"worker": [f"w{i % 2}" for i in range(len(rows))]}
        if k == 9:
            owners["worker"] = ["w0", 7]  # an owner that is no string
        constants = {"node": "n1"}
        block, apart = fast.block(rows, IDENTITY_COLUMNS, owners, constants, apart=("uptime_s", "lag_s"))
        columns = {**transpose(rows), **owners}
        want_apart = {n: list(columns.pop(n)) for n in ("uptime_s", "lag_s") if n in columns}
        values, shared = slow.split(columns, IDENTITY_COLUMNS)
        want = ColumnBlock.of(values, constants, shared, packed=True)
        assert block.to_rows() == want.to_rows() and _packed(block) == _packed(want), k
        assert set(block.keys) == set(want.keys) and {n: list(v) for n, v in apart.items()} == want_apart, k
        types = [{n: list(map(type, v)) for n, v in (b.values | b.repeats).items()} for b in (block, want)]
        assert types[0] == types[1], k
        if k == reordered:  # the same keys in another order: split makes a new, equal object
            assert block.repeats is last[0] and want.repeats == last[1]
        else:
            assert (block.repeats is last[0]) == (want.repeats is last[1]), k  # shared where split shares
        last = [block.repeats, want.repeats]
        if k == 0:  # another caller of the same repeats in between: the next poll goes through split
            fast.share({"device": ["elsewhere"]})
            slow.share({"device": ["elsewhere"]})
    again = polls[-1]  # the last poll's key set and identity, with a constant that is a column too
    with pytest.raises(ValueError, match=r"\['ts_s'\] given twice"):
        fast.block(again, IDENTITY_COLUMNS, owners, {"node": "n1", "ts_s": 0.0}, apart=("uptime_s", "lag_s"))
