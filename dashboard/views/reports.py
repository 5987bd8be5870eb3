"""Reports: the efficiency reports the service made (hourly, daily, on demand) — list, open and
download (the self-contained HTML page, or the summary JSON); make one now."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pandas as pd
import streamlit as st
import streamlit.components.v1 as components

from dashboard import common
from dashboard.page_trust import PageTrust, render_with_trust

MAKE_SPANS = {"last hour": "1h", "last 24 hours": "24h", "last 7 days": "7d"}


def _utc(ts_s: float | None, fmt: str = "%Y-%m-%d %H:%M") -> str:
    return "—" if ts_s is None or pd.isna(ts_s) else datetime.fromtimestamp(float(ts_s), UTC).strftime(fmt)


def _make_now() -> None:
    with st.popover("Make a report now", icon=":material/add_chart:"):
        span = st.selectbox("Window", list(MAKE_SPANS), index=1, key="make_span")
        if st.button("Make it", type="primary", key="make_report"):
            with common.service_errors(), st.spinner("Running the analysis ..."):
                made = common.control_client().make_report(since=MAKE_SPANS[span])
            st.session_state["report_pick"] = made["report_id"]
            st.success(f"Made: {made['title']}")


def render() -> None:
    """The page body: its one trust block lists the open report's labels."""
    render_with_trust(_body)


def _body(trust: PageTrust) -> None:
    api = common.client()
    _make_now()
    with common.service_errors():
        reports = api.reports(limit=500)
    if not reports:
        st.info(
            "**No reports yet.** The service makes one every hour and every morning (`phaselens collect "
            "--report-schedule NAME=CRON` sets the schedules); `phaselens report --since 24h` makes one now.",
            icon=":material/description:",
        )
        return
    kinds = sorted({r["kind"] for r in reports})
    chosen = st.pills("Kind", kinds, selection_mode="multi", key="report_kinds") or kinds
    shown = [r for r in reports if r["kind"] in chosen]
    table = pd.DataFrame(
        {
            "Made (UTC)": [_utc(r["ts_s"]) for r in shown],
            "Kind": [r["kind"] for r in shown],
            "Window (UTC)": [f"{_utc(r['start_s'])} – {_utc(r['end_s'], '%H:%M')}" for r in shown],
            "Data set": [r.get("dataset") or "live" for r in shown],
            "Data": [", ".join(common.ordered_labels(r.get("trust") or [])) or "—" for r in shown],
            "Summary": ["failed: " + r["error"] if r.get("error") else "ok" for r in shown],
        }
    )
    st.dataframe(table, hide_index=True, width="stretch", height=min(420, 38 + 35 * len(shown)))
    if not shown:
        return
    ids = [r["report_id"] for r in shown]
    by_id = {r["report_id"]: r for r in shown}
    if st.session_state.get("report_pick") not in ids:
        st.session_state["report_pick"] = ids[0]
    pick = st.selectbox(
        "Open report",
        ids,
        key="report_pick",
        format_func=lambda i: f"{by_id[i]['title']} ({by_id[i]['kind']})",
    )
    with common.service_errors():
        page = api.report_page(pick)
        detail = api.report_json(pick)
    stamp = _utc(by_id[pick]["ts_s"], "%Y%m%dT%H%M")
    c1, c2, _ = st.columns([1, 1, 4])
    c1.download_button(
        "Download HTML",
        page.encode(),
        file_name=f"phaselens-report-{by_id[pick]['kind']}-{stamp}.html",
        mime="text/html",
        icon=":material/download:",
    )
    c2.download_button(
        "Download JSON",
        json.dumps(detail.get("summary"), indent=1).encode(),
        file_name=f"phaselens-report-{by_id[pick]['kind']}-{stamp}.json",
        mime="application/json",
        icon=":material/data_object:",
    )
    if detail.get("error"):
        st.warning(f"This report has no summary: {detail['error']}", icon=":material/warning:")
    trust.add((detail.get("summary") or {}).get("trust", {}).get("labels") or [], primary=True)
    # the page is the service's own rendering (every value escaped), scripts are Plotly's
    if hasattr(st, "iframe"):
        st.iframe(page, height=900)
    else:  # Streamlit before st.iframe
        components.html(page, height=900, scrolling=True)


st.title("Reports")
st.caption(
    "Efficiency reports made by the service: hourly, daily and on demand. Each is one HTML file, readable offline."
)
render()
