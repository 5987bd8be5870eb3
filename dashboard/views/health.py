"""Health: the collector service, its store writer and every source — status, lag, drops, telemetry
gaps and ingest errors. Reads ``GET /health`` and the ``ingest_errors`` / ``telemetry_gaps``
tables of the last 24 hours."""

from __future__ import annotations

import time
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import common
from dashboard.page_trust import PageTrust

ERRORS_SPAN_S = 86_400.0
STATUS_BADGE = {"ok": "green", "degraded": "orange", "down": "red", "unknown": "gray"}


def _ago(ts_s: float | None, now: float) -> str:
    if ts_s is None or pd.isna(ts_s):
        return "never"
    d = max(0.0, now - float(ts_s))
    if d < 120:
        return f"{d:.1f} s ago"
    if d < 7200:
        return f"{d / 60:.0f} min ago"
    return f"{d / 3600:.1f} h ago"


def _uptime(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _badge(status: str) -> str:
    return f":{STATUS_BADGE.get(status, 'gray')}-badge[{status}]"


def _sources_table(sources: list[dict[str, Any]], now: float) -> None:
    if not sources:
        st.info(
            "**No sources configured.** Start the collector with `--serving URL`, `--dcgm URL`, `--engine URL` "
            "or `--prometheus URL` (and NVML finds this host's GPUs by itself).",
            icon=":material/sensors_off:",
        )
        return
    rows = []
    for s in sources:
        rows.append(
            {
                "Source": s["name"],
                "Status": s["status"],
                "Lag": s.get("lag_s"),
                "Last success": _ago(s.get("last_success_s"), now),
                "Failures in a row": s.get("consecutive_failures", 0),
                "Rows": s.get("rows_total", 0),
                "Errors": s.get("errors_total", 0),
                "Rows refused by the store": s.get("store_rejected_rows", 0),
                # sources without telemetry cursors have no gaps to count: a dash, not "None"
                "Telemetry gaps": _count_or_dash(s.get("telemetry_gaps")),
                "Missing batches": _count_or_dash(s.get("telemetry_missing_batches")),
                "Last error": s.get("last_error") or "",
            }
        )
    st.dataframe(
        pd.DataFrame(rows),
        hide_index=True,
        width="stretch",
        column_config={
            "Lag": st.column_config.NumberColumn(
                "Lag", format="%.1f s", help="time since the last successful poll"
            ),
            "Rows": st.column_config.NumberColumn("Rows", format="%d"),
            "Last error": st.column_config.TextColumn("Last error", width="medium"),
        },
    )


def _count_or_dash(value: Any) -> str:
    """A count as text, or an em dash where the source has no such count."""
    return "—" if value is None else f"{int(value):,}"


def _writer(health: dict[str, Any], now: float) -> None:
    w = health.get("writer", {})
    written = w.get("rows_written", {}) or {}
    c = st.columns(5)
    c[0].metric("Rows written", f"{sum(written.values()):,}")
    c[1].metric(
        "Results dropped",
        f"{w.get('results_dropped', 0):,}",
        help="poll results lost: the writer fell behind",
    )
    c[2].metric("Store errors", f"{w.get('store_errors', 0):,}")
    c[3].metric(
        "Queue depth", f"{health.get('queue_depth', 0):,}", help="poll results waiting for the writer"
    )
    c[4].metric("Last flush", _ago(w.get("last_flush_s"), now))
    if w.get("last_error"):
        st.error(f"Last store error: {w['last_error']}")
    details = [
        f"{w.get('flushes', 0):,} flushes",
        f"{w.get('imports', 0):,} imports ({w.get('rows_imported', 0):,} rows)",
    ]
    dupes = sum((w.get("duplicates") or {}).values())
    if dupes:
        details.append(f"{dupes:,} telemetry batches read again and skipped")
    st.caption(" · ".join(details))
    if written:
        per_table = pd.DataFrame(
            sorted(written.items(), key=lambda kv: -kv[1]), columns=["Table", "Rows written"]
        )
        with st.expander("Rows written per table"):
            st.dataframe(per_table, hide_index=True, width="stretch")


def _reports(reports: dict[str, Any] | None, now: float) -> None:
    if not reports:
        return
    st.subheader("Scheduled reports")
    schedules = reports.get("schedules") or {}
    if not schedules:
        st.caption("No scheduled reports (`phaselens collect --report-schedule NAME=CRON` adds one).")
    else:
        nxt = reports.get("next_run_s") or {}
        rows = [
            {"Report": name, "Schedule (cron, UTC)": cron, "Next run (UTC)": _utc(nxt.get(name))}
            for name, cron in schedules.items()
        ]
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
        runs = int(reports.get("runs", 0))
        st.caption(f"{runs:,} report{'' if runs == 1 else 's'} made since the service started")
    if reports.get("last_error"):
        st.error(f"Last report failure: {reports['last_error']}", icon=":material/error:")


def _utc(ts_s: float | None) -> str:
    if ts_s is None or pd.isna(ts_s):
        return "—"
    return pd.Timestamp(float(ts_s), unit="s").strftime("%Y-%m-%d %H:%M")


def _ingest_errors(errors: pd.DataFrame) -> None:
    st.subheader("Ingest errors (last 24 h)")
    if errors.empty:
        st.success("No ingest errors recorded in the last 24 hours.", icon=":material/check_circle:")
        return
    errors = errors.assign(count=pd.to_numeric(errors.get("count", 1), errors="coerce").fillna(1))
    grouped = (
        errors.sort_values("ts_s")
        .groupby(["node", "source", "kind"], as_index=False)
        .agg(count=("count", "sum"), last_s=("ts_s", "max"), message=("message", "last"))
        .sort_values("count", ascending=False)
    )
    grouped["last"] = pd.to_datetime(grouped["last_s"], unit="s").dt.strftime("%Y-%m-%d %H:%M:%S")
    st.dataframe(
        grouped[["node", "source", "kind", "count", "last", "message"]],
        hide_index=True,
        width="stretch",
        column_config={
            "node": "Node",
            "source": "Source",
            "kind": "Kind",
            "count": st.column_config.NumberColumn("Count", format="%d"),
            "last": "Last seen (UTC)",
            "message": st.column_config.TextColumn("Last message", width="large"),
        },
    )


def _gaps(gaps: pd.DataFrame) -> None:
    if gaps.empty:
        return
    st.subheader("Telemetry gaps (last 24 h)")
    cols = [c for c in ("node", "source", "after_seq", "missing_batches", "detected_at_s") if c in gaps]
    view = gaps[cols].copy()
    if "detected_at_s" in view:
        view["detected_at_s"] = pd.to_datetime(view["detected_at_s"], unit="s").dt.strftime(
            "%Y-%m-%d %H:%M:%S"
        )
    st.dataframe(
        view,
        hide_index=True,
        width="stretch",
        column_config={
            "node": "Node",
            "source": "Source",
            "after_seq": "After batch",
            "missing_batches": "Missing batches",
            "detected_at_s": "Detected (UTC)",
        },
    )


def render() -> None:
    """The page body (re-run every few seconds while live refresh is on). Its figures are the
    service's own counters: measured."""
    trust = PageTrust()
    try:
        _body()
        trust.add(["measured"], primary=True)
    finally:
        trust.render()


def _body() -> None:
    now = time.time()
    api = common.client()
    with common.service_errors():
        health = api.health()
        errors = api.table("ingest_errors", now - ERRORS_SPAN_S, None, max_rows=10_000).rows
        gaps = api.table("telemetry_gaps", now - ERRORS_SPAN_S, None, max_rows=10_000).rows
    status = health.get("status", "unknown")
    st.markdown(
        f"Service {_badge(status)} · node `{health.get('node')}` · store `{health.get('db_path')}` "
        f"(schema {health.get('schema_version')}) · up {_uptime(float(health.get('uptime_s', 0)))}"
    )
    sources = health.get("sources", [])
    down = [s["name"] for s in sources if s.get("status") in ("down", "degraded")]
    if down:
        st.warning(f"**{len(down)} source(s) need attention:** {', '.join(down)}", icon=":material/warning:")
    st.subheader("Sources")
    for note in health.get("notes") or []:
        st.caption(f"Note: {note}")
    _sources_table(sources, now)
    st.subheader("Store writer")
    _writer(health, now)
    _reports(health.get("reports"), now)
    _ingest_errors(errors)
    _gaps(gaps)


st.title("Health")
refresh = st.toggle("Live refresh", value=True, key="health_refresh", help=f"every {common.REFRESH_S:g} s")


@st.fragment(run_every=common.REFRESH_S if refresh else None)
def _live() -> None:
    render()


_live()
