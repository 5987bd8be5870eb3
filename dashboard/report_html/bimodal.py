"""The bimodality section: a histogram per pool with its modes, and the pool's bimodality in words."""

from __future__ import annotations

from typing import Any

from dashboard.report_html.charts import Page
from dashboard.report_html.text import esc, number_or_none, ordered_pools, pct_text, plural


def bimodal_section(page: Page, summary: dict[str, Any]) -> str:
    """Bimodality per pool: each pool's activity histogram beside its facts (:func:`pool_facts`)."""
    from dashboard.figures import activity_histogram_figure, bimodal_pool_rows, part_labels

    parts = summary.get("parts") or {}
    bimodal = parts.get("bimodal") or {}
    rows = bimodal_pool_rows(bimodal)
    hist = summary.get("histogram") or {}
    groups = [g for g in hist.get("groups") or [] if g.get("samples")]
    out = [
        "<section><h2>Bimodality per pool</h2>",
        '<p class="meta">A GPU that does both phases spends its time in two states: memory-bound decode '
        "(low SM activity) and compute-bound prefill (high). Bars: the share of the window's samples per bin "
        "(SM activity dark, utilization % red); dashed lines: the modes, peaks of the smoothed SM-activity "
        "histogram, with the share of samples on each side of the valley between them. Verdict: "
        f"{esc(str(bimodal.get('rule') or 'no rule: no bimodality part in the summary'))}.</p>",
    ]
    why = (summary.get("missing") or {}).get("bimodal")
    if why:
        out.append(f'<p class="error">The dip test could not run: {esc(str(why))}</p>')
    if not groups:
        out.append('<p class="empty">No GPU samples in this window: no histogram.</p>')
        out += [pool_facts(None, rows[p], p) for p in ordered_pools(k for k in rows if k != "fleet")]
        out.append("</section>")
        return "".join(out)
    labels = set(part_labels(hist)) | set(part_labels(bimodal))
    pool_groups = [g for g in groups if g["pool"] != "fleet"]
    fleet = next((g for g in groups if g["pool"] == "fleet"), None)
    if fleet is not None and len(pool_groups) != 1:
        pool_groups.insert(0, fleet)
    for g in pool_groups:
        name = "All GPUs" if g["pool"] == "fleet" else f"{str(g['pool']).capitalize()} pool"
        row = rows.get(g["pool"])
        fig = activity_histogram_figure(g, hist.get("edges_pct") or [], row, title=name, labels=labels)
        out.append(f'<div class="pool"><div>{page.chart(fig)}</div>{pool_facts(g, row, g["pool"])}</div>')
    out.append("</section>")
    return "".join(out)


def pool_facts(group: dict[str, Any] | None, row: dict[str, Any] | None, pool: str) -> str:
    """A pool's bimodality in words: the verdict, Sarle's b as evidence, the modes, utilization
    against SM activity."""
    from dashboard.figures import modes_in_words, sarle_text, verdict_text

    row = row or {}
    items = [f"<b>Bimodal?</b> {esc(verdict_text(row))}"]
    sarle = number_or_none(row.get("sarle"))
    if sarle is not None:
        items.append(f"<b>Sarle's b</b> (supporting evidence, not the verdict): {esc(sarle_text(sarle))}")
    modes = modes_in_words(row)
    if modes:
        items.append(f"<b>{modes[0]}:</b> {esc(modes[1])}")
    util = number_or_none(((group or {}).get("gpu_util") or {}).get("mean_pct"))
    sm = number_or_none(((group or {}).get("sm_active") or {}).get("mean_pct"))
    if util is None:
        util = number_or_none(row.get("util_pct"))
    if sm is None:
        sm = number_or_none(row.get("mean_sm_pct"))
    if util is not None and sm is not None:
        items.append(
            f"<b>Busy but compute-idle:</b> mean utilization {util:.0f} % against mean SM activity {sm:.0f} % "
            f"({plural(round(util - sm), 'point')})"
        )
    sp, sd = number_or_none(row.get("sm_prefill_pct")), number_or_none(row.get("sm_decode_pct"))
    if sp is not None and sd is not None:
        items.append(f"<b>SM activity in prefill / decode:</b> {pct_text(sp)} / {pct_text(sd)}")
    elif sp is not None or sd is not None:  # a pool of one phase
        phase, value = ("prefill", sp) if sp is not None else ("decode", sd)
        items.append(f"<b>SM activity in {phase}:</b> {pct_text(value)}")
    if group:
        items.append(
            f"{plural(int(group.get('gpus') or 0), 'GPU')}, {plural(int(group.get('samples') or 0), 'sample')}"
        )
    head = "" if group else f"<h3>{esc(pool.capitalize())} pool</h3>"
    return head + '<ul class="facts">' + "".join(f"<li>{i}</li>" for i in items) + "</ul>"
