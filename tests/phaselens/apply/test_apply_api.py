"""The service API of applying (phaselens/apply_api.py) on a real collector (`phaselens collect`
with --auto-apply) watching a real emulated stack: token checks, dry run, one apply at a time with
its live progress, rollback, and the auto-apply policy's decisions listed by GET /api/v1/actions."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from phaselens.apply.testing import recommendation_row
from phaselens.cli import main
from phaselens.testing import start_collector
from serving.testing import Server
from tests.conftest import stop_process

from .conftest import TOKEN, reset_layout, roles, write_recs

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def service(stack: Server, tmp_path: Path) -> Iterator[tuple[str, dict, dict]]:
    reset_layout(stack)
    db = tmp_path / "s.duckdb"
    apply_me = recommendation_row(stack.url, "agg:2xh200", "1p1d:h200")
    unsure = recommendation_row(
        stack.url, "agg:2xh200", "1p1d:h200", confidence="medium", saving_usd_per_h=5.0
    )
    unsure["ts_s"] = apply_me["ts_s"] + 1  # the newest: the one the policy decides about
    write_recs(db, [apply_me, unsure])
    proc, url = start_collector(
        db,
        "--serving",
        stack.url,
        "--control-token",
        TOKEN,
        "--report-schedule",
        "off",
        "--auto-apply",
        "--auto-apply-interval-s",
        "1",
        "--auto-apply-min-confidence",
        "high",
    )
    yield url, apply_me, unsure
    stop_process(proc)
    reset_layout(stack)


def test_apply_api_tokens_dry_run_one_at_a_time_progress_rollback_and_auto_apply(
    stack: Server, service: tuple[str, dict, dict], capsys: pytest.CaptureFixture[str]
) -> None:
    url, rec, unsure = service
    rid = rec["recommendation_id"]
    with httpx.Client(base_url=url, timeout=60) as c:
        # the policy (every 1 s, confidence floor high) skips the newest recommendation and says why
        deadline = time.monotonic() + 20
        while not any(r["action"] == "auto_apply_skip" for r in c.get("/api/v1/actions").json()["actions"]):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        path = f"/api/v1/recommendations/{rid}/apply"
        assert c.post(path).status_code == 401
        assert c.post(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        bad = c.post(path, json={"dry_run": "no"}, headers=AUTH)
        assert bad.status_code == 400 and "'dry_run' must be true or false" in bad.json()["error"]["message"]
        bad = c.post(path, json={"guard": 1}, headers=AUTH)
        assert bad.status_code == 400 and "unknown field(s) guard" in bad.json()["error"]["message"]
        assert c.post("/api/v1/recommendations/rec-nope/apply", headers=AUTH).status_code == 404

        dry = c.post(path, headers=AUTH)
        assert dry.status_code == 202 and dry.json()["dry_run"] is True
        assert [s["action"] for s in dry.json()["steps"]] == ["set_role", "set_role"]
        assert roles(stack) == ["mixed", "mixed"]

        run = c.post(path, json={"dry_run": False, "guard_s": 2, "settle_s": 0.2}, headers=AUTH)
        assert run.status_code == 202, run.text
        again = c.post(path, json={"dry_run": False}, headers=AUTH)
        assert (
            again.status_code == 409 and "one apply or rollback at a time" in again.json()["error"]["message"]
        )
        progress = c.get("/api/v1/actions", params={"recommendation_id": rid}).json()["running"]
        assert progress["state"] in ("applying", "guarding") and progress["steps"] == 2
        deadline = time.monotonic() + 30
        while (got := c.get("/api/v1/actions", params={"recommendation_id": rid}).json())["running"]:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert got["last"]["outcome"] == "applied" and roles(stack) == ["decode", "prefill"]
        assert got["actions"][-1]["action"] == "realised"

        back = c.post(f"/api/v1/actions/{run.json()['apply_action_id']}/rollback", headers=AUTH)
        assert back.status_code == 200 and back.json()["outcome"] == "rolled_back", back.text
        assert roles(stack) == ["mixed", "mixed"]
        assert c.post("/api/v1/actions/act-nope/rollback", headers=AUTH).status_code == 404
        assert c.post(f"/api/v1/actions/{rid}/rollback").status_code == 401

        # the CLI through the collector: it posts, then follows the rows until the apply ends
        other = unsure["recommendation_id"]
        assert main(["apply", other, "--collector", url, "--token", "wrong"]) == 2
        assert "answered 401" in capsys.readouterr().err
        assert main(["apply", other, "--collector", url, "--token", TOKEN]) == 0
        assert "dry run: nothing changed" in capsys.readouterr().out and roles(stack) == ["mixed", "mixed"]
        cli = [
            "apply",
            other,
            "--collector",
            url,
            "--token",
            TOKEN,
            "--execute",
            "--guard-s",
            "1",
            "--settle-s",
            "0.2",
        ]
        assert main(cli) == 0
        out = capsys.readouterr().out
        assert (
            "guard [applied]" in out
            and "realised [applied]" in out
            and out.rstrip().endswith("every guard window passed")
        )
        assert roles(stack) == ["decode", "prefill"]
        assert main(["rollback", other, "--collector", url, "--token", TOKEN]) == 0
        assert "rolled_back: the stack has 2 mixed" in capsys.readouterr().out and roles(stack) == [
            "mixed",
            "mixed",
        ]

        # each skip reason once (while the apply ran, the policy may also have skipped: guard window open)
        decisions = [r for r in c.get("/api/v1/actions").json()["actions"] if r["action"].startswith("auto_")]
        assert {d["action"] for d in decisions} == {"auto_apply_skip"}
        assert {d["recommendation_id"] for d in decisions} == {unsure["recommendation_id"]}
        reasons = [d["message"] for d in decisions]
        assert reasons[0] == "confidence medium is under the floor high" and len(set(reasons)) == len(reasons)
        assert set(reasons) <= {reasons[0], "an apply is running (its guard window is open)"}
        health = c.get("/api/v1/actions").json()["auto_apply"]
        assert health["enabled"] is True and health["policy"]["min_confidence"] == "high"
