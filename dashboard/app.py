"""The phaselens dashboard: ``streamlit run dashboard/app.py`` (reads ``$PHASELENS_API_URL``).

A multipage app: each page is one file under ``dashboard/views/``, registered in :data:`PAGES`. (Not
``pages/``: Streamlit would also list a ``pages/`` folder beside the script by file name, and a deep link
such as ``/gpus`` opened that list instead of these titles.)
Pages that chart data render the shared sidebar themselves (``common.sidebar()``: data set, time
range, pool and GPU filters, live refresh); its choices carry over from one page to the next.
"""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

# `streamlit run dashboard/app.py` puts dashboard/ on sys.path, not the repository root.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from dashboard import common  # noqa: E402

_HERE = Path(__file__).resolve().parent

# (file under views/, title, icon)
PAGES: tuple[tuple[str, str, str], ...] = (
    ("overview.py", "Overview", ":material/dashboard:"),
    ("gpus.py", "GPUs", ":material/memory:"),
    ("bimodal.py", "Bimodal", ":material/bar_chart:"),
    ("cost.py", "Cost", ":material/payments:"),
    ("latency.py", "Latency", ":material/timer:"),
    ("recommendations.py", "Recommendations", ":material/lightbulb:"),
    ("power.py", "Power", ":material/bolt:"),
    ("reports.py", "Reports", ":material/description:"),
    ("health.py", "Health", ":material/monitor_heart:"),
)


def main() -> None:
    st.set_page_config(page_title="phaselens", page_icon=":material/insights:", layout="wide")
    pages = {
        title: st.Page(str(_HERE / "views" / file), title=title, icon=icon) for file, title, icon in PAGES
    }
    nav = st.navigation(list(pages.values()))
    common.keep_sidebar_state()
    nav.run()


main()
