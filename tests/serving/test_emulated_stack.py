"""Issue 3's end-to-end scenarios: the real stack on emulated GPUs serving the trace replay."""

from __future__ import annotations

import httpx
import pytest

from serving.loadgen import LoadReport, format_report, run_load
from serving.trace import load_azure_trace, vendored_trace_path
from tests.serving.conftest import start_server, stop_server

pytestmark = pytest.mark.slow


def replay(url: str, n: int) -> LoadReport:
    trace = load_azure_trace(
        vendored_trace_path(), limit=n, time_scale=0.02, max_prompt_tokens=512, max_output_tokens=24
    )
    report = run_load(url, trace, progress=False)
    assert report.n_ok == n and report.n_failed == 0, report.errors
    return report


def metric(text: str, name: str, worker: str) -> float:
    """The value of ``name`` for ``worker`` in a Prometheus exposition."""
    for line in text.splitlines():
        if line.startswith(name + "{") and f'worker="{worker}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} for {worker} not in /metrics")


def devices(url: str) -> dict[str, dict]:
    body = httpx.get(f"{url}/v1/devices", timeout=30).json()
    return {d["worker"]: d for d in body["devices"]}


def test_1p1d_on_emulated_h100_serves_the_trace_with_labelled_counters() -> None:
    server = start_server(
        "--mode", "disaggregated", "--device", "emulated:h100-sxm", "--emulate-shape", "llama-3.1-8b"
    )
    try:
        before = devices(server.url)
        report = replay(server.url, 12)
        after = devices(server.url)
        check_lag_is_visible(server.url, report, after)
        for wid, d in after.items():
            sample = d["sample"]
            assert sample["emulated"] is True and "(emulated)" in sample["name"]
            assert sample["kind"] == "emulated" and sample["device"] == "emulated:h100-sxm"
            assert sample["energy_mj"] > before[wid]["sample"]["energy_mj"]
            assert sample["power_limit_w"] == 700
        with server.control() as c:
            r = c.post("/control/workers/worker-1/device", json={"power_limit_w": 5000})
            assert r.status_code == 400 and "outside [200, 700] W" in r.json()["error"]["message"]
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


def check_lag_is_visible(url: str, report: LoadReport, after: dict[str, dict]) -> None:
    """Issue 'Trustworthy data' item 9: that the devices are emulated, what they model, and how far
    the host lagged the modeled GPU show in /v1/models, /v1/devices, /metrics and the load report."""
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]
    assert model["phaselens"]["devices"] == [
        {
            "worker": w,
            "device": "emulated:h100-sxm",
            "emulated": True,
            "gpu": "NVIDIA H100 80GB HBM3",
            "models_shape": "llama-3.1-8b",
            "dtype": "bf16",
            "validated": True,
        }
        for w in ("worker-0", "worker-1")
    ]
    for wid, d in after.items():
        emu, sample = d["emulation"], d["sample"]
        assert (emu["models_shape"], emu["gpu"]) == ("llama-3.1-8b", "NVIDIA H100 80GB HBM3")
        assert emu["iterations"] == sample["iterations_total"] > 0
        assert emu["paced_iterations"] + emu["lagged_iterations"] == emu["iterations"]
        assert emu["host_bound_fraction"] == pytest.approx(emu["lagged_iterations"] / emu["iterations"])
        assert sample["lag_s_total"] >= 0 and sample["modeled_s_total"] > 0
        assert sample["busy_s_total"] <= sample["uptime_s"] and sample["window_s"] == 0.1
        text = httpx.get(f"{url}/metrics", timeout=30).text
        assert 0 < metric(text, "phaselens:emulation_iterations_total", wid) <= emu["iterations"]
        assert metric(text, "phaselens:emulation_lag_seconds_total", wid) <= emu["lag_s_total"] + 1e-9
        assert metric(text, "phaselens:emulation_lagged_iterations_total", wid) <= emu["lagged_iterations"]
    during = {e["worker"]: e for e in report.emulation}
    assert set(during) == set(after)
    assert all(0 < e["iterations"] <= after[w]["emulation"]["iterations"] for w, e in during.items())
    assert "host-bound" in format_report(report)
    wide = httpx.get(f"{url}/v1/devices", params={"window_s": 0.5}, timeout=30).json()["devices"]
    assert all(d["sample"]["window_s"] == 0.5 for d in wide)
    bad = httpx.get(f"{url}/v1/devices", params={"window_s": 0}, timeout=30)
    assert bad.status_code == 400 and "'window_s' must be in (0, 10]" in bad.json()["error"]["message"]
