"""Auto-apply of power recommendations under the one auto-apply policy (phaselens/apply/policy.py), on
the real emulated stack and a real store: off by default (the policy covers layout ones unless told),
under the confidence floor it skips, then it applies once and skips within its change budget; a lane
the runtime guard released keeps the stack's power recommendations off for 24 h. Every decision is an
``actions`` row."""

from __future__ import annotations

import copy
import secrets
import time
from pathlib import Path

from analytics.recommend.records import save_recommendation
from collector.store import Store
from phaselens.apply.audit import Audit
from phaselens.apply.coordinator import ApplyCoordinator
from phaselens.apply.policy import AutoApplyJob, AutoApplyPolicy, auto_apply_policy
from phaselens.cli import build_parser
from serving.testing import Server

from .conftest import TOKEN, at_defaults, knobs, power_rec, reset_knobs


def _rec(base: dict, level: str) -> dict:
    """``base`` as a new recommendation (its own id and time) at confidence ``level``."""
    rec = copy.deepcopy(base)
    rec["recommendation_id"] = f"rec-{int(time.time())}-{secrets.token_hex(3)}"
    rec["ts_s"] = time.time()
    rec["details"]["confidence"]["level"] = level
    rec["est_cost_change_usd_per_h"] = -0.05  # a saving
    return rec


def test_power_auto_apply_is_off_by_default_applies_once_and_keeps_its_budget(
    stack: Server, tmp_path: Path
) -> None:
    reset_knobs(stack)
    store = Store.open(tmp_path / "s.duckdb")
    try:
        audit = Audit(store, "test")
        coordinator = ApplyCoordinator(audit, TOKEN)
        base = power_rec(stack)
        low = _rec(base, "low")
        save_recommendation(store, low)

        # the policy's default covers layout recommendations only: a power one is left alone
        layout_only = AutoApplyJob(AutoApplyPolicy(guard_s=1), coordinator, audit, [stack.url])
        d = layout_only.tick()
        assert d["decision"] == "none" and d["reason"] == "no proposed layout recommendation for the stack"
        assert at_defaults(knobs(stack, "worker-1"))

        policy = AutoApplyPolicy(kinds=("power",), min_confidence="medium", max_per_day=1, guard_s=1)
        job = AutoApplyJob(policy, coordinator, audit, [stack.url])
        d = job.tick()
        assert d["kind"] == "power" and d["decision"] == "skip"
        assert d["reason"] == "confidence low is under the floor medium"

        good = _rec(base, "high")
        save_recommendation(store, good)  # supersedes the low one
        d = job.tick(wait=True)  # no traffic: its guard window is not judged
        assert d["decision"] == "apply" and d["outcome"] == "applied", (d, coordinator.last)
        assert d["predicted"]["saving_usd_per_h"] == 0.05 and d["predicted"]["confidence"] == "high"
        assert not at_defaults(knobs(stack, "worker-1"))
        assert audit.recommendation(good["recommendation_id"])["status"] == "applied"  # type: ignore[index]

        time.sleep(0.01)
        again = _rec(base, "high")
        save_recommendation(store, again)
        d = job.tick()
        assert d["decision"] == "skip"
        assert d["reason"] == "change budget spent: 1 of 1 auto-applies in the last 24 h"
        job.tick()  # the same skip: not written twice

        # a lane released by the runtime guard keeps power recommendations of the stack off for 24 h
        audit.append(
            [
                audit.row(
                    "power_release",
                    actor="phaselens-power-guard",
                    target=good["target"],
                    dry_run=False,
                    status="applied",
                    recommendation_id=good["recommendation_id"],
                    message="decode lane breached (SLO attainment 10.0% under 90%): its knob released",
                )
            ]
        )
        roomy = AutoApplyJob(
            AutoApplyPolicy(kinds=("layout", "power"), max_per_day=5, guard_s=1),
            coordinator,
            audit,
            [stack.url],
        )
        d = roomy.tick()
        assert [x["decision"] for x in d["decisions"]] == ["none", "skip"]
        assert d["reason"].startswith(
            "the runtime power guard released a lane of this stack in the last 24 h"
        )

        decisions = [
            (r["action"], r["recommendation_id"], r["after"]["kind"])
            for r in audit.actions()
            if r["action"].startswith("auto_")
        ]
        assert decisions == [
            ("auto_apply_skip", low["recommendation_id"], "power"),
            ("auto_apply", good["recommendation_id"], "power"),
            ("auto_apply_skip", again["recommendation_id"], "power"),
            ("auto_apply_skip", again["recommendation_id"], "power"),
        ]
    finally:
        store.close()
        reset_knobs(stack)


def test_auto_apply_kinds_flag_defaults_to_layout_and_is_checked() -> None:
    parse = build_parser().parse_args
    base = ["collect", "--serving", "http://x:1", "--auto-apply"]
    assert auto_apply_policy(parse(base)).kinds == ("layout",)  # type: ignore[union-attr]
    both = auto_apply_policy(parse([*base, "--auto-apply-kinds", "layout,power"]))
    assert both is not None and both.kinds == ("layout", "power")
    try:
        auto_apply_policy(parse([*base, "--auto-apply-kinds", "power,watts"]))
    except ValueError as e:
        assert "allowed: a comma list of layout, power" in str(e)
    else:
        raise AssertionError("--auto-apply-kinds power,watts was accepted")
