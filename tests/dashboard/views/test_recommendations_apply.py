"""Apply from the Recommendations page, end to end in AppTest: a real emulated stack (2 mixed
workers), a real collector watching it with a control token, and a recommendation for it
(``phaselens.apply.testing.recommendation_row``, the apply tests' input: 2 mixed → 1 prefill + 1
decode). Apply… shows the dry-run plan, Execute runs it (1 s guard windows), the page follows it to
realised vs predicted, Roll back restores the stack's layout."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from collector.store import Store
from dashboard.api import TOKEN_ENV
from phaselens.apply.testing import recommendation_row
from phaselens.testing import start_collector
from serving.sim.live_compare import serve_args_emulated
from serving.testing import TOKEN, Server, start_server, stop_server
from tests.conftest import stop_process
from tests.dashboard.views.conftest import open_page, texts

pytestmark = pytest.mark.slow  # a live stack: its workers run the emulated model

PREDICTED = {"goodput_rps_per_gpu": 1.0, "ttft_p90_s": 0.5, "tpot_p90_s": 0.05, "j_per_token": 1.0}


@pytest.fixture(scope="module")
def stack() -> Iterator[Server]:
    server = start_server(*serve_args_emulated(2))
    yield server
    stop_server(server)


def _roles(stack: Server) -> list[str]:
    return sorted(w["role"] for w in stack.layout()["workers"])


def test_apply_from_the_page_then_roll_back(stack: Server, tmp_path, monkeypatch: pytest.MonkeyPatch):
    rec = recommendation_row(stack.url, "agg:2xh200", "1p1d:h200", predicted=PREDICTED)
    db = tmp_path / "a.duckdb"
    with Store.open(db) as store:
        store.append("recommendations", [rec])
        store.flush()
    proc, url = start_collector(
        db, "--serving", stack.url, "--control-token", TOKEN, "--report-schedule", "off"
    )
    try:
        monkeypatch.setenv("PHASELENS_API_URL", url)
        monkeypatch.setenv(TOKEN_ENV, TOKEN)  # as `phaselens demo` gives the dashboard its token
        at = open_page("recommendations")
        assert not at.exception
        at.button(key="apply_plan").click().run()
        assert not at.exception and not at.error, [e.value for e in at.error]
        assert at.code[0].value.startswith(f"stack {stack.url}: 2 mixed → 1 prefill + 1 decode")
        assert "Guard: a 30 s window after each step" in texts(at).replace("\\:", ":")
        assert _roles(stack) == ["mixed", "mixed"]  # a dry run changes nothing

        at.number_input(key="apply_guard_s").set_value(1.0)
        at.button(key="apply_execute").click().run()
        assert not at.exception and not at.error, [e.value for e in at.error]
        deadline = time.monotonic() + 120
        rid = rec["recommendation_id"]
        while httpx.get(f"{url}/api/v1/recommendations/{rid}", timeout=30).json()["status"] != "applied":
            assert time.monotonic() < deadline, "the apply did not finish in 120 s"
            at.run()  # the page polls the progress (its fragment, every 2 s in a browser)
            assert not at.exception
            time.sleep(0.5)
        at.run()
        assert _roles(stack) == ["decode", "prefill"]
        said = texts(at)
        assert "**Realised vs predicted** (the last guard window)" in said
        realised = next(df.value for df in at.dataframe if "Predicted (simulated)" in df.value.columns)
        assert set(realised["Figure"]) >= {"goodput_rps_per_gpu", "ttft_p90_s", "j_per_token"}
        steps = next(
            df.value for df in at.dataframe if "Action" in df.value.columns and "What" in df.value.columns
        )
        assert list(steps["Action"]).count("guard") == 2 and "realised" in list(steps["Action"])

        at.button(key="rollback_ask").click().run()
        at.button(key="rollback_do").click().run()
        assert not at.exception and not at.error, [e.value for e in at.error]
        assert any(s.value.startswith("Rollback: rolled_back") for s in at.success)
        assert _roles(stack) == ["mixed", "mixed"]
        audit = next(df.value for df in at.dataframe if "Actor" in df.value.columns)
        assert {"apply", "set_role", "guard", "realised", "rollback"} <= set(audit["Action"])
    finally:
        stop_process(proc)
