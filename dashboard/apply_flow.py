"""What the pages that apply a recommendation share (the Recommendations page for layouts, the Power
page for power settings; the same ``POST /api/v1/recommendations/{id}/apply`` flow): the Apply →
dry-run plan → Execute / Cancel and Roll back controls, the running apply's progress, a control
request whose refusal is shown instead of raised, the dry-run plan's view, and times in UTC."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import common
from dashboard.api import ApiError, ServiceUnavailable
from dashboard.figures import recommend as rf


def utc(ts_s: Any, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """``ts_s`` (epoch seconds) as a UTC time, or — when it is not a number."""
    try:
        return datetime.fromtimestamp(float(ts_s), UTC).strftime(fmt)
    except (TypeError, ValueError):
        return "—"


def control(call: Any, what: str) -> Any:
    """Run a control request; a refusal is shown (the page goes on), None returned."""
    try:
        return call()
    except ApiError as e:
        hint = ""
        if e.status in (401, 403):
            hint = " (the control token: start the dashboard with PHASELENS_CONTROL_TOKEN, or type it above)"
        st.error(f"**{what} refused** ({e.status}): {e.message}{hint}", icon=":material/block:")
    except ServiceUnavailable as e:
        st.error(f"**{what} failed**: {e}", icon=":material/power_off:")
    return None


def plan_view(plan: dict[str, Any]) -> None:
    """A dry run's answer: the plan, its steps with their action ids, the guard in words."""
    st.markdown("**Dry-run plan** (nothing has changed yet)")
    st.code(str(plan.get("plan") or ""), language=None)
    steps = plan.get("steps") or []
    if steps:
        st.dataframe(
            pd.DataFrame(
                [
                    {"#": i, "Step": s.get("text"), "Action id": s.get("action_id")}
                    for i, s in enumerate(steps, 1)
                ]
            ),
            hide_index=True,
            width="stretch",
        )
    if plan.get("guard"):
        st.caption(common.plain_md(f"Guard: {rf.guard_text(plan['guard'])}."))


@dataclass(frozen=True)
class ApplyFlow:
    """One page's apply, confirm and roll-back controls: its widget keys (``prefix`` + name; the
    guard window's key as given), its session-state keys and the words it says about what it changes."""

    prefix: str  # e.g. "power_": keys power_apply_plan, power_apply_execute, power_rollback_do ...
    guard_key: str
    plans_key: str  # session state: recommendation id -> its dry-run plan (the confirmation step)
    running_key: str  # session state: the recommendation id whose apply this session started
    guard_help: str
    applied_caption: str
    rollback_question: str
    not_proposed: str
    rolled_back: Callable[[dict[str, Any]], str] = lambda done: f"Rollback: {done.get('outcome')}"
    poll_s: float = 2.0  # how often a running apply's progress is read

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"


def apply_controls(flow: ApplyFlow, rid: str, status: Any) -> None:
    """Apply… (a dry run: the plan) → Execute with a guard window, or Cancel; Roll back… → Roll back
    now for an applied one; a caption for any other status."""
    plans: dict[str, Any] = st.session_state.setdefault(flow.plans_key, {})
    if status == "proposed":
        if st.button(
            "Apply…",
            key=flow.key("apply_plan"),
            icon=":material/play_arrow:",
            help="a dry run first: the plan",
        ):
            plan = control(lambda: common.control_client().apply(rid, dry_run=True), "The dry run")
            if plan:
                plans[rid] = plan
        plan = plans.get(rid)
        if plan:
            plan_view(plan)
            guard_s = st.number_input(
                "Guard window after each step, s", 1.0, 3600.0, 30.0, key=flow.guard_key, help=flow.guard_help
            )
            c1, c2, _ = st.columns([1, 1, 3])
            if c1.button(
                "Execute this plan", type="primary", key=flow.key("apply_execute"), icon=":material/check:"
            ):
                started = control(
                    lambda: common.control_client().apply(rid, dry_run=False, guard_s=float(guard_s)),
                    "The apply",
                )
                if started:
                    st.session_state[flow.running_key] = rid
                    plans.pop(rid, None)
                    st.rerun()
            if c2.button("Cancel", key=flow.key("apply_cancel")):
                plans.pop(rid, None)
                st.rerun()
    elif status == "applied":
        st.caption(flow.applied_caption)
        confirm = flow.key("rollback_confirm")
        if st.button("Roll back…", key=flow.key("rollback_ask"), icon=":material/undo:"):
            st.session_state[confirm] = rid
        if st.session_state.get(confirm) == rid:
            st.warning(flow.rollback_question, icon=":material/undo:")
            if st.button("Roll back now", type="primary", key=flow.key("rollback_do")):
                done = control(lambda: common.control_client().rollback(rid), "The rollback")
                st.session_state.pop(confirm, None)
                if done:
                    st.success(flow.rolled_back(done))
    else:
        st.caption(f"Status {status}: {flow.not_proposed}")


def apply_progress(
    flow: ApplyFlow, rid: str, then: Callable[[list[dict[str, Any]]], None] | None = None
) -> None:
    """The running apply's step and guard window, read every ``poll_s`` while this session's apply
    runs (the page re-run when it ends); ``then(actions)`` draws what the page adds below it."""
    running_here = st.session_state.get(flow.running_key) == rid

    @st.fragment(run_every=flow.poll_s if running_here else None)
    def live() -> None:
        with common.service_errors():
            got = common.client().actions(recommendation_id=rid)
        running = got.get("running")
        if running and running.get("recommendation_id") == rid:
            steps = max(1, int(running.get("steps") or 1))
            st.progress(
                min(1.0, int(running.get("step") or 0) / steps),
                text=f"{running.get('state')}: step {running.get('step')} of {running.get('steps')} — "
                f"{running.get('current_step') or ''}",
            )
            if running.get("guard_left_s") is not None:
                st.caption(f"Guard window: {running['guard_left_s']:.0f} s left")
        elif running_here:
            st.session_state.pop(flow.running_key, None)
            st.rerun()  # finished: the status, the audit and the realised figures changed
        if then is not None:
            then(got.get("actions") or [])

    live()
