"""Fixtures of the dashboard tests: a real collector on a real store holding two simulated
scenarios (``phaselens simulate --db``), and the dashboard's environment pointed at it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.collector.conftest import start_collector

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "dashboard" / "app.py")
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"


@dataclass(frozen=True)
class Fleet:
    """The collector's URL and its scenarios by layout name (``agg:2xh100-sxm``, ``1p1d:h100-sxm``)."""

    url: str
    scenarios: dict[str, str]


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """`phaselens simulate --db` (an aggregated and a disaggregated 2-GPU layout, 100 requests),
    then `phaselens collect` on that store."""
    db = tmp_path_factory.mktemp("dashboard") / "fleet.duckdb"
    sim = [
        sys.executable,
        "-m",
        "collector.cli",
        "simulate",
        "--no-progress",
        "--limit",
        "100",
        "--db",
        str(db),
    ]
    done = subprocess.run(
        [*sim, "--layout", "agg:2xh100-sxm", "--layout", "1p1d:h100-sxm"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    proc, url = start_collector(db)
    try:
        body = httpx.get(f"{url}/api/v1/scenarios", timeout=10).json()
        yield Fleet(url, {s["name"]: s["scenario_id"] for s in body["scenarios"]})
    finally:
        _stop(proc)


@pytest.fixture
def dashboard_env(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> Fleet:
    """The dashboard (run in this process by AppTest) reads the fleet's collector."""
    monkeypatch.setenv("PHASELENS_API_URL", fleet.url)
    return fleet
