"""Fixtures for the store tests: a fresh store file, synthetic samples, child processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.store import Store
from serving.devices.base import DeviceSample

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "phaselens.duckdb"


@pytest.fixture
def store(store_path: Path) -> Iterator[Store]:
    s = Store.open(store_path)
    yield s
    s.close()


def sample(ts_s: float, device: str = "cuda:0", **metrics: object) -> DeviceSample:
    """A DeviceSample of an H100 with the given metrics (others None)."""
    index = int(device.rsplit(":", 1)[1]) if device.startswith("cuda:") else None
    return DeviceSample(
        ts_s=ts_s,
        device=device,
        kind="cuda",
        index=index,
        name="NVIDIA H100 80GB HBM3",
        uuid=f"GPU-{device}",
        emulated=False,
        **metrics,
    )


def spawn_python(code: str) -> subprocess.Popen[str]:
    """Start ``python -c code`` in another process with the repo importable; stdout is a pipe."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_line(proc: subprocess.Popen[str], expected: str) -> None:
    """Block until the child prints ``expected``; fail with its stderr if it exits first."""
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != expected:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        pytest.fail(f"child printed {line!r} instead of {expected!r}; stderr:\n{err}")


def add_simulated_scenario(store: Store, scenario_id: str, t0_s: float, *, requests: int = 3) -> None:
    """Store a small simulated scenario as ``phaselens simulate`` labels it: a ``scenarios`` row and
    emulated GPU samples, iterations, requests and tokens with node ``sim:<id>``, source ``simulated``."""
    from collector.store import scenario_node

    node = scenario_node(scenario_id)
    store.append(
        "scenarios",
        [
            {
                "scenario_id": scenario_id,
                "node": node,
                "created_s": t0_s + 1000.0,
                "name": f"{scenario_id} disaggregated",
                "model": "llama-3.1-8b",
                "gpu": "h100-sxm",
                "layout": {"prefill": 1, "decode": 1},
                "trace": {"kind": "poisson", "rate_per_s": 20, "requests": requests},
                "params": {"seed": 7},
                "start_s": t0_s,
                "end_s": t0_s + 10.0,
                "wall_s": 0.25,
                "summary": {"requests_ok": requests, "ttft_p50_s": 0.05},
            }
        ],
    )
    samples = [
        DeviceSample(
            ts_s=t0_s + 0.1 * i,
            device="emulated:h100-sxm",
            kind="emulated",
            index=g,
            name="NVIDIA H100 80GB HBM3 (emulated)",
            uuid=f"GPU-emulated-{scenario_id}-{g}",
            emulated=True,
            power_w=300.0 + i,
            energy_mj=1000 * i,
        )
        for i in range(10)
        for g in (0, 1)
    ]
    store.append_gpu_samples(samples, node=node, source="simulated")
    store.append(
        "iterations",
        [
            {
                "node": node,
                "source": "simulated",
                "worker": "prefill-0",
                "start_s": t0_s + 0.01 * i,
                "end_s": t0_s + 0.01 * i + 0.005,
                "phase": "prefill",
                "batch_size": 1,
                "gpu_index": 0,
            }
            for i in range(requests)
        ],
    )
    store.append(
        "requests",
        [
            {
                "node": node,
                "source": "simulated",
                "request_id": f"r{i}",
                "arrival_s": t0_s + i,
                "first_token_s": t0_s + i + 0.05,
                "finish_s": t0_s + i + 0.5,
                "output_tokens": 4,
                "status": "ok",
            }
            for i in range(requests)
        ],
    )
    store.append(
        "tokens",
        [
            {"node": node, "request_id": f"r{i}", "idx": k, "ts_s": t0_s + i + 0.05 + 0.1 * k}
            for i in range(requests)
            for k in range(4)
        ],
    )
    store.flush()
