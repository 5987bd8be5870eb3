"""The auto-apply policy on a real emulated stack and a real store: it skips under its confidence
floor, applies once, then skips within its change budget — each decision an actions row."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from collector.store import Store
from collector.store.updates import set_recommendation_status
from phaselens.apply.audit import Audit
from phaselens.apply.coordinator import ApplyCoordinator
from phaselens.apply.policy import AutoApplyJob, AutoApplyPolicy, parse_quiet_hours
from phaselens.apply.testing import recommendation_row
from serving.testing import Server

from .conftest import TOKEN, background_load, reset_layout, roles


def test_policy_applies_once_then_skips_within_its_change_budget(stack: Server, tmp_path: Path) -> None:
    reset_layout(stack)
    store = Store.open(tmp_path / "s.duckdb")
    try:
        audit = Audit(store, "test")
        policy = AutoApplyPolicy(
            min_saving_usd_per_h=0.5, min_confidence="medium", max_per_day=1, guard_s=1.5
        )
        job = AutoApplyJob(policy, ApplyCoordinator(audit, TOKEN), audit, [stack.url])
        assert job.tick()["decision"] == "none"

        low = recommendation_row(stack.url, "agg:2xh200", "1p1d:h200", confidence="low", saving_usd_per_h=3.0)
        store.append("recommendations", [low])
        d = job.tick()
        assert d["decision"] == "skip" and d["reason"] == "confidence low is under the floor medium"
        set_recommendation_status(store, low["recommendation_id"], "dismissed")

        small = recommendation_row(stack.url, "agg:2xh200", "1p1d:h200", saving_usd_per_h=0.2)
        store.append("recommendations", [small])
        assert "does not exceed the threshold $0.50/h" in job.tick()["reason"]
        set_recommendation_status(store, small["recommendation_id"], "dismissed")

        good = recommendation_row(stack.url, "agg:2xh200", "1p1d:h200", saving_usd_per_h=2.0)
        store.append("recommendations", [good])
        with background_load(stack.url):
            d = job.tick(wait=True)
        assert d["decision"] == "apply" and d["outcome"] == "applied", (d, job.coordinator.last)
        assert roles(stack) == ["decode", "prefill"]
        assert audit.recommendation(good["recommendation_id"])["status"] == "applied"  # type: ignore[index]

        time.sleep(0.01)
        back = recommendation_row(stack.url, "1p1d:h200", "agg:2xh200", saving_usd_per_h=2.0)
        store.append("recommendations", [back])
        d = job.tick()
        assert (
            d["decision"] == "skip"
            and d["reason"] == "change budget spent: 1 of 1 auto-applies in the last 24 h"
        )
        job.tick()  # the same skip again: not written twice
        assert roles(stack) == ["decode", "prefill"]  # unchanged

        rows = audit.actions()
        decisions = [
            (r["action"], r["recommendation_id"], r["message"])
            for r in rows
            if r["action"].startswith("auto_")
        ]
        assert decisions == [
            ("auto_apply_skip", low["recommendation_id"], "confidence low is under the floor medium"),
            ("auto_apply_skip", small["recommendation_id"], decisions[1][2]),
            ("auto_apply", good["recommendation_id"], "the policy allows it"),
            (
                "auto_apply_skip",
                back["recommendation_id"],
                "change budget spent: 1 of 1 auto-applies in the last 24 h",
            ),
        ]
        assert all(
            r["actor"] == "phaselens-auto-apply"
            for r in rows
            if r["recommendation_id"] == good["recommendation_id"]
        )
        assert job.applied_last_day(time.time() + 86_401) == 0  # the budget is a rolling 24 h
    finally:
        store.close()
        reset_layout(stack)


def test_quiet_hours_wrap_midnight_and_bad_ones_are_refused() -> None:
    policy = AutoApplyPolicy(quiet_hours=parse_quiet_hours("22-6"))
    day = 1_700_000_000 - 1_700_000_000 % 86_400
    assert policy.in_quiet_hours(day + 23 * 3600) and policy.in_quiet_hours(day + 5 * 3600)
    assert not policy.in_quiet_hours(day + 12 * 3600)
    for bad in ("22", "25-3", "x-y", "4-4"):
        try:
            parse_quiet_hours(bad)
        except ValueError as e:
            assert "START-END in whole UTC hours" in str(e)
        else:
            raise AssertionError(bad)


def test_collect_auto_apply_flags_are_off_by_default_and_checked() -> None:
    from phaselens.apply.policy import auto_apply_policy
    from phaselens.cli import build_parser

    parse = build_parser().parse_args
    assert auto_apply_policy(parse(["collect", "--serving", "http://127.0.0.1:8000"])) is None
    on = auto_apply_policy(
        parse(
            [
                "collect",
                "--serving",
                "http://x:1",
                "--auto-apply",
                "--auto-apply-max-per-day",
                "2",
                "--auto-apply-quiet-hours",
                "22-6",
                "--auto-apply-min-confidence",
                "high",
                "--auto-apply-dry-run",
            ]
        )
    )
    assert on is not None and on.max_per_day == 2 and on.quiet_hours == (22, 6) and on.dry_run
    for argv, message in (
        (["--auto-apply"], "--auto-apply needs the stack to apply to: --serving URL"),
        (
            ["--serving", "u", "--auto-apply", "--auto-apply-min-confidence", "sure"],
            "allowed: low, medium, high",
        ),
        (["--serving", "u", "--auto-apply", "--auto-apply-max-per-day", "0"], "must be in [1, 100]"),
        (["--serving", "u", "--auto-apply", "--auto-apply-guard-s", "0"], "guard_s must be in (0, 3600]"),
    ):
        try:
            auto_apply_policy(parse(["collect", *argv]))
        except ValueError as e:
            assert message in str(e), (argv, str(e))
        else:
            raise AssertionError(argv)


def test_collect_auto_apply_re_recommends_from_the_stacks_latest_window(
    stack: Server, tmp_path: Path, monkeypatch
) -> None:
    """``phaselens collect --auto-apply``: before each decision the job runs the recommender over the
    watched stack's last window (its requests as the trace, its devices' roles as the current
    layout, its measured figures as the confidence), stores the row and decides on it (dry run)."""
    import httpx

    from tests.collector.conftest import start_collector

    reset_layout(stack)
    monkeypatch.delenv("PHASELENS_CONTROL_TOKEN", raising=False)
    proc, url = start_collector(
        tmp_path / "c.duckdb", "--serving", stack.url, "--control-token", TOKEN, "--report-schedule", "off",
        "--auto-apply", "--auto-apply-dry-run", "--auto-apply-interval-s", "3", "--auto-apply-window-s", "60",
        "--auto-apply-min-confidence", "low", "--auto-apply-slo-ttft-ms", "5000", "--auto-apply-slo-tpot-ms", "500",
    )  # fmt: skip
    try:
        with background_load(stack.url):
            deadline = time.monotonic() + 120
            while True:
                state = httpx.get(f"{url}/api/v1/actions", timeout=10).json()["auto_apply"]
                last = state.get("last_decision") or {}
                if last.get("recommended"):
                    break
                assert time.monotonic() < deadline, state
                time.sleep(0.5)
        rid = last["recommended"]
        assert last["recommendation_id"] == rid  # the decision is on the fresh recommendation
        rec = httpx.get(f"{url}/api/v1/recommendations/{rid}", timeout=10).json()
        inputs = rec["details"]["inputs"]
        assert rec["target"] == f"stack:{stack.url}" and inputs["model"] == "llama-3.1-70b"
        assert inputs["workload_id"].startswith("wl-")
        assert inputs["window"]["end_s"] - inputs["window"]["start_s"] == pytest.approx(60.0)
        assert (
            rec["current"]["layout"].startswith("agg:2xh200:")
            and "(2 mixed)" in inputs["from_window"]["layout_from"]
        )
        assert (
            rec["details"]["measured"]["trust"] == "emulated" and rec["details"]["measured"]["requests"] >= 2
        )
        assert rec["details"]["confidence"]["level"] in ("high", "medium", "low")
        assert roles(stack) == ["mixed", "mixed"]  # a dry run changes nothing
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        reset_layout(stack)
