"""The latency section: attainment of the SLOs, the percentiles' table and the charts over time."""

from __future__ import annotations

from typing import Any

from dashboard.report_html.charts import Page
from dashboard.report_html.text import esc, no_data_section, number_or_none, seconds_text, share_text

_SLO_TARGET = 0.9  # DistServe's goodput target, as on the Latency page


def latency_section(page: Page, summary: dict[str, Any], simulated: bool) -> str:
    """Latency and SLO attainment: the attainment in words, the percentiles' table and the charts over time."""
    from analytics.latency import attainment_basis
    from dashboard.figures import attainment_over_time_figure, latency_over_time_figure, part_labels

    lat = (summary.get("parts") or {}).get("latency") or {}
    heading = "Latency and SLO attainment"
    if not lat.get("requests"):
        return no_data_section(heading, summary, "latency", "no requests finished in this window")
    out = [f"<section><h2>{heading}</h2>"]
    labels = part_labels(lat)
    att = lat.get("attainment") or {}
    slo = lat.get("slo") or {}
    ttft_ms, tpot_ms = (
        (number_or_none(slo.get("ttft_s")) or 0) * 1000,
        (number_or_none(slo.get("tpot_s")) or 0) * 1000,
    )
    slo_text = f"TTFT ≤ {ttft_ms:g} ms, TPOT ≤ {tpot_ms:g} ms"
    out.append(
        f"<p><b>{share_text(att.get('both'))}</b> of the requests met both SLOs ({esc(slo_text)}): "
        f"{attainment_basis(lat)}. {share_text(att.get('ttft'))} met the TTFT "
        f"SLO, {share_text(att.get('tpot'))} the TPOT SLO.</p>"
    )
    rows = []
    names = {"ttft": "time to first token", "tpot": "time per output token", "itl": "inter-token latency"}
    names["e2e"] = "end to end"
    for key, name in names.items():
        p = (lat.get("percentiles") or {}).get(key) or {}
        if not p.get("n"):
            continue
        how = "from buckets (estimated)" if p.get("method") == "histogram" else "per request"
        cells = "".join(
            f'<td class="num">{seconds_text(p.get(f"{q}_s"))}</td>' for q in ("p50", "p90", "p99")
        )
        rows.append(
            f'<tr><td>{name}</td><td class="num">{int(p["n"]):,}</td>{cells}'
            f'<td class="num">{seconds_text(p.get("mean_s"))}</td><td>{how}</td></tr>'
        )
    if rows:
        out.append(
            "<table><tr><th>latency</th><th>values</th><th>p50</th><th>p90</th><th>p99</th><th>mean</th>"
            f"<th>method</th></tr>{''.join(rows)}</table>"
        )
    over = lat.get("over_time") or []
    if over:
        w = summary.get("window") or {}
        window_s = (float(w["start_s"]), float(w["end_s"])) if "start_s" in w and "end_s" in w else None
        common = {
            "labels": labels,
            "simulated": simulated,
            "bucket_s": lat.get("bucket_s"),
            "window_s": window_s,
        }
        fig = latency_over_time_figure(
            over, slo_ttft_s=slo.get("ttft_s"), slo_tpot_s=slo.get("tpot_s"), **common
        )
        out.append(page.chart(fig))
        fig = attainment_over_time_figure(over, target=_SLO_TARGET, slo_text=slo_text, **common)
        out.append(page.chart(fig))
        out.append(
            '<p class="meta">Requests are counted in the time bucket they arrived in; a request that '
            "failed misses the SLO.</p>"
        )
    out.append("</section>")
    return "".join(out)
