"""The trust labels of a page, shown once: one badge block under the page's title listing the labels
of everything the page shows (measured, emulated, simulated, host-bound, estimated), instead of the
same badges above every chart and tile.

A page opens a :class:`PageTrust` where the block goes (inside its live fragment, so a refresh
redraws it), adds each part's labels as it draws it — ``primary=True`` for the page's main data —
and :meth:`PageTrust.render` fills the block at the end. A chart drawn through :meth:`PageTrust.chart`
keeps the trust label written into it (:func:`dashboard.figures.label_figure`) only where it has a
label the page's main data has not; any other loses it (the block says it once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import plotly.graph_objects as go
import streamlit as st

from dashboard.figures import TRUST_COLOURS, ordered_labels
from dashboard.figures.style import TRUST_ANNOTATION

#: how the one badge block opens (tests and the browser find the block by it)
PREFIX = "Figures on this page:"
NO_FIGURES = "none shown"


def badges_md(labels: Iterable[str]) -> str:
    """The labels as Streamlit badges, in the fixed order (:func:`dashboard.figures.ordered_labels`)."""
    return " ".join(f":{TRUST_COLOURS.get(lb, ('gray', ''))[0]}-badge[{lb}]" for lb in ordered_labels(labels))


def block_md(labels: Iterable[str]) -> str:
    """The badge block's markdown: :data:`PREFIX` and the badges (or :data:`NO_FIGURES`)."""
    shown = badges_md(labels)
    return f"{PREFIX} {shown or NO_FIGURES}"


def strip_trust(fig: go.Figure) -> go.Figure:
    """``fig`` without the trust label :func:`dashboard.figures.label_figure` wrote into it."""
    kept = [a for a in fig.layout.annotations if a.name != TRUST_ANNOTATION]
    fig.layout.annotations = kept
    return fig


class PageTrust:
    """The one badge block of a page (see the module's docstring)."""

    def __init__(self, slot: Any = None) -> None:
        """``slot``: where the block goes (an ``st.empty()`` the page made under its title, above its
        controls; a live fragment fills it from inside); else here."""
        self._slot = slot if slot is not None else st.empty()
        self.labels: set[str] = set()
        self.primary: tuple[str, ...] | None = None

    def add(self, labels: Iterable[str], *, primary: bool = False) -> None:
        """Count ``labels`` among the page's; ``primary``: those of the page's main data."""
        got = [str(lb) for lb in labels]
        self.labels.update(got)
        if primary:
            self.primary = tuple(ordered_labels(set(self.primary or ()) | set(got)))

    def differs(self, labels: Iterable[str]) -> bool:
        """Whether ``labels`` hold one the page's main labels do not (a figure then keeps its own
        label): a chart of simulated data on a simulated, host-bound page does not differ."""
        return not set(labels) <= set(self.primary or ())

    def chart(self, fig: go.Figure, labels: Iterable[str], **kwargs: Any) -> None:
        """``st.plotly_chart(fig, **kwargs)``: its labels counted, its in-chart label kept only where
        they differ from the page's main ones."""
        labels = list(labels)
        self.add(labels)
        if not self.differs(labels):
            strip_trust(fig)
        st.plotly_chart(fig, **kwargs)

    def render(self) -> None:
        """Fill the block with every label added."""
        self._slot.markdown(block_md(self.labels))


def render_with_trust(body: Callable[[PageTrust], None]) -> None:
    """Run a page's ``body`` with its one trust block, filled with the labels it added even when the
    body stops early (the service down, nothing to show)."""
    trust = PageTrust()
    try:
        body(trust)
    finally:
        trust.render()
