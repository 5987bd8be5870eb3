"""Issue 3's end-to-end scenarios: the real stack on emulated GPUs serving the trace replay."""

from __future__ import annotations

import httpx
import pytest

from serving.loadgen import run_load
from serving.trace import load_azure_trace, vendored_trace_path
from tests.serving.conftest import start_server, stop_server

pytestmark = pytest.mark.slow


def replay(url: str, n: int) -> None:
    trace = load_azure_trace(
        vendored_trace_path(), limit=n, time_scale=0.02, max_prompt_tokens=512, max_output_tokens=24
    )
    report = run_load(url, trace, progress=False)
    assert report.n_ok == n and report.n_failed == 0, report.errors


def devices(url: str) -> dict[str, dict]:
    body = httpx.get(f"{url}/v1/devices", timeout=30).json()
    return {d["worker"]: d for d in body["devices"]}


def test_1p1d_on_emulated_h100_serves_the_trace_with_labelled_counters() -> None:
    server = start_server(
        "--mode", "disaggregated", "--device", "emulated:h100-sxm", "--emulate-shape", "llama-3.1-8b"
    )
    try:
        before = devices(server.url)
        replay(server.url, 12)
        after = devices(server.url)
        for wid, d in after.items():
            sample = d["sample"]
            assert sample["emulated"] is True and "(emulated)" in sample["name"]
            assert sample["kind"] == "emulated" and sample["device"] == "emulated:h100-sxm"
            assert sample["energy_mj"] > before[wid]["sample"]["energy_mj"]
            assert sample["power_limit_w"] == 700
        with server.control() as c:
            r = c.post("/control/workers/worker-1/device", json={"power_limit_w": 5000})
            assert r.status_code == 400 and "outside [200, 700] W" in r.json()["detail"]["message"]
            r = c.post("/control/workers/worker-1/device", json={"power_limit_w": 350})
            assert r.status_code == 200 and r.json()["power_limit_w"] == 350
            r = c.post("/control/workers/worker-1/device", json={"reset": True})
            assert r.json()["power_limit_w"] == 700
    finally:
        stop_server(server)


def test_aggregated_two_workers_on_emulated_h200_serve_the_trace() -> None:
    server = start_server(
        "--mode",
        "aggregated",
        "--workers",
        "2",
        "--device",
        "emulated:h200",
        "--emulate-shape",
        "llama-3.1-8b",
    )
    try:
        replay(server.url, 12)
        samples = [d["sample"] for d in devices(server.url).values()]
        assert len(samples) == 2
        assert sorted(s["index"] for s in samples) == [0, 1]  # each worker has its own emulated GPU
        assert all(s["name"].startswith("NVIDIA H200") and s["mem_total_bytes"] > 140e9 for s in samples)
        assert all(75 <= s["power_w"] <= 700 for s in samples)
    finally:
        stop_server(server)
