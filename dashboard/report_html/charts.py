"""The charts of one report page, each a div with its data inline (Plotly's script once, elsewhere)."""

from __future__ import annotations

from typing import Any


class Page:
    """The charts of one page: each figure becomes a div (its data inline, no script tag of its own)."""

    def __init__(self) -> None:
        self.charts = 0

    def chart(self, fig: Any) -> str:
        """The div of ``fig`` (a Plotly figure), numbered on this page."""
        import plotly.io as pio

        div = pio.to_html(
            fig,
            include_plotlyjs=False,
            full_html=False,
            div_id=f"chart-{self.charts}",
            # no tool bar: it floats over the chart's top right, where its trust labels are
            config={"displaylogo": False, "responsive": True, "displayModeBar": False},
        )
        self.charts += 1
        return div
