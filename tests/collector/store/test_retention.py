"""10 s rollups and retention on synthetic samples: averages, maxima, whole buckets, idempotency."""

from __future__ import annotations

import pytest

from collector.store import RetentionPolicy, Store, StoreError, apply_retention, rollup
from tests.collector.store.conftest import sample

DAY = 86_400.0
T0 = 1_764_000_000.0  # a multiple of 10


def _fill(store: Store, start: float, seconds: float, device: str = "cuda:0", node: str = "n1") -> None:
    """100 ms samples: power_w = 100 + i (i = sample number), sm_active 50, energy += 10 per sample."""
    n = int(seconds * 10)
    store.append_gpu_samples(
        [
            sample(
                start + i / 10,
                device=device,
                power_w=100.0 + i,
                sm_active_pct=50.0 if i % 2 else None,  # half the samples lack it
                sm_clock_mhz=1000 + i,
                energy_mj=10 * i,
                lost=(i == 3),
            )
            for i in range(n)
        ],
        node=node,
        source="nvml",
    )


def test_rollup_folds_whole_buckets_and_deletes_those_raw_rows(store: Store) -> None:
    _fill(store, T0, 30)  # buckets T0, T0+10, T0+20; samples 0..299
    _fill(store, T0, 10, device="cuda:1")
    result = rollup(store, older_than_s=25, now_s=T0 + 50)  # cutoff: floor(T0+25) to 10 s = T0+20
    assert result.cutoff_s == T0 + 20
    assert (result.buckets_written, result.raw_rows_deleted) == (3, 300)
    roll = store.query("SELECT * FROM gpu_samples_10s_full ORDER BY device, bucket_start_s")
    assert roll[["device", "bucket_start_s", "samples"]].values.tolist() == [
        ["cuda:0", T0, 100],
        ["cuda:0", T0 + 10, 100],
        ["cuda:1", T0, 100],
    ]
    first = roll.iloc[0]
    assert first["avg_power_w"] == pytest.approx(100 + 49.5)  # mean of 100..199
    assert first["max_power_w"] == 199.0
    assert first["avg_sm_active_pct"] == 50.0  # NULLs are not zeros
    assert first["max_sm_clock_mhz"] == 1099
    assert (first["min_energy_mj"], first["max_energy_mj"]) == (0, 990)
    assert first["lost_samples"] == 1 and roll.iloc[1]["lost_samples"] == 0
    assert first["name"] == "NVIDIA H100 80GB HBM3" and not first["emulated"]
    assert roll.iloc[1]["avg_power_w"] == pytest.approx(249.5)
    remaining = store.query("SELECT min(ts_s) AS lo, count(*) AS n FROM gpu_samples")
    assert (remaining["lo"][0], remaining["n"][0]) == (pytest.approx(T0 + 20), 100)


def test_rollup_is_idempotent(store: Store) -> None:
    _fill(store, T0, 30)
    rollup(store, older_than_s=0, now_s=T0 + 30)
    before = store.query("SELECT * FROM gpu_samples_10s ORDER BY bucket_start_s")
    again = rollup(store, older_than_s=0, now_s=T0 + 30)
    assert (again.buckets_written, again.raw_rows_deleted) == (0, 0)
    after = store.query("SELECT * FROM gpu_samples_10s ORDER BY bucket_start_s")
    assert before.equals(after)


def test_late_raw_rows_merge_into_an_existing_bucket(store: Store) -> None:
    store.append_gpu_samples(
        [sample(T0 + i / 10, power_w=100.0) for i in range(50)], node="n1", source="nvml"
    )
    rollup(store, older_than_s=0, now_s=T0 + 10)
    # late rows for the same bucket (e.g. imported from another node's export of this device)
    store.append_gpu_samples(
        [sample(T0 + 5 + i / 10, power_w=200.0) for i in range(50)], node="n1", source="nvml"
    )
    result = rollup(store, older_than_s=0, now_s=T0 + 10)
    assert result.buckets_written == 1
    roll = store.query("SELECT samples, avg_power_w, max_power_w FROM gpu_samples_10s")
    assert roll.values.tolist() == [[100, 150.0, 200.0]]


def test_apply_retention_expires_old_rollups(store: Store) -> None:
    now = T0 + 400 * DAY
    _fill(store, T0, 10)  # 400 days old: rolled up, then expired
    _fill(store, now - 8 * DAY, 10)  # 8 days old: rolled up, kept
    _fill(store, now - 60, 10)  # fresh: stays raw
    result = apply_retention(store, RetentionPolicy(raw_days=7, rollup_days=365), now_s=now)
    assert (result.buckets_written, result.raw_rows_deleted, result.rollup_rows_deleted) == (2, 200, 1)
    assert store.query("SELECT bucket_start_s FROM gpu_samples_10s")["bucket_start_s"].tolist() == [
        now - 8 * DAY
    ]
    assert store.query("SELECT count(*) AS n FROM gpu_samples")["n"][0] == 100


def test_retention_arguments_are_checked() -> None:
    with pytest.raises(StoreError, match="raw_days must be a positive number of days"):
        RetentionPolicy(raw_days=0)
    with pytest.raises(StoreError, match=r"rollup_days .* must be >= raw_days"):
        RetentionPolicy(raw_days=30, rollup_days=7)


def test_rollup_argument_is_checked(store: Store) -> None:
    with pytest.raises(StoreError, match="older_than_s must be a non-negative number"):
        rollup(store, older_than_s=-1)


def test_rollup_keeps_gpus_sharing_a_device_spec_apart(store: Store) -> None:
    rows = [
        {
            "node": "n1",
            "source": "emulated",
            "ts_s": T0 + i / 10,
            "device": "emulated:h100-sxm",
            "kind": "emulated",
            "index": worker,
            "name": "H100 SXM (emulated)",
            "emulated": True,
            "power_w": 100.0 * (worker + 1),
        }
        for i in range(100)
        for worker in (0, 1)
    ]
    store.append("gpu_samples", rows)  # no "lost" column: NULL, counted as not lost
    assert rollup(store, older_than_s=0, now_s=T0 + 10).buckets_written == 2
    roll = store.query(
        'SELECT "index", samples, avg_power_w, kind, emulated FROM gpu_samples_10s_full ORDER BY 1'
    )
    assert roll.values.tolist() == [[0, 100, 100.0, "emulated", True], [1, 100, 200.0, "emulated", True]]


def test_apply_retention_drops_devices_rows_superseded_before_the_horizon(store: Store) -> None:
    now = T0 + 400 * DAY
    for ts, pod in ((T0, "a"), (T0 + DAY, "b"), (now - 10 * DAY, "c"), (now - 60, "d")):
        store.append_gpu_samples([sample(ts)], node="n1", source="dcgm", k8s={"k8s_pod": pod})
    result = apply_retention(store, RetentionPolicy(raw_days=7, rollup_days=365), now_s=now)
    assert result.device_rows_deleted == 1  # "a": "b" started before the horizon and covers it
    assert store.query("SELECT k8s_pod FROM devices ORDER BY since_s")["k8s_pod"].tolist() == ["b", "c", "d"]
    roll = store.query("SELECT k8s_pod FROM gpu_samples_10s_full ORDER BY bucket_start_s")
    assert roll["k8s_pod"].tolist() == ["c"]
    assert store.query("SELECT k8s_pod FROM gpu_samples_full")["k8s_pod"].tolist() == ["d"]
