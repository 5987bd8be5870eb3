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
