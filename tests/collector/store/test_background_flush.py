"""The write buffer's background flush: rows all there, failures reported later and honestly,
duplicates exact while a flush is in flight, appends going on meanwhile, close waiting.

A flush is held in flight by holding the store's devices-registry lock: the flush takes it to work
out the ``devices`` rows of its wide samples, after inserting them and before its commit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from collector.store import FlushError, Store, StoreError
from serving.telemetry import SCHEMA, SCHEMA_VERSION
from tests.collector.store.conftest import sample


def _count(store: Store, table: str) -> int:
    return int(store.query(f"SELECT count(*) AS n FROM {table}")["n"][0])


def _gpus(store: Store, first_s: float, n: int, device: str = "cuda:0") -> int:
    """``n`` wide samples of ``device`` (its devices row is due with the first of them)."""
    samples = [sample(first_s + i, device, power_w=100.0 + i) for i in range(n)]
    return store.append_gpu_samples(samples, node="n1", source="nvml")


def _hosts(store: Store, first_s: float, n: int) -> int:
    return store.append("host_samples", [{"node": "n1", "ts_s": first_s + i, "pid": 1} for i in range(n)])


def _batch(seq: int) -> dict[str, Any]:
    """A telemetry batch of one control event: 2 rows (control_events, telemetry_batches)."""
    event = {"type": "control", "ts_s": 1.0 + seq, "action": "tick"}
    return {
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "source": "router",
        "seq": seq,
        "sent_s": 1.0 + seq,
        "events": [event],
    }


def _unique_messages(store: Store) -> None:
    """Make ingest_errors refuse a second row with the same message: a write DuckDB refuses."""
    with store.transaction() as con:
        con.execute("CREATE UNIQUE INDEX one_message ON ingest_errors(message)")


@contextmanager
def _flush_held(store: Store) -> Iterator[None]:
    """While inside, a background flush with wide samples cannot commit."""
    lock = store._devices_lock  # the store's own lock, held as a flush in flight would find it
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _start(fn: Callable[[], Any]) -> tuple[threading.Thread, threading.Event, list[Any]]:
    """``fn`` on a thread; the event is set, and the list holds its result, when it returns."""
    done, out = threading.Event(), []

    def run() -> None:
        out.append(fn())
        done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, done, out


def test_rows_of_background_flushes_are_all_there_after_flush(store_path: Path) -> None:
    with Store.open(store_path, buffer_rows=50) as store:
        for k in range(20):  # 40 rows an iteration: a background flush every other one or so
            _gpus(store, 100.0 * k, 30, device=f"cuda:{k % 4}")
            _hosts(store, 100.0 * k, 10)
        store.append_telemetry_batches([_batch(s) for s in range(5)], "n1")
        store.flush()
        assert (_count(store, "gpu_samples"), _count(store, "host_samples")) == (600, 200)
        assert (_count(store, "telemetry_batches"), _count(store, "control_events")) == (5, 5)
        assert _count(store, "devices") == 4  # one per GPU, written by whichever flush first saw it
    with Store.open(store_path) as store:  # committed: there after reopening
        assert _count(store, "gpu_samples") == 600


def test_a_failed_background_flush_surfaces_at_the_next_flush_and_writes_nothing_of_its_batch(
    store_path: Path,
) -> None:
    with Store.open(store_path, buffer_rows=10) as store:
        _unique_messages(store)
        _gpus(store, 0.0, 5, device="cuda:7")  # a new GPU: its devices row goes with this flush
        store.record_ingest_error("n1", "src", "kind", "the same message")
        store.record_ingest_error("n1", "src", "kind", "the same message")
        _hosts(store, 0.0, 3)  # 10 rows: due, handed to a background flush, which fails
        _hosts(store, 10.0, 4)  # later rows (buffered)
        with pytest.raises(FlushError, match=r"background flush of 10 rows .*nothing of it written") as e:
            store.flush()
        assert e.value.rows == 10
        assert set(e.value.tables) == {"gpu_samples", "ingest_errors", "host_samples"}
        assert "Duplicate key" in str(e.value) or "constraint" in str(e.value).lower()
        assert (_count(store, "gpu_samples"), _count(store, "devices")) == (0, 0)
        assert _count(store, "ingest_errors") == 0
        assert _count(store, "host_samples") == 4  # the rows buffered after it went in
        store.flush()  # reported once
        # the registry forgot the devices row that was not written: cuda:7's next samples add it
        _gpus(store, 20.0, 10, device="cuda:7")
        store.flush()
        assert (_count(store, "gpu_samples"), _count(store, "devices")) == (10, 1)


def test_a_due_append_after_a_failed_flush_raises_it_and_takes_nothing_until_called_again(
    store_path: Path,
) -> None:
    with Store.open(store_path, buffer_rows=3) as store:
        _unique_messages(store)
        store.record_ingest_error("n1", "src", "kind", "twice")
        store.record_ingest_error("n1", "src", "kind", "twice")
        _hosts(store, 0.0, 1)  # due: the failing flush is in flight or done
        with pytest.raises(FlushError, match="3 rows to ingest_errors, host_samples"):
            _hosts(store, 10.0, 3)  # due again: waits for it, and reports it
        assert _hosts(store, 10.0, 3) == 3  # called again: taken
        store.flush()
        assert store.query("SELECT ts_s FROM host_samples")["ts_s"].tolist() == [10.0, 11.0, 12.0]


def test_without_a_buffer_a_failing_write_raises_at_the_append_itself(store: Store) -> None:
    _unique_messages(store)
    store.record_ingest_error("n1", "src", "kind", "twice")
    with pytest.raises(StoreError, match="writing 1 rows to ingest_errors failed") as e:
        store.record_ingest_error("n1", "src", "kind", "twice")
    assert not isinstance(e.value, FlushError)
    store.flush()
    assert _count(store, "ingest_errors") == 1


def test_a_batch_read_again_while_its_first_copy_is_in_flight_is_a_duplicate(store_path: Path) -> None:
    with Store.open(store_path, buffer_rows=6) as store:
        with _flush_held(store):
            assert not store.append_telemetry_batch(_batch(0), "n1").duplicate
            _gpus(store, 0.0, 4)  # 6 rows: the flush of batch 0 starts and is held before its commit
            again, done, out = _start(lambda: store.append_telemetry_batch(_batch(0), "n1"))
            # whether batch 0 is stored depends on how its flush ends: the check waits for it
            assert not done.wait(0.2)
        again.join()
        assert out[0].duplicate
        store.flush()
        assert (_count(store, "telemetry_batches"), _count(store, "control_events")) == (1, 1)


def test_a_batch_whose_first_copy_failed_in_flight_is_stored_when_read_again(store_path: Path) -> None:
    with Store.open(store_path, buffer_rows=5) as store:
        _unique_messages(store)
        store.append_telemetry_batch(_batch(0), "n1")
        store.record_ingest_error("n1", "src", "kind", "twice")
        store.record_ingest_error("n1", "src", "kind", "twice")
        _hosts(store, 0.0, 1)  # due: the flush holding batch 0 fails
        assert not store.append_telemetry_batch(_batch(0), "n1").duplicate
        with pytest.raises(FlushError):
            store.flush()
        assert (_count(store, "telemetry_batches"), _count(store, "control_events")) == (1, 1)


def test_appends_go_on_during_a_slow_flush_and_close_waits_for_it(store_path: Path) -> None:
    store = Store.open(store_path, buffer_rows=10)
    with _flush_held(store):
        _gpus(store, 0.0, 10)  # due: the flush starts and is held before its commit
        for k in range(9):  # the writer goes on converting and buffering meanwhile
            assert _hosts(store, float(k), 1) == 1
        closer, closed, _ = _start(store.close)
        assert not closed.wait(0.2)  # close waits for the flush in flight
    closer.join()
    with Store.open(store_path) as again:
        assert (_count(again, "gpu_samples"), _count(again, "host_samples")) == (10, 9)
        assert _count(again, "devices") == 1


def test_reads_and_checkpoint_wait_for_the_flush_in_flight(store_path: Path) -> None:
    with Store.open(store_path, buffer_rows=8) as store:
        with _flush_held(store):
            _gpus(store, 0.0, 8)
            reader, read, out = _start(lambda: _count(store, "gpu_samples"))
            assert not read.wait(0.2)
        reader.join()
        assert out == [8]  # the read saw the flush that began before it
        assert len(store.latest_per_device()) == 1
        _gpus(store, 10.0, 8)
        store.checkpoint()
        assert _count(store, "gpu_samples") == 16


def test_flush_without_waiting_hands_the_buffer_on_and_the_next_flush_reports_its_failure(
    store_path: Path,
) -> None:
    with Store.open(store_path, buffer_rows=100) as store:
        _unique_messages(store)
        with _flush_held(store):
            _gpus(store, 0.0, 5)
            store.flush(wait=False)  # returns while the flush is held before its commit
            assert _hosts(store, 0.0, 2) == 2
        assert _count(store, "gpu_samples") == 5  # the read waits for it
        store.record_ingest_error("n1", "src", "kind", "twice")
        store.record_ingest_error("n1", "src", "kind", "twice")
        store.flush(wait=False)  # the 2 host rows and the 2 refused ones: fails in the background
        _hosts(store, 10.0, 1)
        with pytest.raises(FlushError, match="background flush of 4 rows to host_samples, ingest_errors"):
            store.flush()
        assert (_count(store, "host_samples"), _count(store, "ingest_errors")) == (1, 0)
