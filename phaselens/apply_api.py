"""The service API of applying layout recommendations (phaselens/apply/):

- ``POST /api/v1/recommendations/{id}/apply`` — ``{"dry_run": true}`` by default; options ``guard_s``,
  ``settle_s``, ``drain_timeout_s``, ``max_steps``, ``max_add``, ``max_error_rate``, ``min_requests``.
  202 with the plan and its action ids; an execution runs on a background thread (409 while another
  apply or rollback runs). The stack is called with the collector's control token.
- ``POST /api/v1/actions/{id}/rollback`` — restore the layout from before the apply that action (or
  recommendation id) belongs to.
- ``GET /api/v1/actions[?recommendation_id=&limit=]`` — the audit rows, oldest first, with the running
  apply's progress (current step, guard time left), the auto-apply policy's state and the runtime
  power guard's (``power_guard``: phaselens/apply/power_guard.py).

The POSTs need the collector's control token.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from collector.api import control_denied, error_response
from collector.service import Collector
from collector.store import StoreError
from phaselens.apply.audit import Audit
from phaselens.apply.coordinator import ApplyCoordinator
from phaselens.apply.plan import ApplyError
from phaselens.apply.policy import AutoApplyJob, AutoApplyPolicy
from phaselens.apply.power_guard import PowerGuardJob
from phaselens.apply.runner import ApplyOptions

_NUMBERS = {"guard_s", "settle_s", "drain_timeout_s", "max_error_rate"}
_INTS = {"max_steps", "max_add", "min_requests"}
FIELDS = {"dry_run"} | _NUMBERS | _INTS


def options_from(body: dict[str, Any], *, actor: str = "phaselens-apply") -> ApplyOptions:
    """ApplyOptions from a JSON body; ApplyError naming a field that is unknown or of the wrong type."""
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise ApplyError(f"unknown field(s) {', '.join(unknown)}; fields: {', '.join(sorted(FIELDS))}")
    dry = body.get("dry_run", True)
    if not isinstance(dry, bool):
        raise ApplyError(f"'dry_run' must be true or false, got {dry!r}")
    kw: dict[str, Any] = {}
    for key in _NUMBERS | _INTS:
        if key not in body:
            continue
        v = body[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ApplyError(f"'{key}' must be a number, got {v!r}")
        if key in _INTS and v != int(v):
            raise ApplyError(f"'{key}' must be a whole number, got {v!r}")
        kw[key] = int(v) if key in _INTS else float(v)
    opts = ApplyOptions(execute=not dry, actor=actor, **kw)
    opts.check()
    return opts


def add_apply_routes(app: Any, collector: Collector) -> ApplyCoordinator:
    """The apply routes on ``app``; the coordinator and (when the settings turn it on) the auto-apply
    policy run as the collector's jobs."""
    from fastapi import Request

    settings = collector.settings
    audit = Audit(collector.store, settings.node, writer=lambda fn: collector.submit(fn).result())
    coordinator = ApplyCoordinator(audit, settings.control_token, allowed_urls=list(settings.serving_urls))
    collector.add_job(coordinator)
    app.state.apply_coordinator, app.state.auto_apply, app.state.apply_audit = coordinator, None, audit
    app.state.power_guard = None

    async def body_of(request: Request) -> dict[str, Any]:
        raw = await request.body()
        if not raw.strip():
            return {}
        try:
            body = await request.json()
        except ValueError as e:
            raise ApplyError(f"request body is not valid JSON: {e}") from e
        if not isinstance(body, dict):
            raise ApplyError('request body must be a JSON object, e.g. {"dry_run": false}')
        return body

    def failed(e: Exception) -> Any:
        if isinstance(e, ApplyError):
            return error_response(e.status, str(e))
        if isinstance(e, StoreError):
            return error_response(500, f"the store refused the audit rows: {e}")
        return error_response(503, f"{type(e).__name__}: {e}")

    async def apply(recommendation_id: str, request: Request) -> Any:
        denied = control_denied(request, settings.control_token)
        if denied is not None:
            return denied
        try:
            options = options_from(await body_of(request))
            summary = await asyncio.to_thread(coordinator.apply, recommendation_id, options)
        except Exception as e:
            return failed(e)
        from fastapi.responses import JSONResponse

        summary["progress_url"] = f"/api/v1/actions?recommendation_id={recommendation_id}"
        return JSONResponse(summary, status_code=202)

    async def rollback(action_id: str, request: Request) -> Any:
        denied = control_denied(request, settings.control_token)
        if denied is not None:
            return denied
        try:
            body = await body_of(request)
            extra = sorted(set(body) - {"drain_timeout_s"})
            if extra:
                raise ApplyError(f"unknown field(s) {', '.join(extra)}; fields: drain_timeout_s")
            options = options_from(body, actor="phaselens-rollback")
            return await asyncio.to_thread(coordinator.rollback, action_id, options)
        except Exception as e:
            return failed(e)

    def actions(recommendation_id: str | None = None, limit: int = 1000) -> Any:
        if not 1 <= limit <= 10_000:
            return error_response(400, f"limit must be in [1, 10000], got {limit}", "limit")
        try:
            rows = audit.actions(recommendation_id=recommendation_id, limit=limit)
        except StoreError as e:
            return error_response(500, str(e))
        return {
            "actions": rows,
            "running": coordinator.progress(),
            "last": coordinator.last,
            "auto_apply": app.state.auto_apply.health() if app.state.auto_apply else {"enabled": False},
            "power_guard": app.state.power_guard.health() if app.state.power_guard else {"enabled": False},
        }

    # fastapi is imported here only (see phaselens/reports.py): hand it the class itself
    apply.__annotations__["request"] = Request
    rollback.__annotations__["request"] = Request
    app.post("/api/v1/recommendations/{recommendation_id}/apply")(apply)
    app.post("/api/v1/actions/{action_id}/rollback")(rollback)
    app.get("/api/v1/actions")(actions)
    return coordinator


def enable_auto_apply(
    app: Any, collector: Collector, policy: AutoApplyPolicy, recommend: Callable[[], str | None] | None = None
) -> AutoApplyJob:
    """Run the auto-apply ``policy`` as a job of the service (``phaselens collect --auto-apply``; call
    before the app starts). ``recommend``: the hook that stores a fresh recommendation from the latest
    window before each decision (the recommender's; None: decide on the newest stored one)."""
    job = AutoApplyJob(
        policy,
        app.state.apply_coordinator,
        app.state.apply_audit,
        list(collector.settings.serving_urls),
        recommend=recommend,
    )
    collector.add_job(job, health_key="auto_apply")
    app.state.auto_apply = job
    return job


def enable_power_guard(app: Any, collector: Collector, window_s: float) -> PowerGuardJob | None:
    """Run the runtime power guard as a job of the service (call before the app starts): every
    ``window_s`` it judges the lanes of each watched stack's applied power recommendation and releases
    those that breach. None (not run) without a ``--serving`` stack or a control token to act with."""
    settings = collector.settings
    if not settings.serving_urls or not settings.control_token:
        return None
    job = PowerGuardJob(
        app.state.apply_audit,
        settings.control_token,
        list(settings.serving_urls),
        window_s=window_s,
        coordinator=app.state.apply_coordinator,
    )
    collector.add_job(job, health_key="power_guard")
    app.state.power_guard = job
    return job
