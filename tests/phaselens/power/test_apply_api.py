"""A power recommendation goes through the service like a layout one: listed by
GET /api/v1/recommendations, applied by POST /api/v1/recommendations/{id}/apply (dry run first: the
set_device plan; then executed behind the guard, audited in actions) and rolled back by
POST /api/v1/actions/{id}/rollback — on a real collector watching the real emulated stack. The
recommendation is made from a simulated calibration (test input: the sweep itself is tested in
test_calibrate_live.py), whose settings are real settings for the stack's decode worker."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from analytics.recommend.records import save_recommendation
from collector.store import Store
from phaselens.testing import start_collector
from serving.loadgen import run_load
from serving.testing import Server
from serving.trace import poisson_trace
from tests.conftest import stop_process

from .conftest import TOKEN, at_defaults, knobs, power_rec, reset_knobs

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def service(stack: Server, tmp_path: Path) -> Iterator[tuple[str, dict]]:
    reset_knobs(stack)
    db = tmp_path / "s.duckdb"
    rec = power_rec(stack)
    assert rec["proposed"]["settings"]["decode"]["knob"] == "sm_clock", rec["rationale"]
    with Store.open(db) as store:
        save_recommendation(store, rec)
    proc, url = start_collector(
        db, "--serving", stack.url, "--control-token", TOKEN, "--report-schedule", "off"
    )
    yield url, rec
    stop_process(proc)
    reset_knobs(stack)


def test_power_recommendation_lists_applies_behind_the_guard_and_rolls_back(
    stack: Server, service: tuple[str, dict]
) -> None:
    url, rec = service
    rid = rec["recommendation_id"]
    setting = rec["proposed"]["settings"]["decode"]["setting"]
    with httpx.Client(base_url=url, timeout=60) as c:
        listed = c.get("/api/v1/recommendations").json()["recommendations"]
        assert [(r["recommendation_id"], r["kind"]) for r in listed] == [(rid, "power")]
        dry = c.post(f"/api/v1/recommendations/{rid}/apply", headers=AUTH)
        assert dry.status_code == 202, dry.text
        body = dry.json()
        assert body["dry_run"] is True and [s["action"] for s in body["steps"]] == ["set_device"]
        assert f"set worker-1 (decode) to {setting['label']}" in body["plan"]
        assert at_defaults(knobs(stack, "worker-1"))
        load = threading.Thread(
            target=run_load,
            args=(stack.url, poisson_trace(4.0, 16, prompt_tokens=(32, 128), output_tokens=16, seed=3)),
            kwargs={"progress": False},
            daemon=True,
        )
        load.start()
        run = c.post(
            f"/api/v1/recommendations/{rid}/apply",
            json={"dry_run": False, "guard_s": 2, "settle_s": 0.5},
            headers=AUTH,
        )
        assert run.status_code == 202, run.text
        deadline = time.monotonic() + 60
        while (got := c.get("/api/v1/actions", params={"recommendation_id": rid}).json())[
            "running"
        ] is not None:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        load.join(timeout=60)
        assert got["last"]["outcome"] == "applied", got["last"]
        k = knobs(stack, "worker-1")
        assert (k["locked_sm_clock_min_mhz"], k["locked_sm_clock_max_mhz"]) == (
            setting["sm_clock_min_mhz"],
            setting["sm_clock_max_mhz"],
        )
        acts = [(a["action"], a["status"]) for a in got["actions"] if not a["dry_run"]]
        assert (
            ("set_device", "applied") in acts
            and ("guard", "applied") in acts
            and acts[-1] == ("realised", "applied")
        )
        back = c.post(f"/api/v1/actions/{rid}/rollback", json={}, headers=AUTH)
        assert back.status_code == 200 and back.json()["outcome"] == "rolled_back", back.text
        assert at_defaults(knobs(stack, "worker-1"))
        assert c.get(f"/api/v1/recommendations/{rid}").json()["status"] == "rolled_back"
