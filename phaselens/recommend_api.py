"""The service API's layout recommendations (issue 22): ``GET /api/v1/recommendations[?status=]``
(newest first, without details), ``GET /api/v1/recommendations/{id}`` (with details) and
``POST /api/v1/recommendations`` (make one now: a JSON body of
``analytics.recommend.inputs.BODY_FIELDS``, or a stored window — ``since``, ``dataset``,
``start_s``, ``end_s``, ``node``: phaselens/recommend_window.py — with the same SLO and budget
fields; the control token when the collector has one). The search
runs in a worker thread, one at a time: a POST while one runs gets 409. The row is written by the
collector's writer thread (``Collector.submit``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from analytics.recommend.choose import recommend
from analytics.recommend.inputs import RecommendError, inputs_from_body
from analytics.recommend.records import (
    get_recommendation,
    list_recommendations,
    recommendation_row,
    save_recommendation,
)
from analytics.recommend.search import SearchOptions
from analytics.window import AnalyticsError
from phaselens.recommend_window import is_window_body, recommend_window

WRITE_TIMEOUT_S = 60.0


def add_recommend_routes(app: Any, collector: Any, error: Callable[..., Any]) -> None:
    """Add the routes (module docstring); ``error(status, message, param)`` makes the JSON errors."""
    import asyncio

    from fastapi import Request

    busy = threading.Lock()

    @app.get("/api/v1/recommendations")
    def recommendations(status: str | None = None, limit: int = 100) -> Any:
        if not 1 <= limit <= 10_000:
            return error(400, f"limit must be in [1, 10000], got {limit}", "limit")
        try:
            return {"recommendations": list_recommendations(collector.store, status=status, limit=limit)}
        except RecommendError as e:
            return error(400, str(e), e.param)

    @app.get("/api/v1/recommendations/{recommendation_id}")
    def one(recommendation_id: str) -> Any:
        try:
            return get_recommendation(collector.store, recommendation_id)
        except RecommendError as e:
            return error(404, str(e), e.param)

    def run(body: Any) -> dict[str, Any]:
        try:
            if is_window_body(body):  # a stored window: trace, measured figures, layout from the store
                return recommend_window(
                    collector.store,
                    body,
                    serving_urls=collector.settings.serving_urls,
                    node=collector.settings.node,
                    submit=lambda write: collector.submit(write).result(timeout=WRITE_TIMEOUT_S),
                )
            inputs, min_gain = inputs_from_body(body)
            rec = recommend(inputs, SearchOptions(min_gain_pct=min_gain))
            row = recommendation_row(rec, node=collector.settings.node)
            collector.submit(lambda: save_recommendation(collector.store, row)).result(
                timeout=WRITE_TIMEOUT_S
            )
            return row
        finally:
            busy.release()

    async def make(request: Request) -> Any:
        from collector.api import control_post_body

        body = await control_post_body(request, collector.settings.control_token, '{"since": "1h"}')
        if not isinstance(body, dict):
            return body
        if not busy.acquire(blocking=False):
            return error(409, "a recommendation is being made; retry when it is done (one runs at a time)")
        try:
            row = await asyncio.to_thread(run, body)
        except AnalyticsError as e:  # RecommendError too: a bad field, an empty or unknown window
            return error(400, str(e), e.param)
        except Exception as e:  # the writer refused (stopping) or the store failed
            return error(503, f"the recommendation could not be made or stored: {type(e).__name__}: {e}")
        return row | {"url": f"/api/v1/recommendations/{row['recommendation_id']}"}

    make.__annotations__["request"] = Request
    app.post("/api/v1/recommendations")(make)
