"""Fixtures of the dashboard tests: a real collector on a real store holding two simulated
scenarios (``phaselens simulate --db``), and the dashboard's environment pointed at it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
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


@dataclass
class GpuTimeBar:
    """What the Overview's HTML GPU-time bar (``dashboard/share_bar.py``) shows, read back from its
    markup: each bar's segments (category -> share, 0..1), each segment's text and hover title, the
    legend's entries in order (category, text), the trust label's text and all the text."""

    rows: dict[str, dict[str, float]] = field(default_factory=dict)
    labels: dict[tuple[str, str], str] = field(default_factory=dict)
    titles: dict[tuple[str, str], str] = field(default_factory=dict)
    legend: list[tuple[str, str]] = field(default_factory=list)
    trust: str = ""
    text: str = ""

    @classmethod
    def parse(cls, markup: str) -> GpuTimeBar:
        bar = cls()
        _BarParser(bar).feed(markup)
        bar.legend = [(k, " ".join(t.split())) for k, t in bar.legend]
        return bar


class _BarParser(HTMLParser):
    def __init__(self, bar: GpuTimeBar) -> None:
        super().__init__()
        self.bar = bar
        self.row: str | None = None
        self.open: list[tuple[str, str | None]] = []  # (tag, what it collects text for)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        what = None
        if a.get("class") == "pl-bar":
            self.row = a["data-row"] or ""
            self.bar.rows[self.row] = {}
        elif a.get("class") == "pl-seg" and self.row is not None:
            key = a["data-key"] or ""
            self.bar.rows[self.row][key] = float(a["data-share"] or "nan")
            self.bar.titles[(self.row, key)] = a.get("title") or ""
            self.bar.labels[(self.row, key)] = ""
            what = f"seg:{key}"
        elif "data-legend" in a:
            self.bar.legend.append((a["data-legend"] or "", ""))
            what = "legend"
        elif a.get("data-testid") == "trust":
            what = "trust"
        self.open.append((tag, what))

    def handle_endtag(self, tag: str) -> None:
        while self.open:
            t, _ = self.open.pop()
            if t == tag:
                break

    def handle_data(self, data: str) -> None:
        self.bar.text += data
        for _tag, what in reversed(self.open):
            if what == "legend":
                key, text = self.bar.legend[-1]
                self.bar.legend[-1] = (key, text + data)
            elif what == "trust":
                self.bar.trust += data
            elif what and what.startswith("seg:") and self.row is not None:
                self.bar.labels[(self.row, what[4:])] += data
            if what:
                return
