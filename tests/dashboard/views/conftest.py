"""Helpers of the page tests: open one page of the dashboard on a data set, read its charts."""

from __future__ import annotations

import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

from tests.dashboard.conftest import ROOT

PAGES = ROOT / "dashboard" / "views"
AGG, DISAGG = "agg:2xh100-sxm", "1p1d:h100-sxm"


def open_page(name: str, dataset: str | None = None) -> AppTest:
    """Run ``dashboard/views/<name>.py`` on its own (as the app's navigation runs it), on ``dataset``."""
    at = AppTest.from_file(str(Path(PAGES / f"{name}.py")), default_timeout=90)
    if dataset is not None:
        at.query_params["dataset"] = dataset
    return at.run()


def figures_of(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def texts(at: AppTest) -> str:
    return "\n".join(
        str(e.value)
        for kind in ("markdown", "caption", "info", "warning", "error")
        for e in getattr(at, kind)
    )
