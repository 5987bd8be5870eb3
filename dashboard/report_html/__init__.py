"""The efficiency report's page: one self-contained HTML file a platform team reads in the morning.

:func:`render_html` turns a report's summary JSON (``Summary.to_dict()`` plus the keys the report
adds: ``overview``, the headline figures against the previous period from
``analytics.overview.overview``, and ``histogram``, ``analytics.histogram``'s binned activity) into:

1. a title with the window, the data set and the trust labels (each label explained);
2. the headline figures against the previous period, and the sentence on where the money goes;
3. sections with the dashboard's own charts (``dashboard/figures/``, the same builders): where
   the GPU-time goes by pool, bimodality per pool (histogram, modes, dip test in words),
   cost by pool and per hour with the annualised projection, latency percentiles and SLO
   attainment over time;
4. what is missing and why, then an appendix of the detailed tables, folded.

A window without data gets a short page saying so, with no chart. Every chart carries its trust
labels (``label_figure``). The page references nothing outside itself: Plotly's script stands as
:data:`PLOTLY_MARKER`, which :func:`standalone_html` replaces with the script inlined, once.

Its parts: ``page`` (the assembly, the style, :func:`standalone_html`), ``charts`` (a chart's div),
one module per section (``headline``, ``bimodal``, ``cost``, ``latency``, ``appendix``: what is
missing and the folded tables) and ``text`` (the small formatters).
"""

from dashboard.report_html.page import PLOTLY_MARKER, render_html, standalone_html
from dashboard.report_html.text import utc_text

__all__ = ["PLOTLY_MARKER", "render_html", "standalone_html", "utc_text"]
