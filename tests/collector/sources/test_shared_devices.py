"""Workers sharing one physical device (two on ``cpu``, or on ``cuda:0``): one ``devices`` row for it.

Each worker reports the device it runs on in ``GET /v1/devices``; two workers on the same device
report the same ``(device, index)``. Before, the store saw that device's owner alternate between the
two workers on every poll and versioned a new ``devices`` row each time (9,660 rows in 644 s).
"""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
import httpx
import pytest

from collector.service import Collector, CollectorSettings
from collector.sources.base import SourceResult
from collector.sources.serving_stack import add_device_columns, one_item_per_device
from collector.store import Store
from collector.store.columns import RepeatedColumns
from collector.store.devices import STEADY_SAMPLE_COLUMNS


def _cpu_item(worker: str, role: str, ts_s: float) -> dict:
    """A cpu worker's ``/v1/devices`` item as the stack returns it (decoded JSON)."""
    sample = {
        "ts_s": ts_s,
        "device": "cpu",
        "kind": "cpu",
        "index": None,
        "name": "Test CPU",
        "uuid": None,
        "emulated": False,
        "mem_used_bytes": 1_000_000 + int(ts_s),
        "mem_total_bytes": 8_000_000,
    }
    return {"worker": worker, "role": role, "device": "cpu", "pid": 0, "sample": sample}


def test_workers_on_one_device_become_one_item_with_both_workers_in_id_order() -> None:
    items = [
        _cpu_item("worker-10", "decode", 5.0),
        _cpu_item("worker-2", "prefill", 5.1),
        {**_cpu_item("worker-3", "mixed", 5.2), "sample": {**_cpu_item("w", "m", 5.2)["sample"], "index": 3}},
    ]
    merged = one_item_per_device(items)
    assert [(i["worker"], i["role"], i["sample"]["ts_s"]) for i in merged] == [
        ("worker-2,worker-10", "prefill,decode", 5.1),  # the first worker's sample
        ("worker-3", "mixed", 5.2),  # another (device, index): unchanged
    ]
    alone = [_cpu_item("worker-0", "mixed", 1.0)]
    assert one_item_per_device(alone) is alone


@pytest.mark.parametrize("shared", [True, False])
def test_polls_of_two_workers_on_one_cpu_store_one_devices_row(tmp_path: Path, shared: bool) -> None:
    repeats = RepeatedColumns(steady=STEADY_SAMPLE_COLUMNS) if shared else None
    results = []
    for k in range(40):  # the workers answer in either order, as /v1/devices gathers them
        pair = [_cpu_item("worker-0", "mixed", 100.0 + k), _cpu_item("worker-1", "mixed", 100.01 + k)]
        results.append(SourceResult("serving-devices:test", 100.0 + k))
        add_device_columns(results[-1], pair[:: 1 if k % 2 else -1], "node-a", repeats)
    # worker-1 gone (removed): the device's workers changed once, a second row from then
    for k in range(40, 45):
        results.append(SourceResult("serving-devices:test", 100.0 + k))
        add_device_columns(results[-1], [_cpu_item("worker-0", "mixed", 100.0 + k)], "node-a", repeats)
    with Store.open(tmp_path / "s.duckdb") as store:
        settings = CollectorSettings(db_path=str(store.path), node="node-a", nvml=False)
        collector = Collector(settings, store, sources=[])
        collector.write_results(results)
        assert collector.stats.store_errors == 0, collector.stats.last_error
        devices = store.query('SELECT device, "index", since_s, worker, role FROM devices ORDER BY since_s')
        samples = store.query("SELECT ts_s, worker FROM gpu_samples_full ORDER BY ts_s")
    assert devices.to_dict("records") == [
        {
            "device": "cpu",
            "index": None,
            "since_s": 100.0,
            "worker": "worker-0,worker-1",
            "role": "mixed",
        },
        {"device": "cpu", "index": None, "since_s": 140.0, "worker": "worker-0", "role": "mixed"},
    ]
    assert len(samples) == 45  # one sample per poll of the one device, not one per worker
    assert set(samples["worker"][:40]) == {"worker-0,worker-1"} and set(samples["worker"][40:]) == {
        "worker-0"
    }


@pytest.mark.slow
def test_a_real_stack_with_two_cpu_workers_and_a_collector_keeps_one_devices_row(tmp_path: Path) -> None:
    """The issue's case: ``--workers 2 --device cpu`` and ``phaselens collect`` polling it into a file."""
    from tests.collector.conftest import start_collector
    from tests.conftest import stop_process
    from tests.serving.conftest import start_server, stop_server

    db = tmp_path / "phaselens.duckdb"
    server = start_server(
        "--mode", "aggregated", "--workers", "2", "--device", "cpu", "--max-model-len", "256"
    )
    try:
        proc, url = start_collector(db, "--serving", server.url, "--node", "n1", "--flush-interval", "0.2")
        try:
            for _ in range(4):  # requests on both workers while the collector polls
                r = httpx.post(
                    f"{server.url}/v1/completions",
                    json={"prompt": "hello there", "max_tokens": 4},
                    timeout=120,
                )
                assert r.status_code == 200, r.text
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # a few seconds of 10 polls a second
                sources = httpx.get(f"{url}/health", timeout=10).json()["sources"]
                polled = [s for s in sources if s["name"].startswith("serving:")]
                if polled and polled[0]["rows_total"] >= 60:
                    break
                time.sleep(0.5)
        finally:
            stop_process(proc)
        workers = {w["id"]: w["pid"] for w in server.layout()["workers"]}
    finally:
        stop_server(server)
    assert sorted(workers) == ["worker-0", "worker-1"]
    with duckdb.connect(str(db), read_only=True) as con:
        devices = con.execute(
            "SELECT device, \"index\", worker, role, count(*) OVER () FROM devices WHERE node = 'n1'"
        ).fetchall()
        n, mapped = con.execute(
            "SELECT count(*), count(*) FILTER (WHERE worker = 'worker-0,worker-1') FROM gpu_samples_full "
            "WHERE node = 'n1' AND device = 'cpu'"
        ).fetchone()
        hosts = con.execute(
            "SELECT DISTINCT worker FROM host_samples WHERE node = 'n1' ORDER BY 1"
        ).fetchall()
    assert devices == [("cpu", None, "worker-0,worker-1", "mixed", 1)]
    assert n >= 20 and mapped == n  # every sample of the device maps to both of its workers
    assert hosts == [("worker-0",), ("worker-1",)]  # each worker process still sampled on its own
