"""Appends (dict rows, Arrow, pandas, DeviceSample), validation errors, buffering and queries."""

from __future__ import annotations

import json
import math
import threading
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from collector.store import Store, StoreError
from tests.collector.store.conftest import sample


def _count(store: Store, table: str) -> int:
    return int(store.query(f"SELECT count(*) AS n FROM {table}")["n"][0])


def test_dict_rows_missing_keys_and_none_become_null(store: Store) -> None:
    n = store.append(
        "gpu_samples",
        [
            {
                "node": "n1",
                "source": "nvml",
                "ts_s": 1.0,
                "device": "cuda:0",
                "emulated": False,
                "power_w": 300,
            },
            {
                "node": "n1",
                "source": "nvml",
                "ts_s": 2.0,
                "device": "cuda:0",
                "emulated": False,
                "power_w": None,
            },
            {
                "node": "n1",
                "source": "nvml",
                "ts_s": 3.0,
                "device": "cuda:0",
                "emulated": False,
                "sm_clock_mhz": 1980,
            },
        ],
    )
    assert n == 3
    df = store.query("SELECT ts_s, power_w, sm_clock_mhz, gpu_util_pct FROM gpu_samples ORDER BY ts_s")
    assert df["power_w"].iloc[0] == 300.0 and df["power_w"].iloc[1:].isna().all()
    assert df["sm_clock_mhz"].isna().tolist() == [True, True, False]  # key only in the LAST row still kept
    assert df["gpu_util_pct"].isna().all()
    # NULL, not a string, for unsupported metrics
    assert store.query("SELECT typeof(power_w) AS t FROM gpu_samples LIMIT 1")["t"][0] == "DOUBLE"


def test_arrow_table_with_nulls_and_subset_of_columns(store: Store) -> None:
    data = pa.table(
        {
            "node": ["a", "a"],
            "ts_s": [10.0, 11.0],
            "pid": pa.array([7, 7], pa.int64()),
            "cpu_pct": pa.array([12.5, None]),
        }
    )
    assert store.append("host_samples", data) == 2
    df = store.query("SELECT * FROM host_samples ORDER BY ts_s")
    assert df["cpu_pct"].iloc[0] == 12.5 and math.isnan(df["cpu_pct"].iloc[1])
    assert df["rss_bytes"].isna().all() and df["worker"].isna().all()


def test_dataframe_with_nulls(store: Store) -> None:
    df = pd.DataFrame(
        {
            "node": ["a", "a", "a"],
            "endpoint": ["http://x:8000/metrics"] * 3,
            "ts_s": [1.0, 1.0, 2.0],
            "metric": ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_requests_running"],
            "labels": ['{"model_name":"m"}', "{}", '{"model_name":"m"}'],
            "value": [3.0, float("nan"), None],
        }
    )
    assert store.append("engine_metrics", df) == 3
    got = store.query(
        "SELECT metric, labels->>'model_name' AS model, value FROM engine_metrics ORDER BY ts_s, metric"
    )
    assert got["model"].tolist()[0] == "m" and got["model"].isna().tolist() == [False, True, False]
    assert got["value"].iloc[0] == 3.0 and got["value"].iloc[1:].isna().all()


def test_unknown_columns_are_named_and_nothing_is_written(store: Store) -> None:
    rows = [{"node": "a", "ts_s": 1.0, "pid": 1}, {"node": "a", "ts_s": 2.0, "pid": 1, "gpu_temp": 3, "x": 1}]
    with pytest.raises(StoreError, match=r"host_samples: unknown column\(s\) 'gpu_temp', 'x'; columns: node"):
        store.append("host_samples", rows)
    with pytest.raises(StoreError, match="unknown column"):
        store.append("host_samples", pa.table({"node": ["a"], "ts_s": [1.0], "pid": [1], "bogus": [1]}))
    with pytest.raises(StoreError, match="unknown column"):
        store.append("host_samples", pd.DataFrame({"node": ["a"], "ts_s": [1.0], "pid": [1], "bogus": [1]}))
    assert _count(store, "host_samples") == 0


def test_bad_values_are_refused_naming_the_column(store: Store) -> None:
    base = {"node": "n", "source": "nvml", "ts_s": 1.0, "device": "cuda:0", "emulated": False}
    with pytest.raises(StoreError, match=r"gpu_samples\.power_w"):
        store.append("gpu_samples", [{**base, "power_w": "N/A"}])
    with pytest.raises(StoreError, match=r"gpu_samples\.sm_clock_mhz: cannot store double as INTEGER"):
        store.append("gpu_samples", [{**base, "sm_clock_mhz": 1410.5}])  # never silently truncated
    with pytest.raises(StoreError, match=r"gpu_samples\.device must not be NULL \(1 of 1 rows are\)"):
        store.append("gpu_samples", [{**base, "device": None}])
    with pytest.raises(StoreError, match=r"gpu_samples\.power_w"):
        store.append("gpu_samples", pa.table({**{k: [v] for k, v in base.items()}, "power_w": ["N/A"]}))
    with pytest.raises(StoreError, match="unknown table 'nope'"):
        store.append("nope", [{"a": 1}])
    with pytest.raises(StoreError, match="rows must be a list of dicts"):
        store.append("host_samples", "node,ts_s")  # type: ignore[arg-type]
    assert _count(store, "gpu_samples") == 0
    store.append("gpu_samples", [{**base, "sm_clock_mhz": 1410.0}])  # integral float is fine
    assert store.query("SELECT sm_clock_mhz FROM gpu_samples")["sm_clock_mhz"][0] == 1410


def test_device_samples_round_trip(store: Store) -> None:
    s0 = sample(100.0, power_w=312.5, energy_mj=123_456_789_012, sm_clock_mhz=1980, clock_event_reasons=2**40)
    s1 = sample(100.0, device="cuda:1", lost=True)
    assert store.append_gpu_samples([s0, s1], node="n1", source="nvml") == 2
    assert store.append_gpu_samples([], node="n1", source="nvml") == 0
    store.append_gpu_samples(
        [sample(101.0, device="cuda:2")],
        node="n2",
        source="dcgm",
        k8s={"k8s_pod": "vllm-0", "k8s_namespace": "llm", "k8s_container": "engine"},
    )
    df = store.query("SELECT * FROM gpu_samples_full ORDER BY node, device")
    assert df.columns[:4].tolist() == ["node", "source", "ts_s", "device"]
    r0, r1, r2 = (df.iloc[i] for i in range(3))
    assert (r0["node"], r0["source"], r0["ts_s"], r0["index"], r0["name"]) == (
        "n1",
        "nvml",
        100.0,
        0,
        "NVIDIA H100 80GB HBM3",
    )
    assert (
        r0["power_w"] == 312.5 and r0["energy_mj"] == 123_456_789_012 and r0["clock_event_reasons"] == 2**40
    )
    assert not r0["emulated"] and not r0["lost"] and pd.isna(r0["gpu_util_pct"])
    assert r1["lost"] and pd.isna(r1["power_w"])
    assert (r2["k8s_pod"], r2["k8s_namespace"], r2["k8s_container"]) == ("vllm-0", "llm", "engine")
    assert pd.isna(r0["k8s_pod"])
    # the attributes live once per GPU in devices, not on the sample rows
    assert {"kind", "uuid", "name", "k8s_pod"}.isdisjoint(c.name for c in store.columns("gpu_samples"))
    assert _count(store, "devices") == 3


def test_json_columns_generated_ids_and_defaults(store: Store) -> None:
    store.append(
        "actions",
        [
            {
                "node": "n1",
                "ts_s": 5.0,
                "actor": "analytics",
                "action": "set_power_limit",
                "target": "cuda:0",
                "before": {"power_limit_w": 700},
                "after": {"power_limit_w": 560},
                "dry_run": True,
                "status": "planned",
            },
            {
                "action_id": "fixed-id",
                "node": "n1",
                "ts_s": 6.0,
                "actor": "operator",
                "action": "rollback",
                "dry_run": False,
                "status": "applied",
                "rolled_back": True,
            },
        ],
    )
    df = store.query("SELECT * FROM actions ORDER BY ts_s")
    assert len(df["action_id"][0]) == 32 and df["action_id"][1] == "fixed-id"
    assert df["rolled_back"].tolist() == [False, True]
    assert json.loads(df["after"][0]) == {"power_limit_w": 560} and df["before"].isna().tolist() == [
        False,
        True,
    ]
    assert store.query("SELECT after->>'power_limit_w' AS w FROM actions WHERE dry_run")["w"][0] == "560"
    with pytest.raises(StoreError, match="not JSON-serialisable"):
        store.append("actions", [{"node": "n", "ts_s": 1.0, "actor": "a", "action": "x", "before": {1, 2}}])


def test_range_filters_and_latest_per_device(store: Store) -> None:
    store.append_gpu_samples(
        [sample(float(t), device=f"cuda:{d}", power_w=100.0 * d + t) for t in range(10) for d in range(2)],
        node="n1",
        source="nvml",
    )
    store.append_gpu_samples([sample(5.0, power_w=1.0)], node="n2", source="nvml")
    assert len(store.range("gpu_samples", None, None)) == 21
    df = store.range("gpu_samples", 2, 5.0, device="cuda:1", node="n1")
    assert df["ts_s"].tolist() == [2.0, 3.0, 4.0] and set(df["device"]) == {"cuda:1"}
    aware = datetime.fromtimestamp(8, tz=UTC)
    assert store.range("gpu_samples", aware, None, node="n1", limit=3)["ts_s"].tolist() == [8.0, 8.0, 9.0]
    with pytest.raises(StoreError, match="naive datetime"):
        store.range("gpu_samples", datetime(2026, 1, 1), None)
    with pytest.raises(StoreError, match="no 'device' column"):
        store.range("requests", None, None, device="cuda:0")
    with pytest.raises(StoreError, match="limit must be a non-negative integer"):
        store.range("gpu_samples", None, None, limit=-1)

    latest = store.latest_per_device()
    assert list(zip(latest["node"], latest["device"], latest["ts_s"], strict=True)) == [
        (
            "n1",
            "cuda:0",
            9.0,
        ),
        ("n1", "cuda:1", 9.0),
        ("n2", "cuda:0", 5.0),
    ]
    assert latest["power_w"].tolist() == [9.0, 109.0, 1.0]
    assert len(store.latest_per_device(since_s=6.0)) == 2


def test_buffered_appends_are_written_on_flush_threshold_and_close(store_path: Path) -> None:
    rows = [{"node": "n", "ts_s": float(i), "pid": 1} for i in range(4)]
    store = Store.open(store_path, buffer_rows=10)
    store.append("host_samples", rows)
    assert _count(store, "host_samples") == 0  # buffered
    store.flush()
    assert _count(store, "host_samples") == 4
    store.append("host_samples", rows)
    store.append("host_samples", rows)
    assert _count(store, "host_samples") == 4
    store.append("host_samples", rows)  # 12 pending >= 10: written
    assert _count(store, "host_samples") == 16
    store.append("host_samples", rows)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="is closed"):
        store.query("SELECT 1")
    with Store.open(store_path) as again:
        assert _count(again, "host_samples") == 20


def test_reads_from_another_thread_while_writing(store: Store) -> None:
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                store.query("SELECT count(*) FROM gpu_samples")
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for k in range(20):
            store.append_gpu_samples([sample(k + i / 10) for i in range(10)], node="n", source="nvml")
    finally:
        stop.set()
        t.join()
    assert not errors
    assert _count(store, "gpu_samples") == 200


def test_query_errors_are_store_errors(store: Store) -> None:
    with pytest.raises(StoreError, match=r"query on .* failed"):
        store.query("SELECT nope FROM gpu_samples")
    assert store.query("SELECT ? + ? AS x", [1, 2])["x"][0] == 3


def test_nan_is_stored_as_null(store: Store) -> None:
    base = {"node": "n", "source": "nvml", "device": "cuda:0", "emulated": False}
    store.append(
        "gpu_samples", [{**base, "ts_s": 1.0, "power_w": float("nan")}, {**base, "ts_s": 2.0, "power_w": 5}]
    )
    store.append("gpu_samples", pd.DataFrame([{**base, "ts_s": 3.0, "power_w": float("nan")}]))
    got = store.query("SELECT count(*) AS n, count(power_w) AS measured, avg(power_w) AS w FROM gpu_samples")
    assert got.values.tolist() == [[3, 1, 5.0]]
