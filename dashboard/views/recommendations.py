"""Recommendations: the serving layouts (and engine settings) the service recommends for the traffic at
the SLOs — the candidates as a table and as the Pareto chart (tokens/s per GPU vs per user, the current
layout marked, those meeting the SLOs filled), the chosen one's predicted impact and how sure it is;
make one; apply it to the bundled stack (a dry-run plan first, then the steps and guard windows live,
then realised vs predicted); roll it back; the audit of every change and auto-apply decision.

Reads and writes only through the service API (``dashboard/api.py``): ``/api/v1/recommendations``,
``/api/v1/recommendations/{id}/apply``, ``/api/v1/actions`` (docs/RECOMMENDATIONS.md).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import common
from dashboard.api import ApiError, ServiceUnavailable
from dashboard.apply_flow import ApplyFlow, apply_controls, apply_progress
from dashboard.apply_flow import control as _control
from dashboard.apply_flow import utc as _utc
from dashboard.figures import recommend as rf
from dashboard.page_trust import PageTrust, render_with_trust

PICK = "rec_pick"
FLOW = ApplyFlow(
    prefix="",
    guard_key="apply_guard_s",
    plans_key="rec_plans",
    running_key="rec_running",
    guard_help="How long the live traffic is watched after each step before the next (breach: roll back)",
    applied_caption="Applied. Rolling back restores the layout from before the apply (no guard window).",
    rollback_question="Roll the stack back to the layout before this apply?",
    not_proposed="only a proposed recommendation can be applied (make a new one).",
    rolled_back=lambda done: f"Rollback: {done.get('outcome')} (roles now {done.get('roles')})",
)
DECISIONS = ("auto_apply", "auto_apply_skip")


# -- making one ----------------------------------------------------------------------------------------


def _defaults(rec: dict[str, Any] | None) -> dict[str, Any]:
    d = rf.details_of(rec)
    inputs = d.get("inputs") or {}
    slo = inputs.get("slo") or {}
    return {
        "layout": rf.current_layout(rec or {}) or "",
        "model": inputs.get("model") or (rec or {}).get("proposed", {}).get("model") or "llama-3.1-70b",
        "ttft_ms": float(slo.get("ttft_s") or 1.0) * 1e3,
        "tpot_ms": float(slo.get("tpot_s") or 0.03) * 1e3,
        "target_pct": float(slo.get("target") or 0.9) * 100,
        "for": (rec or {}).get("target") or _stack_target(),
    }


def _stack_target() -> str:
    """``stack:<URL>`` of the bundled stack the collector reads (its ``serving:`` source; an older
    collector's ``serving-telemetry:``), or ''."""
    try:
        sources = common.client().health().get("sources") or []
    except (ApiError, ServiceUnavailable):
        return ""
    for name in (str(s.get("name", "")) for s in sources):
        for prefix in ("serving:", "serving-telemetry:"):
            if name.startswith(prefix):
                return f"stack:{name.removeprefix(prefix)}"
    return ""


def observed_traffic(api: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The traffic of a stored window, as the recommendation's inline trace: the service observes
    the window's workload and stores it (``POST /api/v1/workload``), and the same trace it synthesized
    (same workload, duration and seed) is drawn here. The body's ``requests``, ``trace_desc``,
    ``workload_id`` (the stored observed workload: the daily report checks drift against it) and
    ``window``."""
    from analytics.workload.model import Workload
    from analytics.workload.synthesize import synthesize_trace

    got = api.save_workload(**params)
    syn = got["synthesis"]
    trace = synthesize_trace(
        Workload.from_dict(got["observed"]),
        duration_s=float(syn["duration_s"]),
        rate_scale=float(syn["rate_scale"]),
        seed=int(syn["seed"]),
    )
    w = got.get("window") or {}
    return {
        "requests": [[round(r.arrival_s, 6), r.prompt_tokens, r.output_tokens] for r in trace],
        "trace_desc": f"synthesized from the observed workload {got['observed_id']} of "
        f"{params.get('dataset', 'live')} ({len(trace):,} requests in {float(syn['duration_s']):,.0f} s)",
        "workload_id": got["observed_id"],
        "window": [w.get("start_s"), w.get("end_s")] if w.get("start_s") is not None else None,
    }


def make_body(form: dict[str, Any]) -> dict[str, Any]:
    """The ``POST /api/v1/recommendations`` body of the form's values (without the observed traffic,
    which :func:`observed_traffic` adds)."""
    body: dict[str, Any] = {
        "layout": form["layout"].strip(),
        "model": form["model"].strip(),
        "slo_ttft_ms": float(form["ttft_ms"]),
        "slo_tpot_ms": float(form["tpot_ms"]),
        "slo_target": float(form["target_pct"]) / 100.0,
    }
    if form.get("gpu_budget"):
        body["gpu_budget"] = int(form["gpu_budget"])
    if form.get("for", "").strip():
        body["target"] = form["for"].strip()
    if form["trace"] == "poisson":
        body |= {"poisson": float(form["rate"]), "num_requests": int(form["requests"])}
    elif form["trace"] == "azure":
        body["duration"] = float(form["duration_s"])
    return body


def _windows() -> dict[str, dict[str, Any]]:
    """The stored windows whose traffic a recommendation can be made for: the live data's last
    hour, and each simulated scenario (whole)."""
    out: dict[str, dict[str, Any]] = {"live data, the last hour": {"dataset": "live", "since": "1h"}}
    try:
        for sc in common.client().scenarios()[:20]:
            out[f"scenario {sc['scenario_id']} ({sc.get('name')})"] = {"dataset": sc["scenario_id"]}
    except (ApiError, ServiceUnavailable):
        pass
    return out


def _make(form: dict[str, Any], windows: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    api = common.control_client()
    body = make_body(form)
    if form["trace"] == "observed":
        traffic = _control(lambda: observed_traffic(api, windows[form["window"]]), "Observing the traffic")
        if traffic is None:
            return None
        body |= {k: v for k, v in traffic.items() if v is not None}
    return _control(lambda: api.make_recommendation(body), "Making a recommendation")


def _make_form(rec: dict[str, Any] | None) -> None:
    d = _defaults(rec)
    with st.popover("Make a recommendation", icon=":material/add_circle:"):
        st.caption(
            "Searches layouts and engine settings by simulation for the traffic and SLOs below (about a "
            "minute for an hour of traffic); stored, then shown here."
        )
        form: dict[str, Any] = {
            "layout": st.text_input(
                "Current layout", d["layout"], key="mk_layout", placeholder="agg:8xh100-sxm:tp2"
            ),
            "model": st.text_input("Model", d["model"], key="mk_model"),
        }
        c1, c2, c3 = st.columns(3)
        form["ttft_ms"] = c1.number_input("TTFT SLO, ms", 1.0, 600_000.0, d["ttft_ms"], key="mk_ttft")
        form["tpot_ms"] = c2.number_input("TPOT SLO, ms", 0.1, 10_000.0, d["tpot_ms"], key="mk_tpot")
        form["target_pct"] = c3.number_input("Attainment, %", 1.0, 100.0, d["target_pct"], key="mk_target")
        form["gpu_budget"] = st.number_input(
            "GPU budget (0: the current layout's)", 0, 100_000, 0, key="mk_budget"
        )
        trace = st.radio(
            "Traffic",
            ["observed", "poisson", "azure"],
            format_func={
                "observed": "observed (a stored window)",
                "poisson": "Poisson arrivals",
                "azure": "the Azure conversation trace",
            }.get,
            horizontal=True,
            key="mk_trace",
        )
        form["trace"] = trace
        windows = _windows() if trace == "observed" else {}
        if trace == "observed":
            form["window"] = st.selectbox(
                "Window",
                list(windows),
                key="mk_window",
                help="Its workload is observed and stored (POST /api/v1/workload); a trace that follows it is "
                "searched on; the reports say when the traffic has drifted from it",
            )
        elif trace == "poisson":
            c1, c2 = st.columns(2)
            form["rate"] = c1.number_input("Rate, req/s", 0.01, 10_000.0, 4.0, key="mk_rate")
            form["requests"] = c2.number_input("Requests", 2, 100_000, 200, key="mk_requests")
        else:
            form["duration_s"] = st.number_input(
                "First seconds of the trace", 1.0, 86_400.0, 300.0, key="mk_dur"
            )
        form["for"] = st.text_input(
            "For (stack:URL, scenario:ID or fleet:NAME)",
            d["for"],
            key="mk_for",
            help="stack:<router URL> to be able to apply it to the bundled stack",
        )
        if st.button("Make it", type="primary", key="make_rec", disabled=not form["layout"].strip()):
            with st.spinner("Searching layouts by simulation ..."):
                made = _make(form, windows)
            if made:
                st.session_state[PICK] = made["recommendation_id"]
                st.success(f"Made {made['recommendation_id']}: {rf.proposed_layout(made)}")


# -- the chosen one ------------------------------------------------------------------------------------


def _impact(rec: dict[str, Any]) -> None:
    d = rf.details_of(rec)
    pred, cur = d.get("predicted") or {}, d.get("current_predicted") or {}
    saving = rf.annual_saving_usd(rec)
    fleet = (d.get("inputs") or {}).get("fleet_gpus")
    cols = st.columns(5)
    cols[0].metric(
        "Saving a year",
        "—" if saving is None else rf.usd_text(saving),
        help="The current layout's simulated $/year minus the recommended one's, at the SLOs"
        + (f", for a fleet of {fleet} GPUs." if fleet else "."),
        border=True,
    )
    for col, (key, what, fmt, lower) in zip(
        cols[1:], [i for i in rf.IMPACT if i[0] != "usd_per_year"][:4], strict=True
    ):
        p, c = pred.get(key), cur.get(key)
        delta = None
        if isinstance(p, int | float) and isinstance(c, int | float) and c:
            delta = f"{100 * (p - c) / abs(c):+.1f} % vs current"
        col.metric(
            what,
            fmt(p),
            delta=delta,
            delta_color="inverse" if lower else "normal",
            help=f"Simulated; the current layout's (simulated over the same trace): {fmt(c)}",
            border=True,
        )
    conf = d.get("confidence") or {}
    level = str(conf.get("level") or "unknown")
    colour = {"high": "green", "medium": "orange", "low": "red"}.get(level, "gray")
    said = rf.confidence_text(rec).split(": ", 1)[-1]  # without the level, shown as a badge
    st.markdown(f"**Confidence** :{colour}-badge[{level}] " + common.plain_md(said))


def _chart_and_tables(rec: dict[str, Any], trust: PageTrust) -> None:
    fig = rf.pareto_figure(rec)
    labels = [str(rf.details_of(rec).get("trust") or "simulated")]
    trust.chart(fig, labels, key=f"pareto_{rec['recommendation_id']}", config={"displaylogo": False})
    st.caption(
        "Each point a candidate layout simulated on the traffic: up is more tokens per GPU (cheaper), right "
        "is faster per user. Filled: meets the SLOs; open: misses them. The dotted line is the Pareto front."
    )
    show_pruned = st.toggle("Show the candidates pruned before simulation", key="rec_pruned")
    rows = rf.candidate_rows(rec, include_pruned=show_pruned)
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", height=min(460, 38 + 35 * len(rows)))
    with st.expander("Predicted impact, figure by figure"):
        st.dataframe(pd.DataFrame(rf.impact_rows(rec)), hide_index=True, width="stretch")
        notes = ((rf.details_of(rec).get("search") or {}).get("notes")) or []
        for n in notes:
            st.markdown(f"- {common.plain_md(str(n))}")


# -- apply, progress, rollback -------------------------------------------------------------------------


def _apply_section(rec: dict[str, Any]) -> None:
    rid, target, status = rec["recommendation_id"], str(rec.get("target") or ""), rec.get("status")
    st.subheader("Apply")
    if not target.startswith("stack:"):
        st.info(
            common.plain_md(
                f"This recommendation is for {target or 'no target'}, not the bundled stack: it cannot be applied "
                f"from here. Export it for a cluster: `phaselens export {rid} --format dynamo`."
            ),
            icon=":material/deployed_code:",
        )
        return
    apply_controls(FLOW, rid, status)
    apply_progress(FLOW, rid, _steps_and_realised)


def _steps_and_realised(rows: list[dict[str, Any]]) -> None:
    executed = [r for r in rows if not r.get("dry_run") and r.get("action") not in DECISIONS]
    if executed:
        st.markdown("**Steps and guard windows**")
        st.dataframe(
            pd.DataFrame(
                {
                    "Time (UTC)": [_utc(r["ts_s"], "%H:%M:%S") for r in executed],
                    "Action": [r["action"] for r in executed],
                    "Status": [r["status"] for r in executed],
                    "What": [(r.get("message") or "").split("\n")[0] for r in executed],
                }
            ),
            hide_index=True,
            width="stretch",
        )
    realised = next((r for r in reversed(rows) if r.get("action") == "realised"), None)
    if realised:
        _realised(realised)


def _realised(row: dict[str, Any]) -> None:
    after = row.get("after") or {}
    figures = ((after.get("comparison") or {}).get("figures")) or {}
    st.markdown("**Realised vs predicted** (the last guard window)")
    st.dataframe(
        pd.DataFrame(
            {
                "Figure": list(figures),
                f"Realised ({after.get('trust') or 'measured'})": [
                    _g(v.get("realised")) for v in figures.values()
                ],
                "Predicted (simulated)": [_g(v.get("predicted")) for v in figures.values()],
                "Error": [
                    "—" if v.get("error_pct") is None else f"{v['error_pct']:+.1f} %"
                    for v in figures.values()
                ],
            }
        ),
        hide_index=True,
        width="stretch",
    )


def _g(v: Any) -> str:
    return "—" if not isinstance(v, int | float) else f"{v:.4g}"


# -- the audit -----------------------------------------------------------------------------------------


def audit_rows(actions: list[dict[str, Any]]) -> pd.DataFrame:
    """The audit table, newest first: every action row (dry runs, steps, guards, rollbacks, the
    auto-apply policy's decisions with their reason)."""
    rows = list(reversed(actions))
    return pd.DataFrame(
        {
            "Time (UTC)": [_utc(r.get("ts_s")) for r in rows],
            "Action": [r.get("action") for r in rows],
            "Status": [r.get("status") for r in rows],
            "Dry run": ["yes" if r.get("dry_run") else "" for r in rows],
            "Actor": [r.get("actor") for r in rows],
            "Recommendation": [r.get("recommendation_id") or "" for r in rows],
            "Message": [(r.get("message") or "").split("\n")[0] for r in rows],
        }
    )


def _audit() -> None:
    st.subheader("Audit history")
    with common.service_errors():
        got = common.client().actions(limit=500)
    actions = got.get("actions") or []
    auto = got.get("auto_apply") or {}
    if auto.get("enabled"):
        last = auto.get("last_decision") or {}
        st.caption(
            common.plain_md(
                f"Auto-apply is on: {auto.get('policy')}. Last decision: {last.get('decision', '—')}"
                + (f" ({last['reason']})" if last.get("reason") else "")
            )
        )
    else:
        st.caption("Auto-apply is off (`phaselens collect --auto-apply` turns it on).")
    decisions = [r for r in actions if r.get("action") in DECISIONS]
    if decisions:
        st.markdown("**Auto-apply decisions**")
        st.dataframe(
            pd.DataFrame(
                {
                    "Time (UTC)": [_utc(r.get("ts_s")) for r in reversed(decisions)],
                    "Decision": [
                        "applied" if r["action"] == "auto_apply" else "skipped" for r in reversed(decisions)
                    ],
                    "Why": [r.get("message") or "" for r in reversed(decisions)],
                    "Recommendation": [r.get("recommendation_id") or "" for r in reversed(decisions)],
                }
            ),
            hide_index=True,
            width="stretch",
        )
    if not actions:
        st.caption("No action yet: nothing has been applied, planned or decided.")
        return
    st.dataframe(
        audit_rows(actions), hide_index=True, width="stretch", height=min(420, 38 + 35 * len(actions))
    )


# -- the page ------------------------------------------------------------------------------------------


def _label(r: dict[str, Any]) -> str:
    return f"{_utc(r.get('ts_s'), '%Y-%m-%d %H:%M')} · {r.get('status')} · {r.get('target')} · {rf.proposed_layout(r)}"


def render() -> None:
    """The page body: its one trust block lists the recommendation's labels (its figures are the
    simulator's; a realised comparison names its measured column itself)."""
    render_with_trust(_body)


def _body(trust: PageTrust) -> None:
    api = common.client()
    common.control_token_input()
    recs: list[dict[str, Any]] | None = None
    with common.service_errors():
        recs = api.recommendations(limit=200)
    if recs is None:  # the service refused or is down: said above (st.stop() does not stop a bare run)
        return
    picked = next((r for r in recs if r["recommendation_id"] == st.session_state.get(PICK)), None)
    _make_form(picked or (recs[0] if recs else None))
    if not recs:
        st.info(common.plain_md(rf.NO_RECOMMENDATION), icon=":material/lightbulb:")
        _audit()
        return
    ids = [r["recommendation_id"] for r in recs]
    by_id = {r["recommendation_id"]: r for r in recs}
    if st.session_state.get(PICK) not in ids:
        best = rf.best_recommendation(recs)
        st.session_state[PICK] = best["recommendation_id"] if best else ids[0]
    pick = st.selectbox("Recommendation", ids, key=PICK, format_func=lambda i: _label(by_id[i]))
    with common.service_errors():
        rec = api.recommendation(pick)
    stay = rf.is_stay(rec)
    st.subheader(
        common.plain_md(("Stay as is: " if stay else "Recommended: ") + str(rf.proposed_layout(rec)))
    )
    trust.add([str(rf.details_of(rec).get("trust") or "simulated")], primary=True)
    st.markdown(common.plain_md(f"{rec.get('rationale') or ''}"))
    st.caption(
        common.plain_md(
            f"{rec['recommendation_id']} · {rec.get('status')} · for {rec.get('target')} · current "
            f"{rf.current_layout(rec)} · SLOs {rf.slo_text(rec)} · made {_utc(rec.get('ts_s'))} UTC"
        )
    )
    _impact(rec)
    _chart_and_tables(rec, trust)
    _apply_section(rec)
    _audit()


st.title("Recommendations")
st.caption(
    "Serving layouts and engine settings for your traffic at your SLOs, found by simulation: every predicted "
    "figure is SIMULATED, and says how well the simulator matched today's measurements."
)
render()
