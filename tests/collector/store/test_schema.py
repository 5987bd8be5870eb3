"""Schema migrations: fresh file, older file, newer file, foreign file, failed step, locking."""

from __future__ import annotations

import signal
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from collector.store import LATEST_VERSION, MIGRATIONS, Migration, Store, StoreError, StoreLockedError
from collector.store.schema import apply_migrations, current_version
from collector.store.tables import TABLES
from tests.collector.store.conftest import spawn_python, wait_for_line


def _tables(path: Path) -> set[str]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    finally:
        con.close()


def test_migrations_are_numbered_consecutively_from_one() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
    assert LATEST_VERSION == MIGRATIONS[-1].version >= 2
    assert all(m.description for m in MIGRATIONS)


def test_fresh_file_gets_every_table(store_path: Path) -> None:
    with Store.open(store_path) as store:
        assert store.schema_version == LATEST_VERSION
        versions = store.query("SELECT version FROM schema_version ORDER BY version")["version"].tolist()
        assert versions == [m.version for m in MIGRATIONS]
    assert set(TABLES) | {"schema_version", "request_latency"} <= _tables(store_path)


def test_reopen_applies_nothing(store_path: Path) -> None:
    Store.open(store_path).close()
    con = duckdb.connect(str(store_path))
    assert apply_migrations(con) == []
    con.close()


def test_older_file_is_migrated(store_path: Path) -> None:
    con = duckdb.connect(str(store_path))
    assert apply_migrations(con, target_version=1) == [1]
    con.execute(
        "INSERT INTO gpu_samples (node, source, ts_s, device, emulated, power_w) "
        "VALUES ('n1', 'nvml', 1.0, 'cuda:0', false, 250.0)"
    )
    con.close()
    assert "requests" not in _tables(store_path)

    with Store.open(store_path) as store:
        assert store.schema_version == LATEST_VERSION
        assert store.query("SELECT power_w FROM gpu_samples")["power_w"].tolist() == [250.0]  # data kept
        store.append("requests", [{"node": "n1", "source": "router", "request_id": "r1", "arrival_s": 1.0}])
    assert set(TABLES) <= _tables(store_path)


def test_newer_file_is_refused_naming_both_versions(store_path: Path) -> None:
    Store.open(store_path).close()
    con = duckdb.connect(str(store_path))
    con.execute("INSERT INTO schema_version VALUES (99, 'from the future', 0)")
    con.close()
    with pytest.raises(StoreError) as err:
        Store.open(store_path)
    msg = str(err.value)
    assert "schema version 99" in msg and f"version {LATEST_VERSION}" in msg and "upgrade phaselens" in msg
    with pytest.raises(StoreError, match="schema version 99"):
        Store.open(store_path, read_only=True)


def test_foreign_duckdb_file_is_refused(store_path: Path) -> None:
    con = duckdb.connect(str(store_path))
    con.execute("CREATE TABLE accounts (id INTEGER)")
    con.close()
    with pytest.raises(StoreError, match=r"without a phaselens schema_version table \(it holds: accounts\)"):
        Store.open(store_path)


def test_failed_migration_leaves_the_file_at_its_version(store_path: Path) -> None:
    con = duckdb.connect(str(store_path))
    apply_migrations(con, target_version=1)
    broken = (*MIGRATIONS[:2], Migration(3, "broken step", "CREATE TABLE x (a INTEGER); SELEC nonsense;"))
    with pytest.raises(StoreError, match=r"(?s)failed at version 3 \(broken step\).*stays at version 1"):
        apply_migrations(con, migrations=broken)
    assert current_version(con) == 1
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert "iterations" not in tables and "x" not in tables  # step 2 rolled back with step 3
    con.close()


def test_read_only_open_does_not_migrate(store_path: Path) -> None:
    con = duckdb.connect(str(store_path))
    apply_migrations(con, target_version=1)
    con.close()
    with pytest.raises(StoreError, match="open it read-write once to migrate"):
        Store.open(store_path, read_only=True)
    with pytest.raises(StoreError, match="does not exist"):
        Store.open(store_path.with_name("absent.duckdb"), read_only=True)


def test_read_only_store_refuses_writes(store_path: Path) -> None:
    Store.open(store_path).close()
    with Store.open(store_path, read_only=True) as store:
        assert store.query("SELECT count(*) AS n FROM gpu_samples")["n"][0] == 0
        with pytest.raises(StoreError, match="opened read-only"):
            store.append("host_samples", [{"node": "n", "ts_s": 1.0, "pid": 1}])


def test_second_writer_in_another_process_gets_a_clear_error(store_path: Path) -> None:
    Store.open(store_path).close()
    child = spawn_python(
        "import sys, time\n"
        "from collector.store import Store\n"
        f"s = Store.open({str(store_path)!r})\n"
        "print('open', flush=True)\n"
        "time.sleep(60)\n"
    )
    try:
        wait_for_line(child, "open")
        with pytest.raises(StoreLockedError) as err:
            Store.open(store_path)
        msg = str(err.value)
        assert f"{store_path} is open by another phaselens collector (pid {child.pid}?)" in msg
        assert "DuckDB allows one writing process" in msg
        assert isinstance(err.value.__cause__, duckdb.IOException)
        with pytest.raises(StoreLockedError, match="even a read-only open"):
            Store.open(store_path, read_only=True)
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=10)
    Store.open(store_path).close()  # the lock died with the child


def _v5_file(path: Path) -> None:
    """A version-5 store holding raw samples and rollups of GPUs whose attributes vary over time."""
    con = duckdb.connect(str(path))
    assert apply_migrations(con, target_version=5) == [1, 2, 3, 4, 5]
    cols = (
        '(node, source, ts_s, device, kind, "index", uuid, name, emulated, power_w, k8s_pod, k8s_namespace)'
    )
    emu = ("emulated:h100-sxm", "emulated")
    rows = [
        # a dcgm GPU whose pod moves A -> B -> A, and a second one that never changes
        *[
            ("n1", "dcgm", t, "cuda:0", "cuda", 0, "GPU-0", "H100", False, 100.0 + t, pod, "llm")
            for t, pod in ((100.0, "a"), (101.0, "a"), (102.0, "b"), (103.0, "b"), (104.0, "a"))
        ],
        *[
            ("n1", "dcgm", t, "cuda:1", "cuda", 1, "GPU-1", "H100", False, 200.0 + t, None, None)
            for t in (100.0, 101.0)
        ],
        # two emulated GPUs sharing one device spec, told apart by index; one CPU without an index
        *[
            ("n1", "emulated", t, *emu, i, None, "H100", True, 50.0, None, None)
            for t in (1.0, 2.0)
            for i in (0, 1)
        ],
        ("n2", "cpu", 100.0, "cpu", "cpu", None, None, "cpu", False, None, None, None),
    ]
    con.executemany(f"INSERT INTO gpu_samples {cols} VALUES ({', '.join('?' * 12)})", rows)
    con.execute(
        'INSERT INTO gpu_samples_10s (node, source, device, bucket_start_s, kind, "index", uuid, name, '
        "emulated, samples, lost_samples, avg_power_w, k8s_pod, k8s_namespace) VALUES "
        "('n1', 'dcgm', 'cuda:0', 80.0, 'cuda', 0, 'GPU-0', 'H100', false, 100, 0, 310.5, 'old', 'llm'), "
        "('n1', 'dcgm', 'cuda:0', 90.0, 'cuda', 0, 'GPU-0', 'H100', false, 100, 2, 320.5, 'a', 'llm')"
    )
    con.close()


def test_version_5_file_with_data_migrates_losslessly(store_path: Path) -> None:
    _v5_file(store_path)
    con = duckdb.connect(str(store_path), read_only=True)
    order = 'ORDER BY node, source, device, "index", ts_s'
    raw_before = con.execute(f"SELECT * FROM gpu_samples {order}").df()
    roll_before = con.execute("SELECT * FROM gpu_samples_10s ORDER BY bucket_start_s").df()
    con.close()

    with Store.open(store_path) as store:
        assert store.schema_version == LATEST_VERSION
        raw_after = store.query(f"SELECT * FROM gpu_samples_full {order}")
        # version 8 appends the worker and role owning each GPU (none known for these samples)
        assert raw_after[["worker", "role"]].isna().all().all()
        raw_after = raw_after.drop(columns=["worker", "role"])
        assert raw_after.columns.tolist() == raw_before.columns.tolist()
        pd.testing.assert_frame_equal(raw_after, raw_before)
        roll_after = store.query("SELECT * FROM gpu_samples_10s_full ORDER BY bucket_start_s")
        roll_after = roll_after.drop(columns=["worker", "role"])
        pd.testing.assert_frame_equal(roll_after, roll_before)
        # the sample rows lost the attribute columns, but not index and emulated
        names = [c.name for c in store.columns("gpu_samples")]
        assert "index" in names and "emulated" in names
        assert {"kind", "uuid", "name", "k8s_pod", "k8s_namespace", "k8s_container"}.isdisjoint(names)
        devices = store.query(
            "SELECT device, \"index\", since_s, k8s_pod FROM devices WHERE device = 'cuda:0' ORDER BY since_s"
        )
        assert devices.values.tolist() == [
            ["cuda:0", 0, 80.0, "old"],
            ["cuda:0", 0, 90.0, "a"],
            ["cuda:0", 0, 102.0, "b"],
            ["cuda:0", 0, 104.0, "a"],
        ]
        assert int(store.query("SELECT count(*) AS n FROM devices")["n"][0]) == 4 + 1 + 2 + 1
        # the writer's copy of devices came from the migrated table: an unchanged GPU adds no row
        store.append(
            "gpu_samples",
            [
                {
                    "node": "n1",
                    "source": "dcgm",
                    "ts_s": 105.0,
                    "device": "cuda:1",
                    "kind": "cuda",
                    "index": 1,
                    "uuid": "GPU-1",
                    "name": "H100",
                    "emulated": False,
                }
            ],
        )
        store.flush()
        assert int(store.query("SELECT count(*) AS n FROM devices")["n"][0]) == 8
