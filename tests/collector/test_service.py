"""`phaselens collect` as a real process beside the real serving stack on emulated GPUs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from collector.store import Store
from serving.loadgen import run_load
from serving.trace import poisson_trace
from tests.collector.conftest import collect_command, start_collector
from tests.collector.sources.conftest import DATA, L4_PROM, LocalServer, http_server  # noqa: F401
from tests.serving.conftest import Server, free_port, start_server, stop_server

pytestmark = pytest.mark.slow


def wait_for(fn: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not fn():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.25)


@pytest.fixture(scope="module")
def stack() -> Iterator[Server]:
    server = start_server(
        "--mode", "disaggregated", "--device", "emulated:h100-sxm", "--emulate-shape", "llama-3.1-8b"
    )
    yield server
    stop_server(server)


def rows(url: str, table: str) -> list[dict]:
    r = httpx.get(f"{url}/api/v1/tables/{table}", params={"limit": 100_000}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["rows"]


def test_collect_fills_every_serving_table_and_flushes_on_sigterm(stack: Server, tmp_path: Path) -> None:
    db = tmp_path / "phaselens.duckdb"
    proc, url = start_collector(db, "--serving", stack.url)
    try:
        report = run_load(
            stack.url, poisson_trace(20, 8, prompt_tokens=64, output_tokens=12, seed=3), progress=False
        )
        assert report.n_ok == 8
        wait_for(lambda: len(rows(url, "requests")) >= 8)
        reqs = rows(url, "requests")
        assert {r["status"] for r in reqs} == {"ok"}
        assert all(r["kv_transfer_bytes"] > 0 for r in reqs)
        assert len(rows(url, "tokens")) >= 8 * 12
        iters = rows(url, "iterations")
        assert {"prefill", "decode"} <= {r["phase"] for r in iters}
        samples = rows(url, "gpu_samples")  # with the device attributes joined back
        assert samples and all(s["emulated"] and s["kind"] == "emulated" for s in samples)
        devices = rows(url, "devices")  # each emulated GPU described once, not once per sample
        assert sorted(d["index"] for d in devices) == [0, 1] and all(d["emulated"] for d in devices)
        assert rows(url, "host_samples")
        latest = httpx.get(f"{url}/api/v1/latest").json()["rows"]
        assert sorted(r["index"] for r in latest) == [0, 1]  # prefill and decode worker GPUs apart
        assert any(r["action"] == "start" for r in rows(url, "control_events"))
        health = httpx.get(f"{url}/health").json()
        assert health["status"] == "ok" and all(s["status"] == "ok" for s in health["sources"])
        telemetry = next(s for s in health["sources"] if s["name"].startswith("serving:"))
        assert telemetry["telemetry_gaps"] == 0 and telemetry["cursors"]["router"] >= 0
        bad = httpx.get(f"{url}/api/v1/tables/nope")
        assert bad.status_code == 404 and "tables:" in bad.json()["error"]["message"]
        typed = httpx.get(f"{url}/api/v1/tables/requests", params={"limit": "x"})  # not a number
        assert typed.status_code == 400 and typed.json()["error"]["param"] == "limit"
        written = health["writer"]["rows_written"]["gpu_samples"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    with Store.open(db, read_only=True) as store:
        n = int(store.query("SELECT count(*) AS n FROM gpu_samples")["n"][0])
        assert n >= written  # everything the writer had taken is in the file after SIGTERM
        assert int(store.query("SELECT count(*) AS n FROM requests")["n"][0]) >= 8


def test_second_writer_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    db = tmp_path / "one.duckdb"
    proc, _ = start_collector(db)
    try:
        second = subprocess.run(
            collect_command(db, free_port()),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 2
        assert "another" in second.stderr and "Traceback" not in second.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_kill_9_loses_at_most_the_last_flush_and_the_file_opens(stack: Server, tmp_path: Path) -> None:
    db = tmp_path / "crash.duckdb"
    proc, url = start_collector(db, "--serving", stack.url, "--flush-interval", "0.5")
    wait_for(lambda: httpx.get(f"{url}/health").json()["writer"]["flushes"] >= 3)
    flushed_before = len(rows(url, "gpu_samples"))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    with Store.open(db) as store:
        n = int(store.query("SELECT count(*) AS n FROM gpu_samples")["n"][0])
    assert n >= flushed_before > 0


def test_unreachable_source_backs_off_and_the_service_stays_up(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    proc, url = start_collector(tmp_path / "x.duckdb", "--serving", dead, "--dcgm", f"{dead}/metrics")
    try:

        def failed_and_recorded() -> bool:
            down = [s for s in httpx.get(f"{url}/health").json()["sources"] if s["status"] == "down"]
            # the stack (one source: its batched or per-worker reads) and the dcgm-exporter
            return len(down) == 2 and any(e["kind"] == "unreachable" for e in rows(url, "ingest_errors"))

        wait_for(failed_and_recorded)
        health = httpx.get(f"{url}/health").json()
        assert health["status"] == "degraded"
        down = [s for s in health["sources"] if s["status"] == "down"]
        assert len(down) == 2 and all(s["consecutive_failures"] >= 1 for s in down)
        assert all(s["next_attempt_s"] > s["last_attempt_s"] for s in down)
        errors = rows(url, "ingest_errors")
        assert any(e["kind"] == "unreachable" for e in errors)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_store_export_then_import_on_another_node(stack: Server, tmp_path: Path) -> None:
    db = tmp_path / "a.duckdb"
    proc, url = start_collector(db, "--serving", stack.url, "--node", "node-a")
    wait_for(lambda: len(rows(url, "gpu_samples")) >= 5)
    proc.terminate()
    proc.wait(timeout=30)
    cli = [sys.executable, "-m", "phaselens.cli", "store"]
    export = subprocess.run(
        [*cli, "export", str(tmp_path / "pq"), "--db", str(db)], capture_output=True, text=True
    )
    assert export.returncode == 0, export.stderr
    assert any((tmp_path / "pq" / "gpu_samples").glob("date=*/node=node-a/*.parquet"))
    other = tmp_path / "b.duckdb"
    for _ in range(2):  # a second import adds nothing
        imp = subprocess.run(
            [*cli, "import", str(tmp_path / "pq"), "--db", str(other)], capture_output=True, text=True
        )
        assert imp.returncode == 0, imp.stderr
    with Store.open(db, read_only=True) as a, Store.open(other, read_only=True) as b:
        q = "SELECT count(*) AS n FROM gpu_samples"
        assert int(a.query(q)["n"][0]) == int(b.query(q)["n"][0]) > 0


def test_engine_and_dcgm_scrapes_are_stored_by_the_real_collector(
    tmp_path: Path,
    http_server: LocalServer,  # noqa: F811
) -> None:
    engine_url = http_server.serve_text("/metrics", (DATA / "vllm-lmcache.prom").read_text())
    dcgm_url = http_server.serve_text("/dcgm", L4_PROM)
    proc, url = start_collector(
        tmp_path / "e.duckdb",
        *("--node", "gpu-box-1", "--engine", engine_url, "--dcgm", dcgm_url, "--dcgm-interval-s", "0.5"),
    )
    try:
        wait_for(lambda: len(rows(url, "engine_metrics")) > 0 and len(rows(url, "gpu_samples")) > 0)
        time.sleep(2.0)  # a few more scrapes: the exporter page does not change, nothing is stored again
        engine = rows(url, "engine_metrics")
        assert {r["engine"] for r in engine} == {"vllm", "lmcache"}
        gpu = rows(url, "gpu_samples")
        assert len(gpu) == 1  # one row for the unchanged dcgm-exporter page
        assert (gpu[0]["node"], gpu[0]["exporter_hostname"]) == ("gpu-box-1", "i-030791dc5a37cd257")
        errors = rows(url, "ingest_errors")
        assert not [e for e in errors if e["kind"] == "store_rejected"], errors
        assert {e["kind"] for e in errors} == {"unmapped"}
        health = httpx.get(f"{url}/health").json()
        assert health["status"] == "ok", health
        by_name = {s["name"]: s for s in health["sources"]}
        dcgm = by_name[f"dcgm:{dcgm_url}"]
        assert dcgm["unchanged_scrapes"] >= 1 and dcgm["store_rejected_rows"] == 0
        assert by_name[f"engine:{engine_url}"]["status"] == "ok"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_restarted_collector_resumes_its_cursors_no_duplicates_no_false_gap(
    stack: Server, tmp_path: Path
) -> None:
    db = tmp_path / "restart.duckdb"
    trace = poisson_trace(20, 3, prompt_tokens=32, output_tokens=6, seed=5)
    proc, url = start_collector(db, "--serving", stack.url, "--flush-interval", "0.2")
    try:
        assert run_load(stack.url, trace, progress=False).n_ok == 3
        wait_for(lambda: len(rows(url, "requests")) >= 3)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    with Store.open(db, read_only=True) as store:
        before = int(store.query("SELECT count(*) AS n FROM telemetry_batches")["n"][0])
        requests_before = int(store.query("SELECT count(*) AS n FROM requests")["n"][0])
    # the server keeps running (and its ring keeps every batch read before) while the collector is down
    assert (
        run_load(
            stack.url, poisson_trace(20, 2, prompt_tokens=32, output_tokens=6, seed=6), progress=False
        ).n_ok
        == 2
    )
    proc, url = start_collector(db, "--serving", stack.url, "--flush-interval", "0.2")
    try:
        wait_for(lambda: len(rows(url, "requests")) >= requests_before + 2)
        health = httpx.get(f"{url}/health").json()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    telemetry = next(s for s in health["sources"] if s["name"].startswith("serving:"))
    assert telemetry["restored_cursors"] >= 3  # router + both workers
    assert telemetry["telemetry_gaps"] == 0 and telemetry["producer_restarts"] == 0
    assert health["writer"]["duplicates"] == {}  # nothing stored was read again
    with Store.open(db, read_only=True) as store:
        dupes = store.query(
            "SELECT count(*) AS n FROM (SELECT source, seq FROM telemetry_batches GROUP BY ALL HAVING count(*) > 1)"
        )["n"][0]
        assert dupes == 0
        assert int(store.query("SELECT count(*) AS n FROM telemetry_batches")["n"][0]) > before
        assert int(store.query("SELECT count(*) AS n FROM telemetry_gaps")["n"][0]) == 0
        reqs = store.query("SELECT request_id, count(*) AS n FROM requests GROUP BY ALL")
        assert len(reqs) >= requests_before + 2 and (reqs["n"] == 1).all()
        # the second run read on where the first stopped: it counts as written only batches it added
        new_batches = int(store.query("SELECT count(*) AS n FROM telemetry_batches")["n"][0]) - before
        assert 0 < health["writer"]["rows_written"]["telemetry_batches"] <= new_batches
