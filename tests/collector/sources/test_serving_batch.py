"""The batched read of a serving stack (``GET /v1/collect``) over real HTTP against a real running
stack: every sample the per-worker path stores is stored by the batched path (same rows in real
DuckDB files), an older router without the endpoint is read per worker, and a worker killed
mid-run is a counted gap while the others' samples are still stored."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import duckdb
import httpx
import pytest

from collector.service import Collector, CollectorSettings
from collector.sources.base import SourceResult
from collector.sources.serving_batch import ServingStackSource
from collector.sources.serving_stack import ServingDevicesSource
from collector.store import Store
from serving.testing import Server, start_server, stop_server

WORKERS = 3


@pytest.fixture(scope="module")
def stack() -> Iterator[Server]:
    # a killed worker stays dead for the rest of the module (restart back-off of a minute)
    server = start_server(
        "--workers",
        str(WORKERS),
        "--device",
        "emulated:h100-sxm",
        "--emulate-shape",
        "llama-3.1-8b",
        "--kv-cache-mb",
        "8",
        "--restart-delay-s",
        "60",
    )
    yield server
    stop_server(server)


def wait_for(check: Callable[[], object], timeout_s: float = 60.0) -> object:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"not within {timeout_s} s"
        time.sleep(0.1)
    return value


def _store(db: Path, results: list[SourceResult]) -> None:
    with Store.open(db) as store:
        Collector(CollectorSettings(db_path=str(db)), store, sources=[]).write_results(results)


def _rows(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def test_the_batched_path_stores_every_sample_the_per_worker_path_stores(stack: Server, tmp_path: Path):
    """The same samples (the router's ticks, each one ``/v1/devices`` answer's worth) through the
    per-worker path, one ``/v1/devices`` body per tick, and through the batched path, the whole
    answer at once: the same gpu_samples, emulation_samples and devices rows."""
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        first = http.get("/v1/collect").json()["devices"]
        time.sleep(1.0)
        devices = http.get("/v1/collect", params={"devices_after": first["last_seq"]}).json()["devices"]
    ticks = devices["ticks"]
    assert len(ticks) >= 5 and [t["seq"] for t in ticks] == list(range(ticks[0]["seq"], ticks[-1]["seq"] + 1))
    assert all(len(t["items"]) == WORKERS and all("sample" in i for i in t["items"]) for t in ticks)

    per_worker = ServingDevicesSource(stack.url, node="n", host_interval_s=float("inf"))
    results = []
    for tick in ticks:  # what ten polls of /v1/devices would have read
        result = SourceResult("serving:test", tick["ts_s"])
        per_worker._take({"devices": tick["items"]}, tick["ts_s"], result)
        results.append(result)
    _store(tmp_path / "per_worker.duckdb", results)

    batched = ServingStackSource(stack.url, node="n", host_interval_s=float("inf"))
    # a new source stores from the newest tick on (the older ones may be stored: a restarted collector)
    fresh = SourceResult("serving:test", ticks[-1]["ts_s"])
    batched._take_devices(devices, ticks[-1]["ts_s"], fresh)
    assert [b.n for b in fresh.columns["gpu_samples"]] == [WORKERS]
    batched._device_cursor = first["last_seq"]  # then as a source that has read before
    result = SourceResult("serving:test", ticks[-1]["ts_s"])
    batched._take_devices(devices, ticks[-1]["ts_s"], result)
    _store(tmp_path / "batched.duckdb", [result])
    per_worker.close()
    batched.close()

    for sql in (
        'SELECT * EXCLUDE (node) FROM gpu_samples_full ORDER BY ts_s, "index"',
        'SELECT * FROM emulation_samples ORDER BY ts_s, "index"',
        'SELECT * FROM devices ORDER BY "index", since_s',
    ):
        want = _rows(tmp_path / "per_worker.duckdb", sql)
        assert want and _rows(tmp_path / "batched.duckdb", sql) == want, sql
    assert len(_rows(tmp_path / "batched.duckdb", "SELECT * FROM gpu_samples")) == WORKERS * len(ticks)


def test_while_the_store_refuses_writes_devices_are_read_and_telemetry_is_not(stack: Server):
    """The collector pauses a stack's telemetry while its store refuses writes (the ring keeps the
    batches); the device samples go on (held by the store, the oldest dropped and counted)."""
    src = ServingStackSource(stack.url, node="n", host_interval_s=float("inf"))
    try:
        src.telemetry_paused = True
        paused = [src.poll(force=True) for _ in range(3)]
        assert all(r.ok for r in paused) and src.reader.cursors == {}
        assert not any(r.rows.get("telemetry_batches") for r in paused)
        assert sum(b.n for r in paused for b in r.columns.get("gpu_samples", [])) >= WORKERS
        src.telemetry_paused = False
        resumed = src.poll(force=True)
        assert any(e["type"] == "control" for b in resumed.rows["telemetry_batches"] for e in b["events"])
    finally:
        src.close()


class OlderRouter:
    """The real router behind a proxy that answers ``/v1/collect`` with 404, as a router from
    before the endpoint does; every path asked is recorded."""

    def __init__(self, upstream: str) -> None:
        self.paths: list[str] = []
        client = httpx.Client(base_url=upstream, timeout=30)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # http.server's name
                outer.paths.append(self.path.split("?")[0])
                if self.path.startswith("/v1/collect"):
                    status, body = 404, b'{"error": {"message": "Not Found"}}'
                else:
                    r = client.get(self.path)
                    status, body = r.status_code, r.content
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._client = client
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._client.close()


def test_an_older_router_is_read_per_worker(stack: Server, tmp_path: Path):
    older = OlderRouter(stack.url)
    src = ServingStackSource(older.url, node="n")
    try:
        results = [src.poll(force=True) for _ in range(6)]
    finally:
        src.close()
        older.close()
    assert all(r.ok and not r.errors for r in results), [r.errors for r in results]
    assert src.health_details()["read"] == "per_worker" and src.interval_s == src.gpu_interval_s
    assert older.paths.count("/v1/collect") == 1  # asked once, then the per-worker reads
    assert older.paths.count("/v1/devices") == 6 and older.paths.count("/v1/telemetry") >= 1
    db = tmp_path / "older.duckdb"
    _store(db, results)
    per_worker = _rows(db, "SELECT worker, count(*) FROM gpu_samples_full GROUP BY ALL ORDER BY worker")
    assert per_worker == [(f"worker-{i}", 6) for i in range(WORKERS)]
    assert _rows(db, "SELECT count(*) FROM host_samples")[0][0] == WORKERS
    assert _rows(db, "SELECT count(*) FROM control_events WHERE action = 'start'")[0][0] == 1


def test_a_worker_killed_mid_run_is_a_counted_gap_and_the_others_are_still_stored(
    stack: Server, tmp_path: Path
):
    db = tmp_path / "kill.duckdb"
    store = Store.open(db)
    src = ServingStackSource(stack.url, node="n", host_interval_s=0.5)
    collector = Collector(CollectorSettings(db_path=str(db), flush_interval_s=0.2), store, sources=[src])
    collector.start()
    try:

        def stored(sql: str) -> list[tuple]:
            return collector.store.query(sql).itertuples(index=False, name=None)

        wait_for(lambda: len(list(stored("SELECT DISTINCT worker FROM gpu_samples_full"))) == WORKERS)
        victim = next(w for w in stack.layout()["workers"] if w["id"] == "worker-1")
        killed_s = time.time()
        os.kill(victim["pid"], signal.SIGKILL)
        wait_for(lambda: src.health_details()["devices_down"].get("worker-1", 0) >= 10)

        def after_kill() -> dict[str, int]:
            sql = f"SELECT worker, count(*) FROM gpu_samples_full WHERE ts_s > {killed_s + 1.0} GROUP BY ALL"
            return dict(stored(sql))

        counts = wait_for(
            lambda: (c := after_kill()).get("worker-0", 0) >= 10 and c.get("worker-2", 0) >= 10 and c
        )
        assert "worker-1" not in counts  # no sample made up for the dead worker
        with httpx.Client(base_url=stack.url, timeout=30) as http:
            devices = http.get("/v1/collect", params={"devices_after": 10**9}).json()["devices"]
        assert {w["worker"]: w["state"] for w in devices["workers"]}["worker-1"] == "dead"
        down_sql = (
            "SELECT sum(count), min(message) FROM ingest_errors WHERE kind = 'device_down' "
            "AND message LIKE '%samples of worker-1 missing'"
        )
        wait_for(lambda: (next(iter(stored(down_sql)))[0] or 0) >= 10)  # stored, counted per sample
        (_, message), *_ = stored(down_sql)
        assert message.startswith("worker-1 dead (exit code -9, restarting in "), message
        health = {s["name"]: s for s in collector.health()["sources"]}[src.name]
        assert health["status"] == "degraded" and health["devices_down"]["worker-1"] >= 10
        assert health["read"] == "batched"
        # the served model, from the router's start event (the Prometheus export's model label)
        (after,) = next(iter(stored("SELECT after FROM control_events WHERE action = 'start'")))
        assert json.loads(after)["model"] == "tiny"
    finally:
        collector.stop()
        store.close()
