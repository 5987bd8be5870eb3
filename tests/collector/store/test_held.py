"""Rows a flush could not write because the disk refused them: held, retried in order, bounded
(collector/store/held.py). A full disk is ``OSError(ENOSPC)`` injected at the store's write, or a
real 12 MB tmpfs where the test may mount one."""

from __future__ import annotations

import errno
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from collector.store import FlushError, Store, StoreError
from collector.store import flushing as store_module
from collector.store.held import write_failure_cause
from tests.collector.store.test_background_flush import _batch, _count, _gpus, _hosts


class Disk:
    """The store's write fails with ENOSPC (or ``error``) while ``full``."""

    def __init__(self) -> None:
        self.full = False
        self.error: BaseException = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Disk:
    d = Disk()
    insert = store_module._insert

    def full_disk_insert(con: Any, table: str, parts: list[Any]) -> None:
        if d.full:
            raise d.error
        insert(con, table, parts)

    monkeypatch.setattr(store_module, "_insert", full_disk_insert)
    return d


def test_a_flush_the_disk_refuses_is_held_and_written_first_once_space_returns(
    store_path: Path, disk: Disk
) -> None:
    with Store.open(store_path, buffer_rows=4) as store:
        disk.full = True
        store.append_telemetry_batch(_batch(0), "n1")
        _hosts(store, 0.0, 2)  # due: the background flush fails, held
        with pytest.raises(FlushError, match="held for the next flush") as e:
            store.flush(wait=False)
        assert (e.value.rows, e.value.held_rows) == (4, 4)
        assert store.write_failure == "no space left on device"
        store.append_telemetry_batch(_batch(1), "n1")  # due, but only flush() tries while failing
        assert store.held_rows == 6 and _count(store, "telemetry_batches") == 0
        assert store.append_telemetry_batch(_batch(0), "n1").duplicate  # held: not stored twice
        disk.full = False
        with pytest.raises(FlushError) as e:  # writes the held rows, then reports the last try
            store.flush()
        assert e.value.rows == e.value.held_rows  # held, not lost
        assert store.write_failure is None and store.held_rows == 0
        assert _count(store, "telemetry_batches") == 2 and _count(store, "host_samples") == 2
        assert store.take_held_drops() == []


def test_past_the_bound_the_oldest_sample_rows_are_dropped_never_telemetry(
    store_path: Path, disk: Disk
) -> None:
    with Store.open(store_path, buffer_rows=4, max_held_rows=16) as store:
        disk.full = True
        store.append_telemetry_batch(_batch(0), "n1")
        _hosts(store, 0.0, 3)
        with pytest.raises(FlushError):
            store.flush()
        for k in range(1, 5):  # 3 host rows a step, the oldest go past the bound
            _hosts(store, 10.0 * k, 3)
            store.append_telemetry_batch(_batch(k), "n1")
        drops = store.take_held_drops()
        assert store.held_rows <= 16
        assert {d.table for d in drops} == {"host_samples"}
        dropped = sum(d.rows for d in drops)
        assert min(d.from_s for d in drops) == 0.0 and all(
            d.cause == "no space left on device" for d in drops
        )
        disk.full = False
        store.flush()
        assert _count(store, "telemetry_batches") == 5  # every batch, in order
        assert _count(store, "host_samples") == 15 - dropped
        kept = store.query("SELECT min(ts_s) AS t FROM host_samples")["t"][0]
        assert kept > max(d.to_s for d in drops)  # the oldest went


def test_a_refused_row_is_still_discarded_not_held(store_path: Path, disk: Disk) -> None:
    with Store.open(store_path, buffer_rows=2) as store:
        disk.full, disk.error = True, duckdb.ConstraintException("Duplicate key")
        _hosts(store, 0.0, 2)
        with pytest.raises(FlushError) as e:
            store.flush()
        assert e.value.held_rows == 0 and store.write_failure is None and store.held_rows == 0


def test_what_counts_as_a_full_disk() -> None:
    assert write_failure_cause(OSError(errno.ENOSPC, "No space left on device")) == "no space left on device"
    wal = duckdb.TransactionException(
        'Failed to commit: Could not write file "x.wal": No space left on device'
    )
    assert write_failure_cause(StoreError("writing failed")) is None
    wrapped = StoreError("writing 3 rows failed")
    wrapped.__cause__ = wal
    assert write_failure_cause(wrapped) == "no space left on device"
    assert write_failure_cause(duckdb.ConstraintException("Duplicate key")) is None


@pytest.fixture
def tmpfs() -> Iterator[Path]:
    """A 12 MB tmpfs (skipped where mount is not permitted)."""
    where = Path(tempfile.mkdtemp(prefix="phaselens-held-"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(where)], capture_output=True, text=True
    )
    if os.geteuid() != 0 or done.returncode != 0:
        os.rmdir(where)
        pytest.skip(
            f"cannot mount a 12 MB tmpfs to fill (needs root with CAP_SYS_ADMIN): {done.stderr.strip()}"
        )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        os.rmdir(where)


def test_a_checkpoint_on_a_real_full_disk_invalidates_duckdb_and_the_store_opens_it_again(
    tmpfs: Path,
) -> None:
    filler = tmpfs / "filler"
    with Store.open(tmpfs / "s.duckdb", buffer_rows=4) as store:
        _gpus(store, 0.0, 3)
        _hosts(store, 0.0, 2)
        store.flush()  # committed (in the WAL): a checkpoint has work to write
        with filler.open("wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 16))
            except OSError:
                pass
        with pytest.raises(StoreError, match=r"checkpoint .* failed"):  # DuckDB invalidates the database
            store.checkpoint()
        assert store.write_failure == "no space left on device"
        filler.unlink()
        _hosts(store, 10.0, 2)
        store.flush()  # on the file opened again (its WAL replayed)
        store.checkpoint()
        assert store.write_failure is None
        assert (_count(store, "gpu_samples"), _count(store, "host_samples")) == (3, 4)
    with Store.open(tmpfs / "s.duckdb") as again:
        assert (_count(again, "gpu_samples"), _count(again, "host_samples")) == (3, 4)
