"""Every new page on an empty window and with the service down: a message, never a stack trace."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from tests.conftest import Fleet
from tests.dashboard.conftest import APP
from tests.dashboard.views.conftest import figures_of, open_page
from tests.serving.conftest import free_port

EMPTY = {"bimodal": "No GPU samples in this window", "cost": "No GPU time to price", "latency": "No requests"}


@pytest.mark.parametrize("page", sorted(EMPTY))
def test_an_empty_live_window_is_a_message(page, dashboard_env: Fleet):
    at = open_page(page, "live")  # the fleet's store holds only simulated scenarios
    assert not at.exception and not figures_of(at)
    assert EMPTY[page] in at.info[0].value


@pytest.mark.parametrize("page", sorted(EMPTY))
def test_an_unreachable_service_is_a_message(page, monkeypatch):
    monkeypatch.setenv("PHASELENS_API_URL", f"http://127.0.0.1:{free_port()}")
    at = open_page(page)
    assert not at.exception
    assert "service is not reachable" in at.error[0].value and "phaselens collect" in at.error[0].value


def test_the_app_lists_the_new_pages(dashboard_env: Fleet):
    at = AppTest.from_file(APP, default_timeout=60).run()
    for page in ("bimodal", "cost", "latency"):
        at.switch_page(f"views/{page}.py").run()
        assert not at.exception
