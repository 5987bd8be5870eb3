"""Schema migrations: fresh file, older file, newer file, foreign file, failed step, locking."""

from __future__ import annotations

import signal
from pathlib import Path

import duckdb
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
