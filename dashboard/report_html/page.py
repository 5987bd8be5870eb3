"""The page's assembly: :func:`render_html` puts the sections together (title, headline, GPU-time,
bimodality, the roofline (MFU / MBU, stranded compute and bandwidth), cost, energy (per token per phase, power
settings' savings), latency, what is missing, the appendix and the report's JSON) with the style;
:func:`standalone_html` inlines Plotly's script where :data:`PLOTLY_MARKER` stands."""

from __future__ import annotations

import json
from typing import Any

from dashboard.figures.palette import DELTA_COLOURS, NEUTRAL, TRUST_COLOURS
from dashboard.report_html.appendix import appendix_section, missing_section
from dashboard.report_html.bimodal import bimodal_section
from dashboard.report_html.charts import Page
from dashboard.report_html.cost import cost_section
from dashboard.report_html.energy import energy_section
from dashboard.report_html.headline import gpu_time_section, header_html, headline_section
from dashboard.report_html.latency import latency_section
from dashboard.report_html.recommend import recommendation_section
from dashboard.report_html.roofline import roofline_section
from dashboard.report_html.text import esc, number_or_none

PLOTLY_MARKER = "<!--phaselens:plotly.js-->"

_CSS = """
body{{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:1.5rem auto;max-width:1100px;
color:{body};padding:0 1rem;line-height:1.45}}
h1{{font-size:1.55rem;margin-bottom:.3rem}}
h2{{margin-top:2.2rem;border-bottom:1px solid {rule};padding-bottom:.2rem;font-size:1.3rem}}
h3{{margin:1.2rem 0 .3rem;font-size:1.05rem}}.meta{{color:{muted};margin:.2rem 0}}
table{{border-collapse:collapse;margin:.5rem 0 1rem;font-size:.9rem}}
th,td{{border:1px solid {rule};padding:.25rem .6rem;text-align:left;vertical-align:top}}
th{{background:{header}}}td.num{{text-align:right;font-variant-numeric:tabular-nums}}
.badge{{display:inline-block;border-radius:.6rem;padding:0 .55rem;margin-right:.3rem;font-size:.8rem;
font-weight:600;color:{white};white-space:nowrap}}
{trust}
ul.labels{{margin:.3rem 0;padding-left:0;list-style:none;color:{reference};font-size:.9rem}}
ul.labels li{{margin:.15rem 0}}
.lead{{font-size:1.2rem;font-weight:600;margin:.8rem 0 .4rem}}
.tiles{{display:grid;grid-template-columns:repeat(4,1fr);gap:.6rem;margin:.6rem 0}}
.tile{{border:1px solid {rule};border-radius:.4rem;padding:.5rem .7rem}}
.tile .label{{font-size:.85rem;color:{reference}}}.tile .value{{font-size:1.45rem;font-weight:600;margin:.1rem 0}}
.tile .delta{{font-size:.85rem}}.tile .prev,.tile .why{{font-size:.8rem;color:{faint}}}
.better{{color:{better}}}.worse{{color:{worse}}}.same{{color:{same}}}.tile.nodata .value{{color:{faint_text}}}
.facts{{margin:.2rem 0 1.2rem;padding-left:1.2rem;font-size:.92rem}}.facts li{{margin:.25rem 0}}
.pool{{display:grid;grid-template-columns:minmax(0,3fr) minmax(0,1fr);gap:1rem;align-items:center}}
.empty{{background:{empty_bg};border:1px solid {empty_border};padding:.7rem 1rem;border-radius:.3rem}}
.error{{background:{error_bg};border:1px solid {error_border};padding:.6rem 1rem;border-radius:.3rem}}
details{{margin:.4rem 0}}details>summary{{cursor:pointer;font-weight:600}}
pre{{background:{code};padding:1rem;overflow:auto;font-size:.8rem}}.wide{{overflow-x:auto}}
@media (max-width:800px){{.tiles{{grid-template-columns:repeat(2,1fr)}}.pool{{display:block}}}}
""".format(
    trust="".join(f".{label}{{background:{hex_}}}" for label, (_badge, hex_) in TRUST_COLOURS.items()),
    **NEUTRAL,
    better=DELTA_COLOURS["better"],
    worse=DELTA_COLOURS["worse"],
    same=DELTA_COLOURS["same"],
)


# the folded JSON is filled in from the embedded copy when opened (the page holds it once)
_SHOW_JSON = (
    'document.getElementById("report-json").addEventListener("toggle",function(e){'
    'var p=e.target.querySelector("pre");if(!p.textContent){p.textContent=JSON.stringify('
    'JSON.parse(document.getElementById("phaselens-summary").textContent),null,1);}});'
)


def standalone_html(body: str) -> str:
    """The stored page with Plotly's JavaScript inlined where the marker is: one file, offline."""
    if PLOTLY_MARKER not in body:
        return body
    from plotly.offline import get_plotlyjs

    script = get_plotlyjs().replace("</script", "<\\/script")
    return body.replace(PLOTLY_MARKER, f"<script>{script}</script>", 1)


def render_html(
    summary: dict[str, Any] | None,
    *,
    title: str,
    error: str | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
) -> str:
    """The report page of ``summary`` (the module's docstring says what it holds). Without an
    ``overview`` key the headline figures are computed from ``summary`` alone (no trend); without
    ``histogram`` the bimodality section has the dip test but no histogram."""
    from analytics.overview import overview as make_overview

    summary = summary or {}
    page = Page()
    window = summary.get("window") or {}
    start_s = start_s if start_s is not None else number_or_none(window.get("start_s"))
    end_s = end_s if end_s is not None else number_or_none(window.get("end_s"))
    ov = summary.get("overview") or (make_overview(summary, None) if summary else None)
    out = [header_html(summary, title, start_s, end_s)]
    if error:
        out.append(f'<p class="error"><b>No summary:</b> {esc(error)}</p>')
    if summary and not error and _is_empty(summary, ov):
        out.append(
            '<p class="empty"><b>No data in this window.</b> No GPU time, GPU samples or finished '
            "requests were recorded between its start and end; the list below says what each analysis "
            "found missing. Check that the collector's sources were up (the dashboard's Health page) "
            "or make a report of a longer window.</p>"
        )
        out.append(missing_section(summary, heading="Why"))
    elif summary:
        simulated = str(window.get("dataset") or "live") != "live"
        out += [
            headline_section(ov),
            recommendation_section(summary),
            gpu_time_section(page, ov),
            bimodal_section(page, summary),
            roofline_section(summary),
            cost_section(page, summary, ov, simulated),
            energy_section(summary),
            latency_section(page, summary, simulated),
            missing_section(summary),
            appendix_section(summary),
        ]
    data = json.dumps(summary, sort_keys=True, default=str, separators=(",", ":"))
    embedded = data.replace("</", "<\\/")  # JSON in a script element: no closing tag inside
    out.append(
        '<details id="report-json"><summary>The report\'s JSON</summary><pre></pre></details>'
        f'<script type="application/json" id="phaselens-summary">{embedded}</script>'
        f"<script>{_SHOW_JSON}</script>"
    )
    script = PLOTLY_MARKER if page.charts else ""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{esc(title)}</title>'
        f"<style>{_CSS}</style>{script}</head><body>{''.join(out)}</body></html>"
    )


def _is_empty(summary: dict[str, Any], ov: dict[str, Any] | None) -> bool:
    hist = summary.get("histogram") or {}
    lat = (summary.get("parts") or {}).get("latency") or {}
    has_samples = any(g.get("samples") for g in hist.get("groups") or [])
    has_phases = bool(((summary.get("parts") or {}).get("phases") or {}).get("per_gpu"))
    return (
        bool((ov or {}).get("empty", True)) and not has_samples and not lat.get("requests") and not has_phases
    )
