"""What the pages that apply a recommendation share (the Recommendations page for layouts, the Power
page for power settings; the same ``POST /api/v1/recommendations/{id}/apply`` flow): a control request
whose refusal is shown instead of raised, the dry-run plan's view, and times in UTC."""

from __future__ import annotations

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
