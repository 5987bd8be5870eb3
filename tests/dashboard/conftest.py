"""Fixtures of the dashboard tests: the dashboard's environment pointed at the session's collector on
a real store holding two simulated scenarios (``fleet``, tests/conftest.py)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import Fleet

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "dashboard" / "app.py")
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"


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


def plotly_values(array: list | dict) -> list:
    """A Plotly trace's values: a list, or Plotly's typed array (``{"dtype", "bdata"}``, base64)."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=np.dtype(array["dtype"])).tolist()
    return list(array)
