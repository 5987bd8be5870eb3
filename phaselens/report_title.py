"""A report's title: what ran (the model and the serving layout), on which data, over which window.

* a simulated scenario: its ``scenarios`` row's model and layout (``Layout.describe()`` written
  back as a layout string, ``analytics.recommend.window.layout_from_describe``), and its name;
* live data: the bundled stack's layout from the workers' roles in the ``devices`` table at the
  window's end (``analytics.recommend.window.live_layout``: ``agg:2xh200``, ``1p1d:h200``); the
  model, which the store does not hold, from the stack the collector polled in the window (its
  ``/v1/devices``: the shape its emulated GPUs model), when it still answers.

The window is written in UTC with its length: ``2026-12-05 10:00 – 11:00 UTC (1 h)``.
"""

from __future__ import annotations

import logging
from typing import Any

from dashboard.report_html.text import duration_text, range_text

log = logging.getLogger(__name__)


def report_scope(con: Any, window: Any, model: str | None = None) -> dict[str, Any]:
    """What the report is of: ``model``, ``layout`` (the head of the layout string and its TP
    options: ``1p1d:h200:decode.tp=2``), ``layout_full`` (the whole string), ``name`` (a scenario's
    name) and ``layout_from`` (how the layout was read); None where unknown."""
    from analytics.recommend.window import layout_from_describe, live_layout, scenario_row
    from analytics.window import AnalyticsError

    scope: dict[str, Any] = {"model": model, "layout": None, "layout_full": None, "name": None}
    if window.simulated:
        row = scenario_row(con, window)
        if row is None:
            return scope
        name = con.execute("SELECT name FROM scenarios WHERE scenario_id = ?", [window.dataset]).fetchone()
        scope["name"] = name[0] if name else None
        scope["model"] = model or row.get("model")
        try:
            full = layout_from_describe(row["layout"]) if row.get("layout") else None
        except (AnalyticsError, KeyError, TypeError, ValueError) as e:
            log.warning("report title: the scenario's layout cannot be written as a string: %s", e)
            full = None
        scope["layout_from"] = "the layout the scenario ran"
    else:
        from analytics.recommend.window import stack_target
        from phaselens.recommend_window import stack_model  # the stack's /v1/devices
        from serving.sim.live_compare import EMULATED_SHAPE

        target = stack_target(con, window)  # the one stack the collector polled in the window
        if model is None and target and target.startswith("stack:"):
            scope["model"] = model = stack_model(target[6:])  # None when the stack is gone
        try:  # the model only checks that one worker's GPU holds it; the head is the roles' count
            full, _ = live_layout(con, window, model or EMULATED_SHAPE)
        except AnalyticsError as e:
            log.info("report title: no live layout: %s", e)
            full = None
        scope["layout_from"] = "the workers' roles in the devices table at the window's end"
    scope["layout_full"] = full
    scope["layout"] = short_layout(full) if full else None
    return scope


def short_layout(text: str) -> str:
    """The layout string's head (pools and GPU) and its TP options: what a title needs."""
    parts = text.split(":")
    head = parts[:2]  # agg:2xh200, 1p1d:h200
    return ":".join([*head, *(p for p in parts[len(head) :] if p.split("=")[0].endswith("tp"))])


def report_title(
    kind: str, dataset: str, scope: dict[str, Any], start_s: float | None, end_s: float | None
) -> str:
    """``Hourly efficiency report · llama-3.1-70b on 1p1d:h200 · live stack · 2026-12-05 10:00 – 11:00
    UTC (1 h)``; a simulated one names its scenario (name and id)."""
    what = "Efficiency report" if kind == "manual" else f"{kind.capitalize()} efficiency report"
    model, layout = scope.get("model"), scope.get("layout")
    ran = f"{model} on {layout}" if model and layout else model or (f"layout {layout}" if layout else "")
    if dataset == "live":
        data = "live stack"
    else:
        name = scope.get("name")  # a scenario's name is its layout unless given: said once
        named = name and name not in (dataset, layout, scope.get("layout_full"))
        data = f"simulated scenario {name} ({dataset})" if named else f"simulated scenario {dataset}"
    length = duration_text(end_s - start_s) if start_s is not None and end_s is not None else ""
    when = f"{range_text(start_s, end_s)} UTC" + (f" ({length})" if length else "")
    return " · ".join(p for p in (what, ran, data, when) if p)
