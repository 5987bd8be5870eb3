"""Device attributes kept once per change in ``devices`` and joined back by time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from collector.store import Store, StoreError
from tests.collector.store.conftest import sample


def _count(store: Store, table: str) -> int:
    return int(store.query(f"SELECT count(*) AS n FROM {table}")["n"][0])


def dcgm_row(ts_s: float, pod: str | None, gpu: int = 0, **extra: Any) -> dict[str, Any]:
    """A wide gpu_samples row as the dcgm source makes it (attributes and k8s labels on it)."""
    return {
        "node": "n1",
        "source": "dcgm:http://n1:9400/metrics",
        "ts_s": ts_s,
        "device": f"cuda:{gpu}",
        "kind": "cuda",
        "index": gpu,
        "uuid": f"GPU-{gpu}",
        "name": "NVIDIA H100 80GB HBM3",
        "emulated": False,
        "power_w": 300.0 + ts_s,
        "k8s_pod": pod,
        "k8s_namespace": "llm" if pod else None,
        "k8s_container": "vllm" if pod else None,
        **extra,
    }


def _pods(store: Store, gpu: int = 0) -> list[tuple[float, str | None]]:
    df = store.query(
        "SELECT ts_s, k8s_pod FROM gpu_samples_full WHERE device = ? ORDER BY ts_s", [f"cuda:{gpu}"]
    )
    return [(t, None if p is None or p != p else p) for t, p in df.itertuples(index=False)]


def test_a_pod_change_mid_run_adds_a_devices_row_and_the_view_follows_it(store: Store) -> None:
    for second in range(10):  # one append per collector flush
        store.append("gpu_samples", [dcgm_row(second, "vllm-0" if second < 5 else "vllm-1")])
    store.append("gpu_samples", [dcgm_row(t, None, gpu=1) for t in range(10)])
    store.flush()
    devices = store.query(
        "SELECT device, since_s, k8s_pod, k8s_namespace FROM devices ORDER BY device, since_s"
    )
    assert devices.values.tolist()[:2] == [["cuda:0", 0.0, "vllm-0", "llm"], ["cuda:0", 5.0, "vllm-1", "llm"]]
    assert len(devices) == 3  # cuda:1 once, without labels
    assert _pods(store) == [(float(t), "vllm-0" if t < 5 else "vllm-1") for t in range(10)]
    assert _pods(store, gpu=1) == [(float(t), None) for t in range(10)]
    full = store.query("SELECT DISTINCT kind, uuid, name FROM gpu_samples_full WHERE device = 'cuda:0'")
    assert full.values.tolist() == [["cuda", "GPU-0", "NVIDIA H100 80GB HBM3"]]
    assert _count(store, "gpu_samples") == 20


def test_changes_inside_one_batch_each_get_a_row_in_time_order(store: Store) -> None:
    pods = {0: "a", 1: "a", 2: "b", 3: "b", 4: "a", 5: "a"}
    rows = [dcgm_row(float(t), pod) for t, pod in reversed(pods.items())]  # newest first
    store.append("gpu_samples", rows)
    store.flush()
    since = store.query("SELECT since_s, k8s_pod FROM devices ORDER BY since_s").values.tolist()
    assert since == [[0.0, "a"], [2.0, "b"], [4.0, "a"]]
    assert _pods(store) == [(float(t), pod) for t, pod in pods.items()]


def test_emulated_gpus_sharing_a_spec_stay_apart_and_emulated_is_on_every_sample(store: Store) -> None:
    for t in range(5):
        store.append(
            "gpu_samples",
            [
                {
                    "node": "n1",
                    "source": "emulated",
                    "ts_s": float(t),
                    "device": "emulated:h100-sxm",
                    "kind": "emulated",
                    "index": worker,
                    "uuid": None,
                    "name": "H100 SXM (emulated)",
                    "emulated": True,
                    "power_w": 100.0 * (worker + 1),
                }
                for worker in (0, 1)
            ],
        )
    store.flush()
    assert store.query("SELECT count(*) AS n, count_if(emulated) AS e FROM gpu_samples").values.tolist() == [
        [10, 10]
    ]
    assert _count(store, "devices") == 2
    latest = store.latest_per_device()
    assert latest[["index", "kind", "emulated", "power_w"]].values.tolist() == [
        [0, "emulated", True, 100.0],
        [1, "emulated", True, 200.0],
    ]


def test_unchanged_attributes_add_no_rows_even_after_reopening(store_path: Path) -> None:
    with Store.open(store_path) as store:
        store.append_gpu_samples([sample(float(t)) for t in range(5)], node="n1", source="nvml")
        store.append_gpu_samples([sample(float(t)) for t in range(5, 10)], node="n1", source="nvml")
        store.flush()
        assert _count(store, "devices") == 1
    with Store.open(store_path) as store:  # the writer's copy is loaded from the table
        store.append_gpu_samples([sample(10.0)], node="n1", source="nvml")
        store.append_gpu_samples(
            [sample(11.0)], node="n1", source="nvml", k8s={"k8s_pod": "p", "k8s_namespace": "ns"}
        )
        store.flush()
        devices = store.query("SELECT since_s, k8s_pod FROM devices ORDER BY since_s")
        assert devices["since_s"].tolist() == [0.0, 11.0]
        assert devices["k8s_pod"].isna().tolist() == [True, False] and devices["k8s_pod"][1] == "p"


def test_samples_without_attribute_columns_add_no_devices_rows(store: Store) -> None:
    store.append(
        "gpu_samples", [{"node": "n", "source": "s", "ts_s": 1.0, "device": "cuda:0", "emulated": False}]
    )
    store.flush()
    assert (_count(store, "gpu_samples"), _count(store, "devices")) == (1, 0)
    assert store.query("SELECT kind FROM gpu_samples_full")["kind"].isna().all()


def test_samples_and_their_devices_rows_are_buffered_and_written_together(store_path: Path) -> None:
    with Store.open(store_path, buffer_rows=10) as store:
        store.append("gpu_samples", [dcgm_row(float(t), "a") for t in range(4)])
        assert (_count(store, "gpu_samples"), _count(store, "devices")) == (0, 0)
        store.append("gpu_samples", [dcgm_row(float(t), "b") for t in range(4, 10)])  # 10 pending
        assert (_count(store, "gpu_samples"), _count(store, "devices")) == (10, 2)


def test_devices_rows_removed_by_sql_are_written_again(store: Store) -> None:
    store.append("gpu_samples", [dcgm_row(0.0, "a")])
    with store.transaction() as con:
        con.execute("DELETE FROM devices")
    store.append("gpu_samples", [dcgm_row(1.0, "a")])
    store.flush()
    assert store.query("SELECT since_s FROM devices")["since_s"].tolist() == [1.0]


def test_a_direct_devices_append_is_known_to_the_writer(store: Store) -> None:
    row = dcgm_row(0.0, "a")
    store.append("devices", [{**{k: row[k] for k in row if k not in ("ts_s", "power_w")}, "since_s": -5.0}])
    store.append("gpu_samples", [row])
    store.flush()
    assert store.query("SELECT since_s FROM devices")["since_s"].tolist() == [-5.0]


def test_a_late_sample_is_compared_with_the_attributes_then_in_effect(store: Store) -> None:
    store.append("gpu_samples", [dcgm_row(0.0, "a"), dcgm_row(10.0, "b")])
    store.append("gpu_samples", [dcgm_row(5.0, "a")])  # late, matches what was in effect: no row
    store.flush()
    assert _count(store, "devices") == 2
    store.append("gpu_samples", [dcgm_row(-5.0, "a")])  # older than anything known: a row
    store.flush()
    assert store.query("SELECT since_s FROM devices ORDER BY since_s")["since_s"].tolist() == [
        -5.0,
        0.0,
        10.0,
    ]
    assert _pods(store) == [(-5.0, "a"), (0.0, "a"), (5.0, "a"), (10.0, "b")]


def test_bad_wide_input_is_refused_and_nothing_is_written(store: Store) -> None:
    with pytest.raises(StoreError, match=r"gpu_samples: unknown column\(s\) 'k8s_node'"):
        store.append("gpu_samples", [dcgm_row(0.0, "a", k8s_node="x")])
    with pytest.raises(StoreError, match=r"gpu_samples\.emulated must not be NULL"):
        store.append("gpu_samples", [dcgm_row(0.0, "a", emulated=None)])
    with pytest.raises(StoreError, match=r"gpu_samples\.kind"):
        store.append("gpu_samples", [dcgm_row(0.0, "a", kind=["cuda"])])
    store.flush()
    assert (_count(store, "gpu_samples"), _count(store, "devices")) == (0, 0)
    store.append("gpu_samples", [dcgm_row(0.0, "a")])  # the refused rows left no trace in the cache
    store.flush()
    assert _count(store, "devices") == 1


def test_a_failed_write_forgets_the_devices_rows_it_discarded(store_path: Path) -> None:
    with Store.open(store_path, buffer_rows=100) as store:
        # make the next gpu_samples INSERT fail (not through transaction(), which reloads devices)
        with store.reader() as cur:
            cur.execute("ALTER TABLE gpu_sample_rows ADD COLUMN required INTEGER")
            cur.execute("ALTER TABLE gpu_sample_rows ALTER COLUMN required SET NOT NULL")
        store.append("gpu_samples", [dcgm_row(0.0, "a")])
        with pytest.raises(StoreError, match="nothing written"):
            store.flush()
        with store.reader() as cur:
            cur.execute("ALTER TABLE gpu_sample_rows DROP COLUMN required")
        store.append("gpu_samples", [dcgm_row(1.0, "a")])
        store.flush()
        assert store.query("SELECT since_s FROM devices")["since_s"].tolist() == [1.0]
        # the GPU's key, written and rolled back with the failed flush, was assigned again, once
        assert store.query("SELECT gpu_key FROM gpu_keys")["gpu_key"].tolist() == [0]
        assert store.query("SELECT ts_s FROM gpu_samples")["ts_s"].tolist() == [1.0]


@pytest.mark.parametrize("seconds", [10, 400])  # 80 rows: row by row; 3,200: an Arrow group-by
def test_small_and_large_batches_find_the_same_changes(store: Store, seconds: int) -> None:
    def pod(gpu: int, t: int) -> str | None:
        if gpu == 0:  # a -> b -> a
            return "b" if seconds // 3 <= t < 2 * seconds // 3 else "a"
        return "c" if gpu == 1 else None  # constant, and unlabelled

    rows = [dcgm_row(float(t), pod(gpu, t), gpu=gpu) for t in range(seconds) for gpu in range(8)]
    store.append("gpu_samples", rows[::-1])  # newest first: the order in the batch does not matter
    store.flush()
    got = store.query("SELECT device, since_s, k8s_pod FROM devices ORDER BY device, since_s")
    third = float(seconds // 3)
    assert got.values.tolist()[:4] == [
        ["cuda:0", 0.0, "a"],
        ["cuda:0", third, "b"],
        ["cuda:0", 2 * third, "a"],
        ["cuda:1", 0.0, "c"],
    ]
    assert len(got) == 3 + 7
    assert _pods(store)[int(third) - 1 : int(third) + 1] == [(third - 1, "a"), (third, "b")]
