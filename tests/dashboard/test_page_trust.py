"""Trust labels once per page (issue 25): every page of dashboard/app.py renders exactly one badge block
(dashboard/page_trust.py) listing the labels of what it shows, no other trust badge, and its charts
lose the in-chart label the block already says; against a real collector on a simulated fleet."""

from __future__ import annotations

import json
import re

import plotly.graph_objects as go
import pytest
from streamlit.testing.v1 import AppTest

from dashboard.figures import label_figure
from dashboard.page_trust import PREFIX, block_md, strip_trust
from tests.conftest import Fleet
from tests.dashboard.conftest import APP
from tests.dashboard.test_browser import dashboard_pages

DISAGG = "1p1d:h100-sxm"
TRUST_BADGE = re.compile(r":\w+-badge\[(measured|emulated|simulated|host-bound|estimated)\]")


def _markdowns(at: AppTest) -> list[str]:
    return [str(m.value) for m in at.markdown]


@pytest.mark.parametrize("page", [file for file, _title in dashboard_pages()])
def test_every_page_renders_one_badge_block(dashboard_env: Fleet, page: str):
    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["dataset"] = dashboard_env.scenarios[DISAGG]
    at.switch_page(f"views/{page}")
    at.run()
    assert not at.exception, at.exception
    blocks = [m for m in _markdowns(at) if m.startswith(PREFIX)]
    assert len(blocks) == 1, (page, blocks)
    others = [m for m in _markdowns(at) if TRUST_BADGE.search(m) and not m.startswith(PREFIX)]
    assert not others, (page, others)  # no trust badge outside the block
    if page in ("overview.py", "gpus.py", "bimodal.py", "cost.py", "latency.py"):
        assert ":blue-badge[simulated]" in blocks[0], blocks  # the scenario's data, labelled once
        for chart in at.get("plotly_chart"):  # the block says it: no chart repeats it
            annotations = json.loads(chart.proto.spec)["layout"].get("annotations") or []
            assert not [a for a in annotations if a.get("name") == "trust"], page


def test_a_chart_keeps_its_label_only_where_it_differs():
    fig = label_figure(go.Figure(), ["simulated"])
    assert [a.name for a in fig.layout.annotations] == ["trust"]
    assert not strip_trust(fig).layout.annotations
    assert (
        block_md(["host-bound", "simulated"]) == f"{PREFIX} :blue-badge[simulated] :violet-badge[host-bound]"
    )
    assert block_md([]) == f"{PREFIX} none shown"
