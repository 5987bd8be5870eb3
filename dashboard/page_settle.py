"""When a dashboard page has settled, for what drives it in a browser (bench/dashboard.py's page
timings, scripts/screens.py's screenshots): a script recording since when the page has been settled,
the condition to wait for, and the pages of :data:`dashboard.app.PAGES` read without starting Streamlit.

Settled: its title drawn, the script run over (no status widget, no spinner) and every Plotly chart
drawn. Held a while, so that a page is not caught between two steps of its run.
"""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parent / "app.py"


def settle_script(interval_ms: int) -> str:
    """A page init script: every ``interval_ms`` it records in ``window.__settled`` since when (ms since
    navigation) the page has been settled, or null while it is not."""
    return f"""setInterval(() => {{
  const ok = document.querySelector('h1') !== null
    && document.querySelector('[data-testid="stStatusWidget"]') === null
    && document.querySelector('[data-testid="stSpinner"]') === null
    && [...document.querySelectorAll('.js-plotly-plot')].every(p => p.querySelector('.main-svg'));
  if (!ok) window.__settled = null;
  else if (window.__settled == null) window.__settled = performance.now();
}}, {int(interval_ms)});"""


def settled_for(hold_ms: int) -> str:
    """A function for Playwright's ``wait_for_function``: true once :func:`settle_script` has seen the
    page settled for ``hold_ms``."""
    return f"() => window.__settled != null && performance.now() - window.__settled >= {int(hold_ms)}"


def app_pages() -> list[tuple[str, str]]:
    """(file, title) of dashboard/app.py's ``PAGES``, in order, read from its source."""
    for node in ast.parse(APP.read_text(encoding="utf-8")).body:
        target = node.target if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [None])[0]
        if getattr(target, "id", None) == "PAGES" and node.value is not None:  # type: ignore[attr-defined]
            return [(f, t) for f, t, _icon in ast.literal_eval(node.value)]  # type: ignore[attr-defined]
    raise SystemExit("dashboard/app.py defines no PAGES")
