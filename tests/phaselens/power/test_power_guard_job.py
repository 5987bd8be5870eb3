"""The runtime power guard as a job of the service, live: ``phaselens collect`` watching the real
emulated stack (1 prefill + 1 decode) judges each lane of an applied power recommendation every
window; a forced breach of the decode lane (an impossible TPOT) releases that lane only — its knob back
to the defaults, a ``power_release`` row — while the prefill lane, within its TTFT, keeps its knob."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from analytics.recommend.records import save_recommendation
from collector.store import Store
from phaselens.apply.audit import Audit
from phaselens.power.plan import Setting
from phaselens.testing import start_collector
from serving.loadgen import run_load
from serving.testing import Server
from serving.trace import poisson_trace
from tests.conftest import stop_process

from .conftest import TOKEN, at_defaults, knobs, power_rec, reset_knobs

AUTH = {"Authorization": f"Bearer {TOKEN}"}
CLOCK = Setting("sm_clock", None, 345, 1155).as_dict()


def test_the_service_releases_the_breaching_lane_only(stack: Server, tmp_path: Path) -> None:
    reset_knobs(stack)
    db = tmp_path / "s.duckdb"
    rec = power_rec(stack, roles=("prefill", "decode"))
    for item in rec["proposed"]["settings"].values():
        if item["setting"].get("knob") != "sm_clock":  # both lanes must hold a knob to tell them apart
            item["setting"] = dict(CLOCK)
    rec["details"]["inputs"]["slo"] = {"ttft_s": 30.0, "tpot_s": 1e-6, "target": 0.9}  # no decode meets it
    rid = rec["recommendation_id"]
    with Store.open(db) as store:
        save_recommendation(store, rec)
    proc, url = start_collector(
        db, "--serving", stack.url, "--control-token", TOKEN, "--report-schedule", "off",
        "--power-guard-window-s", "2",
    )  # fmt: skip
    load = threading.Thread(
        target=run_load,
        args=(stack.url, poisson_trace(4.0, 48, prompt_tokens=(32, 128), output_tokens=16, seed=7)),
        kwargs={"progress": False},
        daemon=True,
    )
    try:
        with httpx.Client(base_url=url, timeout=60) as c:
            # applied with no traffic: the apply's own guard window is not judged
            run = c.post(
                f"/api/v1/recommendations/{rid}/apply",
                json={"dry_run": False, "guard_s": 1, "settle_s": 0.2},
                headers=AUTH,
            )
            assert run.status_code == 202, run.text
            deadline = time.monotonic() + 60
            while c.get("/api/v1/actions").json()["running"] is not None:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            assert not at_defaults(knobs(stack, "worker-0")) and not at_defaults(knobs(stack, "worker-1"))
            load.start()
            deadline, prefill_kept = time.monotonic() + 90, []
            while True:
                got = c.get("/api/v1/actions", params={"recommendation_id": rid}).json()
                released = [a for a in got["actions"] if a["action"] == "power_release"]
                last = (got["power_guard"].get("last") or {}).get("recommendations") or [{}]
                prefill_kept += [
                    v for v in last[0].get("lanes") or [] if v["role"] == "prefill" and v["requests"] > 0
                ]
                if released and prefill_kept:
                    break
                assert time.monotonic() < deadline, got["power_guard"]
                time.sleep(0.3)
        load.join(timeout=60)
        assert got["power_guard"]["enabled"] and got["power_guard"]["guarding"] == [rid]
        (row,) = released
        assert row["after"]["role"] == "decode" and row["after"]["source"] == "service"
        assert row["status"] == "applied" and row["before"]["window"]["requests"] > 0
        assert "decode lane breached (SLO attainment 0.0%" in row["message"]
        assert all(v["passed"] and "released" not in v for v in prefill_kept), prefill_kept
        assert at_defaults(knobs(stack, "worker-1"))  # the decode lane released
        assert not at_defaults(knobs(stack, "worker-0"))  # the prefill lane kept
    finally:
        stop_process(proc)
        load.join(timeout=60)
        reset_knobs(stack)
    with Store.open(db) as store:
        assert Audit(store, "t").recommendation(rid)["status"] == "applied"  # one lane still set


def test_a_bad_power_guard_window_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from phaselens.cli import main

    db = str(tmp_path / "s.duckdb")
    assert main(["collect", "--db", db, "--power-guard-window-s", "0.5"]) == 2
    assert "--power-guard-window-s must be 0 (off) or in [1, 3600] s, got 0.5" in capsys.readouterr().err
