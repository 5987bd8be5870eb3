"""Two windows side by side (issue 25, "Compare"): the view's window (A) and the one the sidebar's
"Compare with" picked (B: the previous period of the same length, or another data set such as a second
simulated scenario), on the Overview, Cost and Latency pages — each figure for A and for B, and the
change from B to A coloured by whether it is for the better (:data:`DELTA_COLOURS`).

:func:`change` and :func:`table_html` are pure (tested without Streamlit); :func:`headers` draws the
two columns' titles.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import streamlit as st

from dashboard.figures.palette import DELTA_COLOURS, NEUTRAL

A, B = "A", "B"


@dataclass(frozen=True, slots=True)
class Row:
    """One figure of the comparison: its label, both values as numbers and as text, how to state the
    change (``ratio``: percentage points of a share; else relative), and which way is better (None:
    neither)."""

    key: str
    label: str
    a: float | None
    b: float | None
    a_text: str
    b_text: str
    ratio: bool = False
    higher_is_better: bool | None = None


def change(row: Row) -> tuple[str, str]:
    """The change from B to A as text and its verdict (``better``, ``worse``, ``same``, or ``none``
    when either value is missing): percentage points for shares, else relative to B (absolute where B
    is 0)."""
    a, b = row.a, row.b
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return "—", "none"
    diff = a - b
    if row.ratio:
        text = f"{100 * diff:+.1f} pp"
        small = abs(100 * diff) < 0.05
    elif b != 0:
        text = f"{100 * diff / abs(b):+.1f} %"
        small = abs(100 * diff / abs(b)) < 0.05
    else:
        text = f"{diff:+.3g}"
        small = diff == 0
    if small:
        return text, "same"
    if row.higher_is_better is None:
        return text, "same"
    return text, "better" if (diff > 0) == row.higher_is_better else "worse"


def table_html(rows: Sequence[Row], a_title: str, b_title: str) -> str:
    """The comparison as one HTML table: figure, A, B, change (coloured; ``data-verdict`` on each
    change cell for tests and tools)."""
    head = "".join(
        f"<th style='text-align:{al};padding:4px 10px;border-bottom:1px solid {NEUTRAL['rule']}'>{html.escape(t)}</th>"
        for t, al in (("Figure", "left"), (a_title, "right"), (b_title, "right"), ("Change, B → A", "right"))
    )
    body = []
    for r in rows:
        text, verdict = change(r)
        colour = DELTA_COLOURS.get(verdict, NEUTRAL["muted"])
        cells = [
            f"<td style='padding:4px 10px'>{html.escape(r.label)}</td>",
            f"<td class='pl-a' style='text-align:right;padding:4px 10px'>{html.escape(r.a_text)}</td>",
            f"<td class='pl-b' style='text-align:right;padding:4px 10px'>{html.escape(r.b_text)}</td>",
            f"<td class='pl-change' data-verdict='{verdict}' style='text-align:right;padding:4px 10px;"
            f"color:{colour};font-weight:600'>{html.escape(text)}</td>",
        ]
        body.append(f"<tr data-key='{html.escape(r.key)}'>{''.join(cells)}</tr>")
    return (
        "<table class='pl-compare' style='border-collapse:collapse;font-size:14px;"
        f'font-family:"Source Sans Pro",sans-serif;color:{NEUTRAL["ink"]};width:100%\'>'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def headers(a_text: str, b_text: str) -> tuple[object, object]:
    """Two columns titled A and B with what each window is; returns them for the page to draw in."""
    left, right = st.columns(2)
    left.markdown(f"**A** · {a_text}")
    right.markdown(f"**B** · {b_text}")
    return left, right


def body_or_compared(
    compare: object, note: str | None, body: Callable[[], None], compared: Callable[[object], None]
) -> None:
    """A page's body, or A beside B when the sidebar chose a comparison (``compare``, passed to
    ``compared``); a note on why no comparison could be drawn is shown above the body."""
    if compare is not None:
        compared(compare)
        return
    if note:
        st.info(note, icon=":material/compare_arrows:")
    body()
