"""One summary of a window: phases, idle time, bimodality, cost and latency, with trust labels.

:func:`summarize` runs every analysis on one window and gathers their results; a part that cannot
be computed (no samples, no requests, an analysis that failed on this data) is left out and named in
``missing`` with the reason — the rest of the summary stands. :func:`format_summary` renders the
JSON form (``Summary.to_dict()``, also what the collector's ``GET /api/v1/analytics/summary``
answers) as readable tables, so ``phaselens analyze`` prints the same whether it ran the analysis
itself or asked the service; the rendering is in analytics/summary_text.py (re-exported here).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np

from analytics.intervals import span_order
from analytics.jsonable import json_safe
from analytics.summary_text import DEFAULT_GPU_ROWS, GpuNames, format_summary
from analytics.throughput import throughput
from analytics.trust import UNVALIDATED, Trust
from analytics.window import Window

__all__ = ["DEFAULT_GPU_ROWS", "GpuNames", "Summary", "format_summary", "serving_span", "summarize"]


@dataclass(slots=True)
class Summary:
    """The parts of one window's analysis (each a JSON-able dict), what is missing, and the trust
    labels of the whole. ``seconds``: each part's own run time."""

    window: Window
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    trust: Trust = field(default_factory=Trust)
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return json_safe(
            {
                "window": self.window.describe(),
                "trust": self.trust.to_dict(),
                "parts": self.parts,
                "missing": self.missing,
                "seconds": self.seconds,
            }
        )


_PART_ERRORS = (ValueError, duckdb.Error, ZeroDivisionError, KeyError)


def _as_dict(result: Any) -> dict[str, Any]:
    if hasattr(result, "to_dict"):
        return result.to_dict()
    if isinstance(result, dict):
        return result
    raise TypeError(f"an analysis returned {type(result).__name__}, not a dict or an object with to_dict()")


def summarize(
    con: duckdb.DuckDBPyConnection,
    window: Window,
    *,
    prices: Any = None,
    slo: Any = None,
    fleet_gpus: int | None = None,
    skip: frozenset[str] = frozenset(),
    objects: dict[str, Any] | None = None,
    reuse: dict[str, Any] | None = None,
) -> Summary:
    """Run every analysis of the summary on ``window`` (but those named in ``skip``, e.g.
    ``{"bimodal"}``, which the overview does not read); a part that fails is named in ``missing``.
    ``objects``, when given, receives each part's result object by name (e.g. the cost part's
    :class:`~analytics.cost_pricing.CostBreakdown` with its priced ``lines``, which
    phaselens/metrics_counters.py counts per GPU, pool and model), and ``iteration_groups`` the
    grouped scan of the window's iterations.

    ``reuse``: result objects of an earlier summary of the *same window* on the same store version,
    by part name (as ``objects`` received them, ``iteration_groups`` too), taken instead of running
    those parts again (phaselens/summary_cache.py: the SLO only changes ``latency``, the prices
    ``cost``, the fleet size ``annual``; the rest is the window's own). The GPU-interval table is
    not built when neither the phases nor the bimodality are left to compute.

    The GPU-interval table is built once (a TEMP table on ``con``) and shared by the phase
    breakdown and the bimodality; idle split and cost reuse the phase breakdown; one grouped scan
    of the window's iterations (:func:`analytics.iteration_groups.iteration_groups`) serves the
    phase breakdown, the token counts and the latency part. GPUs with samples but no phaselens
    telemetry (dcgm-exporter under vLLM / SGLang / Dynamo) get the ``external`` part
    (:func:`analytics.external.external_attribution`, estimated) and are priced from it.
    """
    from analytics.attribution import phase_breakdown
    from analytics.bimodal import bimodality, idle_split
    from analytics.cost import cost_breakdown, cost_period_s, load_prices, token_counts
    from analytics.external import external_attribution
    from analytics.external_cost import gpus_without_telemetry
    from analytics.intervals import IntervalTable
    from analytics.iteration_groups import iteration_groups
    from analytics.latency import latency_summary
    from analytics.roofline import roofline, unvalidated_notes

    out = Summary(window)
    reuse = reuse or {}
    try:  # a terminal progress bar on long queries would garble the CLI's output
        con.execute("SET enable_progress_bar = false")
    except duckdb.Error:
        pass

    def run(name: str, fn: Callable[[], Any]) -> Any:
        if name in reuse:
            fn = functools.partial(lambda x: x, reuse[name])
        t = time.perf_counter()
        try:
            result = fn()
        except _PART_ERRORS as e:
            out.missing[name] = f"{type(e).__name__}: {e}"
            return None
        finally:
            out.seconds[name] = time.perf_counter() - t
        _add(out, name, result)
        if objects is not None:
            objects[name] = result
        return result

    groups = functools.cache(  # computed by the first part to ask
        lambda: reuse["iteration_groups"] if "iteration_groups" in reuse else iteration_groups(con, window)
    )

    intervals = None
    out.seconds["intervals"] = 0.0  # not built: every part that reads it was reused
    if "phases" not in reuse or ("bimodal" not in skip and "bimodal" not in reuse):
        t = time.perf_counter()
        try:
            intervals = IntervalTable(con, window).__enter__()
        except (ValueError, duckdb.Error) as e:
            out.missing["intervals"] = f"{type(e).__name__}: {e}"
        out.seconds["intervals"] = time.perf_counter() - t
    try:
        pb = (
            run(
                "phases",
                lambda: phase_breakdown(
                    con,
                    window,
                    intervals=intervals,
                    iteration_groups=groups(),
                    # the cost over time at the resolution the window needs (finer than the hour)
                    period_s=cost_period_s(window.end_s - window.start_s, intervals.bucket_s),
                ),
            )
            if intervals is not None or "phases" in reuse
            else None
        )
        if pb is not None:
            run("idle", lambda: idle_split(con, window, breakdown=pb))
            if "bimodal" not in skip and (intervals is not None or "bimodal" in reuse):
                run("bimodal", lambda: bimodality(con, window, intervals=intervals))
    finally:
        if intervals is not None:
            intervals.__exit__(None, None, None)
    price_table = prices if prices is not None else load_prices()
    # GPUs with samples but no phaselens telemetry (dcgm-exporter under vLLM / SGLang / Dynamo):
    # their phase split, GPU-hours and tokens are estimated from the engines' own metrics
    unattributed = gpus_without_telemetry(pb.raw) if pb is not None else set()
    external = (
        run("external", lambda: external_attribution(con, window, gpus=unattributed))
        if unattributed
        else None
    )
    cost = (
        run(
            "cost",
            lambda: cost_breakdown(
                con,
                window,
                price_table,
                breakdown=pb,
                tokens=token_counts(con, window, groups()),
                external=external,
            ),
        )
        if pb is not None
        else None
    )
    if cost is not None and fleet_gpus:
        run("annual", lambda: cost.annualised(fleet_gpus))
    if "roofline" not in skip:
        run("roofline", lambda: roofline(con, window))
    run("latency", lambda: latency_summary(con, window, slo, iteration_groups=groups()))
    run("serving", lambda: serving_span(con, window))
    # output tokens/s: the window average, and the rate while serving under its own name
    run("throughput", lambda: throughput({"window": window.describe(), "parts": out.parts}))
    # every modeled figure on a GPU or dtype the GPU model was never validated on says so
    for note in unvalidated_notes(con, window):
        out.trust.add(UNVALIDATED, note)
    if objects is not None:
        objects["iteration_groups"] = groups()
    return out


def serving_span(con: duckdb.DuckDBPyConnection, window: Window) -> dict[str, Any]:
    """When the window was serving: the union of its requests' spans (arrival to finish, or to the
    last time known of an unfinished one), clipped to the window — ``span_s`` (seconds with at
    least one request in flight), ``first_s``/``last_s``, ``requests``; ``span_s`` None where no
    request lies in the window. What "tokens/s while serving (busy time)" divides by
    (:mod:`analytics.throughput`; the headline output tokens/s is the window average).

    The spans are fetched and their union measured in numpy: sorted by start (then end), each
    span's part beyond every earlier one (a running maximum of the ends) — one sort of nearly
    ordered arrival times, instead of a window function over every request."""
    pred, par = window.node_sql("node")
    end = "coalesce(finish_s, first_token_s, prefill_end_s, arrival_s)"  # the last time known of it
    spans = con.execute(
        f"""
SELECT greatest(arrival_s, ?) AS a, least({end}, ?) AS f
FROM requests WHERE {pred} AND arrival_s < ? AND {end} > ?
""",
        [window.start_s, window.end_s, *par, window.end_s, window.start_s],
    ).fetchnumpy()
    a, f = np.asarray(spans["a"], dtype=float), np.asarray(spans["f"], dtype=float)
    n = len(a)
    if not n:
        return {"requests": 0, "first_s": None, "last_s": None, "span_s": None}
    order = span_order(np.zeros(n, dtype=np.int64), a, f)
    a, f = a[order], f[order]
    # each span's part beyond every earlier-starting one: they sum to the union's length
    reach = np.empty(n)
    reach[0] = a[0]
    np.maximum(a[1:], np.maximum.accumulate(f)[:-1], out=reach[1:])
    span = float(np.maximum(0.0, f - reach).sum())
    return {"requests": n, "first_s": float(a[0]), "last_s": float(f.max()), "span_s": span}


def _add(out: Summary, name: str, result: Any) -> None:
    part = _as_dict(result)
    out.parts[name] = part
    trust = part.get("trust")
    if isinstance(trust, dict):
        out.trust.merge([Trust(set(trust.get("labels", [])), list(trust.get("notes", [])))])
    missing = part.get("missing")
    if isinstance(missing, dict):
        for what, why in missing.items():
            out.missing.setdefault(f"{name}.{what}", str(why))
    elif isinstance(missing, list):
        for i, why in enumerate(missing):
            out.missing.setdefault(f"{name}.{i}", str(why))
