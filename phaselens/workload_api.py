"""The workload of a window, observed and synthesized side by side (analytics/workload/): one read
shared by ``phaselens workload`` (phaselens/cli/workload.py) and the service API, and the routes
``GET /api/v1/workload`` (compute), ``POST /api/v1/workload`` (compute and store both descriptions;
control token) and ``GET /api/v1/workloads`` (the stored ones, newest first).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from fastapi import Request

from analytics.window import AnalyticsError

#: query parameters (and POST fields) of a workload read
WORKLOAD_PARAMS = {
    "dataset",
    "since",
    "start_s",
    "end_s",
    "node",
    "source",
    "seed",
    "rate_scale",
    "duration_s",
}
#: the longest synthesized trace one request may ask for (s): a week
MAX_DURATION_S = 7 * 86_400.0
WRITE_TIMEOUT_S = 120.0


def _number(params: dict[str, Any], name: str, lo: float, hi: float, default: float, what: str) -> float:
    raw = params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and lo < value <= hi):
        raise AnalyticsError(f"{name} must be a number in ({lo:g}, {hi:g}] ({what}), got {raw!r}", name)
    return value


def _seed(params: dict[str, Any]) -> int:
    raw = params.get("seed")
    if raw is None:
        return 0
    text = str(raw).strip()
    if not (text.isascii() and text.isdigit()) or int(text) >= 2**32:
        raise AnalyticsError(f"seed must be a whole number in [0, 2**32), got {raw!r}", "seed")
    return int(text)


def run_workload(con: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Observe the window ``params`` name (``dataset``, ``since`` / ``start_s`` / ``end_s``, ``node``;
    ``source`` auto | requests | engine_histograms), synthesize a trace that follows it (``seed``,
    ``rate_scale``, ``duration_s``: default the window's) and measure it back. The answer:
    ``observed``, ``synthesized`` (Workload.to_dict each), ``synthesis`` (its parameters) and
    ``match`` (the drift of the synthesized from the observed: ``stale`` false when they match).
    AnalyticsError names a bad parameter or an empty window."""
    from analytics.reads import window_of
    from analytics.workload import describe_trace, observe, synthesize_trace, workload_drift

    unknown = sorted(set(params) - WORKLOAD_PARAMS)
    if unknown:
        raise AnalyticsError(
            f"unknown parameter(s) {', '.join(unknown)}; allowed: {', '.join(sorted(WORKLOAD_PARAMS))}",
            unknown[0],
        )
    if isinstance(params.get("node"), str):  # a JSON body may name one node as a string
        params = params | {"node": [params["node"]]}
    seed = _seed(params)
    rate_scale = _number(params, "rate_scale", 0.0, 1000.0, 1.0, "multiplies the observed rate")
    window = window_of(con, params)
    observed = observe(con, window, source=str(params.get("source") or "auto"), seed=seed)
    duration = _number(params, "duration_s", 0.0, MAX_DURATION_S, observed.duration_s, "seconds of trace")
    try:
        trace = synthesize_trace(observed, duration_s=duration, rate_scale=rate_scale, seed=seed)
    except ValueError as e:
        raise AnalyticsError(str(e)) from e
    if not trace:
        raise AnalyticsError(
            f"the synthesized trace of {duration:g} s holds no request (observed rate {observed.mean_rps:.3g} "
            "req/s): give a longer duration_s or a larger rate_scale",
            "duration_s",
        )
    synthesized = describe_trace(
        trace,
        start_s=observed.start_s,
        duration_s=duration,
        dataset=str(observed.window.get("dataset") or "live"),
        seed=seed,
    )
    return {
        "window": window.describe(),
        "observed": observed.to_dict(),
        "synthesized": synthesized.to_dict(),
        "synthesis": {"seed": seed, "rate_scale": rate_scale, "duration_s": duration, "requests": len(trace)},
        "match": workload_drift(observed, synthesized).to_dict(),
    }


def save_workload(store: Any, result: dict[str, Any], node: str) -> dict[str, str]:
    """Append the observed and the synthesized description of ``result`` (:func:`run_workload`) as two
    ``workloads`` rows and commit them (on the store's writer); their ids."""
    from analytics.workload import Workload
    from analytics.workload.stored import OBSERVED, SYNTHESIZED, new_workload_id, workload_row

    observed_id = new_workload_id()
    synthesized_id = new_workload_id()
    rows = [
        workload_row(
            Workload.from_dict(result["observed"]), kind=OBSERVED, node=node, workload_id=observed_id
        ),
        workload_row(
            Workload.from_dict(result["synthesized"]),
            kind=SYNTHESIZED,
            node=node,
            workload_id=synthesized_id,
            observed_id=observed_id,
            extra={**result["synthesis"], "match": result["match"]},
        ),
    ]
    store.append("workloads", rows)
    store.flush()
    return {"observed_id": observed_id, "synthesized_id": synthesized_id}


def add_workload_routes(app: Any, collector: Any, error: Callable[..., Any]) -> None:
    """The workload routes on the service's app (``error(status, message, param)``: the API's JSON
    errors)."""
    from collector.api import param_of
    from collector.store import StoreError

    def params_of(request: Request) -> dict[str, Any]:
        q = request.query_params
        params: dict[str, Any] = {k: q.get(k) for k in q if k != "node"}
        if q.getlist("node"):
            params["node"] = q.getlist("node")
        return params

    def compute(params: dict[str, Any]) -> dict[str, Any]:
        with collector.store.reader() as cur:
            return run_workload(cur, params)

    @app.get("/api/v1/workload")
    def workload(request: Request) -> Any:
        """The workload of a window, observed and synthesized side by side: ``dataset`` (live | a
        scenario id | latest), ``since`` or ``start_s``/``end_s``, ``node`` (repeatable), ``source``
        (auto | requests | engine_histograms), ``seed``, ``rate_scale``, ``duration_s``."""
        try:
            return compute(params_of(request))
        except AnalyticsError as e:
            return error(400, str(e), param_of(e, WORKLOAD_PARAMS))
        except StoreError as e:
            return error(500, f"the workload read failed on the store: {e}")

    @app.post("/api/v1/workload")
    async def store_workload(request: Request) -> Any:
        """Observe and synthesize as GET does (a JSON body of its parameters) and store both
        descriptions in ``workloads``; needs the control token when the collector has one."""
        from collector.api import control_post_body

        body = await control_post_body(request, collector.settings.control_token, '{"since": "1h"}')
        if not isinstance(body, dict):
            return body
        try:
            result = await asyncio.to_thread(compute, body)
        except AnalyticsError as e:
            return error(400, str(e), param_of(e, WORKLOAD_PARAMS))
        except StoreError as e:
            return error(500, f"the workload read failed on the store: {e}")
        try:
            fut = collector.submit(lambda: save_workload(collector.store, result, collector.settings.node))
            ids = await asyncio.to_thread(fut.result, WRITE_TIMEOUT_S)
        except Exception as e:  # the writer refused (stopping) or the store failed
            return error(503, f"the workload could not be stored: {type(e).__name__}: {e}")
        return result | ids

    @app.get("/api/v1/workloads")
    def workloads(limit: int = 20, kind: str | None = None, dataset: str | None = None) -> Any:
        """The stored workloads, newest first (summary columns and trust; no details)."""
        from analytics.workload.stored import list_workloads

        if not 1 <= limit <= 1000:
            return error(400, f"limit must be in [1, 1000], got {limit}", "limit")
        try:
            with collector.store.reader() as cur:
                return {"workloads": list_workloads(cur, limit=limit, kind=kind, dataset=dataset)}
        except AnalyticsError as e:
            return error(400, str(e), e.param)
