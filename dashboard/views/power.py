"""Power: per-phase power limits and SM-clock windows (docs/POWER.md) — each role's calibration
curves (tokens/J and TTFT / ITL p50 and p99 against the power limit and the SM-clock window, the cliff
marked), the setpoints chosen per phase and mode (PERF / BAL / EFF) with their kWh and $ a year and
their confidence (a stale calibration is shown, marked, and never offered), the ``power``
recommendations with Apply (a dry-run plan first, then executed behind the guard: the same apply flow
as the Recommendations page), the guard's verdicts (which lane was released and why), realised
tokens/J and latency before and after an applied setting, and the history.

Reads and writes only through the service API (``dashboard/api.py``): ``/api/v1/power/calibrations``,
``/api/v1/recommendations``, ``/api/v1/recommendations/{id}/apply``, ``/api/v1/actions``.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import common
from dashboard.apply_flow import ApplyFlow, apply_controls, apply_progress, utc
from dashboard.figures import power as pf
from dashboard.figures.text import signed_pct_text, whole_number_text, whole_usd_text
from dashboard.page_trust import PageTrust, render_with_trust

PICK = "power_pick"  # the recommendation shown
FLOW = ApplyFlow(
    prefix="power_",
    guard_key="power_guard_s",
    plans_key="power_plans",
    running_key="power_running",
    guard_help="How long the live traffic is watched after each setting before the next (breach: roll back)",
    applied_caption="Applied. Rolling back puts every worker's knobs back as they were before the apply.",
    rollback_question="Put the knobs back as they were before this apply?",
    not_proposed="only a proposed recommendation can be applied.",
)
APPLY_ROWS = ("apply", "set_device", "guard", "realised", "rollback", "power_release", "calibrate")


# -- calibrations --------------------------------------------------------------------------------------


def _calibration(cal: dict[str, Any], trust: PageTrust) -> None:
    fp = (
        f"{cal.get('gpu_model')} (driver {cal.get('driver') or '?'}), {cal.get('model')} {cal.get('dtype') or ''} "
        f"TP {cal.get('tp') or '?'}, {cal.get('engine_version') or 'engine ?'}"
    )
    status = pf.status_text(cal)
    colour = "red" if cal.get("stale") else "green" if cal.get("usable") else "gray"
    st.markdown(
        f"**{cal.get('role')}** ({cal.get('phase')}) :{colour}-badge[{common.plain_md(status.split(' — ')[0])}] "
        + common.plain_md(
            f"{cal['calibration_id']} · {cal.get('source')} · for {cal.get('target')} · {fp} · "
            f"noise {cal.get('noise_pct') if cal.get('noise_pct') is not None else '—'} % · "
            f"{utc(cal.get('ts_s'))} UTC"
        )
    )
    if cal.get("stale"):
        st.warning(
            common.plain_md(
                f"Stale: {cal.get('stale_reason')}. Its setpoints are not offered: calibrate again."
            ),
            icon=":material/history:",
        )
    knobs = pf.knobs_swept(cal)
    if not knobs:
        st.caption("No setting other than the defaults was measured.")
        return
    cols = st.columns(len(knobs))
    for col, knob in zip(cols, knobs, strict=True):
        with col:
            trust.chart(
                pf.curve_figure(cal, knob),
                pf.trust_of(cal),
                key=f"curve_{cal['calibration_id']}_{knob}",
                config={"displaylogo": False},
            )
            cliff = pf.cliff_of(cal, knob)
            st.caption(
                common.plain_md(
                    f"Cliff: {cliff['setting'].get('label')} (phase latency +{cliff.get('rise_pct'):.1f} %)"
                    if cliff
                    else "No cliff: the phase latency never rose beyond the noise on this knob."
                )
            )


def _calibrations(cals: list[dict[str, Any]], trust: PageTrust) -> None:
    st.subheader("Calibration curves")
    if not cals:
        st.info(common.plain_md(pf.NO_CALIBRATION), icon=":material/bolt:")
        return
    shown = pf.newest_per_role(cals)
    trust.add([t for c in shown for t in pf.trust_of(c)], primary=True)
    st.caption(
        "The newest calibration of each role: every setting swept under the same steady load, the defaults "
        "measured first and last (the reference). The cliff is where the phase's latency first rose beyond "
        "the noise between the reference runs; PERF, BAL and EFF name the setting each mode chose."
    )
    for cal in shown:
        _calibration(cal, trust)
    st.subheader("Setpoints per phase and mode")
    st.caption(
        "PERF: no measurable slowdown; BAL: the best tokens/J within the SLO; EFF: the best tokens/J within a "
        "looser bound. Savings a year on the role's GPUs at the calibrated load (measured power drop × GPUs × "
        "8,760 h × PUE × $/kWh). A stale calibration's setpoints are not offered."
    )
    st.dataframe(pd.DataFrame(pf.setpoint_rows(shown)), hide_index=True, width="stretch")
    older = [c for c in cals if c["calibration_id"] not in {s["calibration_id"] for s in shown}]
    if older:
        with st.expander(f"Older calibrations ({len(older)})"):
            st.dataframe(
                pd.DataFrame(
                    {
                        "Made (UTC)": [utc(c.get("ts_s")) for c in older],
                        "Calibration": [c["calibration_id"] for c in older],
                        "Role": [c.get("role") for c in older],
                        "Target": [c.get("target") for c in older],
                        "Status": [pf.status_text(c) for c in older],
                        "Trust": [", ".join(pf.trust_of(c)) for c in older],
                    }
                ),
                hide_index=True,
                width="stretch",
            )


# -- the recommendation: apply, guard, realised --------------------------------------------------------


def _recommendation(
    recs: list[dict[str, Any]],
    cals: dict[str, dict[str, Any]],
    actions: list[dict[str, Any]],
    trust: PageTrust,
) -> None:
    st.subheader("Power recommendation")
    if not recs:
        st.info(
            common.plain_md(
                "No power recommendation yet: `phaselens calibrate ... --execute --db FILE` makes one from its "
                "sweep (BAL mode; `--recommend --mode perf|bal|eff` from the stored calibrations)."
            ),
            icon=":material/lightbulb:",
        )
        return
    ids = [r["recommendation_id"] for r in recs]
    by_id = {r["recommendation_id"]: r for r in recs}
    if st.session_state.get(PICK) not in ids:
        best = pf.best_power_recommendation(recs)
        st.session_state[PICK] = best["recommendation_id"] if best else ids[0]
    pick = st.selectbox(
        "Recommendation",
        ids,
        key=PICK,
        format_func=lambda i: (
            f"{utc(by_id[i].get('ts_s'), '%Y-%m-%d %H:%M')} · {by_id[i].get('status')} · "
            f"{str((by_id[i].get('proposed') or {}).get('mode') or '?').upper()} · {by_id[i].get('target')}"
        ),
    )
    with common.service_errors():
        rec = common.client().recommendation(pick)
    d = rec.get("details") or {}
    labels = [str(t) for t in d.get("trust") or []] or ["measured"]
    trust.add(labels)
    st.markdown(common.plain_md(str(rec.get("rationale") or "")))
    annual = d.get("annual") or {}
    cols = st.columns(4)
    cols[0].metric(
        "Saving a year",
        whole_usd_text(annual.get("usd_per_year")),
        border=True,
        help="Predicted, at the calibrated load",
    )
    cols[1].metric("Energy a year", f"{whole_number_text(annual.get('kwh_per_year'))} kWh", border=True)
    cols[2].metric("Tokens/J", signed_pct_text(rec.get("est_tokens_per_j_change_pct")), border=True)
    cols[3].metric("Phase latency", signed_pct_text(rec.get("est_latency_change_pct")), border=True)
    conf = d.get("confidence") or {}
    level = str(conf.get("level") or "unknown")
    colour = {"high": "green", "medium": "orange", "low": "red"}.get(level, "gray")
    st.markdown(f"**Confidence** :{colour}-badge[{level}] " + common.plain_md(str(conf.get("text") or "")))
    st.caption(
        common.plain_md(
            f"{pick} · {rec.get('status')} · for {rec.get('target')} · made {utc(rec.get('ts_s'))} UTC · "
            f"trust {', '.join(labels)}"
        )
    )
    st.dataframe(pd.DataFrame(pf.setting_rows(rec)), hide_index=True, width="stretch")
    stale = pf.stale_calibrations(rec, cals)
    _apply_section(rec, stale)
    mine = [a for a in actions if a.get("recommendation_id") == pick]
    _guard(mine)
    _realised(mine, trust)


def _apply_section(rec: dict[str, Any], stale: list[str]) -> None:
    rid, target, status = rec["recommendation_id"], str(rec.get("target") or ""), rec.get("status")
    st.markdown("**Apply**")
    if stale:
        st.error(
            common.plain_md(
                "Made from a stale calibration: not offered. " + "; ".join(stale) + ". Calibrate again "
                "(`phaselens calibrate --execute`)."
            ),
            icon=":material/history:",
        )
        return
    if not target.startswith("stack:"):
        st.info(
            common.plain_md(
                f"For {target or 'no target'}, not the bundled stack: export it as a script per node instead "
                f"(`phaselens export {rid} --format nvidia-smi --out power.sh`)."
            ),
            icon=":material/deployed_code:",
        )
        return
    if not (rec.get("proposed") or {}).get("changes", True):
        st.caption("Every role keeps its defaults: nothing to apply.")
        return
    apply_controls(FLOW, rid, status)
    apply_progress(FLOW, rid)


def _guard(actions: list[dict[str, Any]]) -> None:
    st.markdown("**Guard**")
    rows = pf.guard_rows(actions)
    released = pf.released_lanes(actions)
    if released:
        for lane, why in released.items():
            st.warning(
                common.plain_md(f"The {lane} lane was released to its defaults: {why}"),
                icon=":material/shield:",
            )
    if not rows:
        st.caption(
            "No guard window yet. After an apply, each step is watched for a guard window; the runtime guard "
            "(`phaselens power-guard REC_ID`) then releases a lane that breaches its SLO."
        )
        return
    st.dataframe(
        pd.DataFrame([{"Time (UTC)": utc(r.pop("ts_s")), **r} for r in rows]),
        hide_index=True,
        width="stretch",
    )


def _realised(actions: list[dict[str, Any]], trust: PageTrust) -> None:
    """Realised tokens/J per phase and latency after the change against as long before it: the
    collector's measurements of the live data (``GET /api/v1/analytics/summary`` of each window)."""
    import time

    windows = pf.change_windows(actions, time.time())
    if windows is None:
        return
    api = common.client()
    before = after = None
    with common.service_errors():
        before = api.summary(dataset="live", start_s=windows["before_start_s"], end_s=windows["change_s"])
        after = api.summary(dataset="live", start_s=windows["change_s"], end_s=windows["after_end_s"])
    labels = sorted(set(pf.summary_trust(before)) | set(pf.summary_trust(after)))
    trust.add(labels)
    span = windows["after_end_s"] - windows["change_s"]
    st.markdown(
        f"**Realised tokens/J and latency, before and after** ({', '.join(labels) or 'no data'}: what the "
        f"collector measured over {span:,.0f} s after the change and as long before it)"
    )
    st.dataframe(pd.DataFrame(pf.realised_rows(before, after)), hide_index=True, width="stretch")


def _history(recs: list[dict[str, Any]]) -> None:
    """Every audit row of the power recommendations and every calibration, newest first (read after
    this run's apply or dry run, so that it is listed)."""
    st.subheader("History")
    got = None
    with common.service_errors():
        got = common.client().actions(limit=5000)
    if got is None:
        return
    actions = [a for a in got.get("actions") or [] if a.get("action") in APPLY_ROWS]
    ids = {r["recommendation_id"] for r in recs}
    rows = [
        a for a in reversed(actions) if a.get("recommendation_id") in ids or a.get("action") == "calibrate"
    ]
    if not rows:
        st.caption("Nothing applied, planned or calibrated yet.")
        return
    st.dataframe(
        pd.DataFrame(
            {
                "Time (UTC)": [utc(a.get("ts_s")) for a in rows],
                "Action": [a.get("action") for a in rows],
                "Status": [a.get("status") for a in rows],
                "Dry run": ["yes" if a.get("dry_run") else "" for a in rows],
                "Actor": [a.get("actor") for a in rows],
                "Recommendation": [a.get("recommendation_id") or "" for a in rows],
                "Message": [(a.get("message") or "").split("\n")[0] for a in rows],
            }
        ),
        hide_index=True,
        width="stretch",
        height=min(420, 38 + 35 * len(rows)),
    )


# -- the page ------------------------------------------------------------------------------------------


def render() -> None:
    """The page body with its one trust block (the calibrations' labels; a realised comparison's too)."""
    render_with_trust(_body)


def _body(trust: PageTrust) -> None:
    api = common.client()
    common.control_token_input()
    got = recs = acts = None
    with common.service_errors():
        got = api.power_calibrations(limit=500)
        recs = api.recommendations(limit=500)
        acts = api.actions(limit=5000)
    if got is None or recs is None or acts is None:  # refused or down: said above
        return
    cals = got.get("calibrations") or []
    actions = [a for a in acts.get("actions") or [] if a.get("action") in APPLY_ROWS]
    power_recs = [r for r in recs if r.get("kind") == "power"]
    _calibrations(cals, trust)
    _recommendation(power_recs, {c["calibration_id"]: c for c in cals}, actions, trust)
    _history(power_recs)


st.title("Power")
st.caption(
    "Per-phase power limits and SM-clock windows, measured: each role's sweep, the setting chosen per mode, "
    "applied behind an SLO guard. Curves are labelled by where they come from: emulated devices EMULATED, a "
    "simulated sweep SIMULATED, real GPUs (NVML) MEASURED."
)
render()
