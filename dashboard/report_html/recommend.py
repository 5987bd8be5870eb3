"""The report's recommendation section (``summary["recommendation"]``, made by
``phaselens/report_recommend.py``): the current best layout recommendation and its annual saving at
its SLOs, how sure it is, whether the workload has drifted so that it is stale, and the auto-apply
policy's decisions in the window."""

from __future__ import annotations

from typing import Any

from dashboard.report_html.text import badge, esc, utc_text


def recommendation_section(summary: dict[str, Any]) -> str:
    """The section; empty when the summary has no recommendation part (a report made before it)."""
    part = summary.get("recommendation")
    if not isinstance(part, dict):
        why = (summary.get("missing") or {}).get("recommendation")
        return (
            f'<section><h2>Recommendation</h2><p class="empty">Not available: {esc(str(why))}</p></section>'
            if why
            else ""
        )
    out = ["<section><h2>Recommendation</h2>", f'<p class="lead">{esc(str(part.get("headline") or ""))}</p>']
    best = part.get("best")
    if best:
        out.append(f"<p>{badge('simulated')} every predicted figure is the simulator's</p>")
        facts = [
            f"<b>{'Stay as is' if best.get('stay') else 'Recommended'}</b>: {esc(str(best.get('proposed')))} "
            f"(now {esc(str(best.get('current')))}) for {esc(str(best.get('target')))}, "
            f"{esc(str(best.get('recommendation_id')))} made {esc(utc_text(best.get('ts_s')))} UTC",
            f"<b>Why</b>: {esc(str(best.get('rationale') or '—'))}",
            f"<b>Confidence</b>: {esc(str((best.get('confidence') or {}).get('text') or '—'))}",
        ]
        stale = part.get("staleness") or {}
        reasons = "".join(f"<li>{esc(str(r))}</li>" for r in stale.get("reasons") or [])
        mark = "worse" if stale.get("stale") else "same"
        facts.append(
            f'<b>Workload drift</b>: <span class="{mark}" data-stale="{str(stale.get("stale")).lower()}">'
            f"{esc(str(stale.get('text') or 'not checked'))}</span>"
            + (
                f" (against stored workload {esc(str(stale['workload_id']))})"
                if stale.get("workload_id")
                else ""
            )
            + (f"<ul>{reasons}</ul>" if reasons else "")
        )
        out.append('<ul class="facts">' + "".join(f"<li>{f}</li>" for f in facts) + "</ul>")
    decisions = part.get("auto_apply") or []
    out.append("<h3>Auto-apply decisions in this window</h3>")
    if not decisions:
        out.append('<p class="meta">None (the policy is off, or it made no decision in this window).</p>')
    else:
        rows = "".join(
            f"<tr><td>{esc(utc_text(d.get('ts_s'), '%Y-%m-%d %H:%M:%S'))}</td><td>{esc(str(d.get('decision')))}"
            f"{' (dry run)' if d.get('dry_run') else ''}</td><td>{esc(str(d.get('why') or ''))}</td>"
            f"<td>{esc(str(d.get('recommendation_id') or ''))}</td></tr>"
            for d in decisions
        )
        out.append(
            "<table><tr><th>Time (UTC)</th><th>Decision</th><th>Why</th><th>Recommendation</th></tr>"
            f"{rows}</table>"
        )
    out.append("</section>")
    return "".join(out)
