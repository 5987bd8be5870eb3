"""Control API (bearer token): read and change the pool layout and per-worker device knobs.

Every change is emitted as a `control` telemetry event with before/after. Layout changes drain
first: a draining worker takes no new requests and finishes the ones it has. A change that would
leave the pool unable to serve (the last prefill, decode or mixed worker that is ready or coming
back) is refused with 409 unless `force` is true. Every error is JSON in the OpenAI error shape
(`{"error": {"message", "type", "param", "code"}}`, written by the router's handlers from the
`detail` of the HTTPException raised here), and a field of the wrong type or range is a 400 naming
the field.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from serving.devices import parse_device_spec
from serving.devices.errors import DeviceError
from serving.pool import WorkerCallError, WorkerHandle, WorkerPool
from serving.worker import ROLES

_CALL_STATUS = {
    "DevicePermissionError": 403,
    "DeviceNotSupportedError": 501,
    "DeviceValueError": 400,
    "ValueError": 400,
    "DeviceLostError": 503,
    "WorkerDied": 409,
}
DEFAULT_DRAIN_TIMEOUT_S = 120.0
MAX_DRAIN_TIMEOUT_S = 3600.0


_ERROR_TYPES = {401: "authentication_error", 403: "permission_error"}  # other 4xx: invalid_request_error


def error_type(status: int) -> str:
    """The OpenAI-style error ``type`` of an HTTP status."""
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    return "server_error" if status >= 500 else "invalid_request_error"


def _fail(status: int, message: str, param: str | None = None) -> HTTPException:
    return HTTPException(status_code=status, detail={"message": message, "param": param})


class _JSONErrorRoute(APIRoute):
    """A route whose unexpected errors are a JSON 500 naming the error, not a plain-text page."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except HTTPException:
                raise
            except Exception as e:
                traceback.print_exc()
                message = f"internal error in the control API: {type(e).__name__}: {e}"
                body = {"message": message, "type": "server_error", "param": None, "code": 500}
                return JSONResponse({"error": body}, status_code=500)

        return run


async def _body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (ValueError, RecursionError) as e:  # RecursionError: nested too deeply
        raise _fail(400, f"request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise _fail(400, "request body must be a JSON object")
    return body


def build_control_router(get_pool: Callable[[], WorkerPool | None], token: str) -> APIRouter:
    """Routes under /control, each requiring `Authorization: Bearer <token>`."""

    def auth(request: Request) -> str:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip(), token):
            raise HTTPException(401, detail={"message": "missing or wrong bearer token for the control API"})
        return "control-api"

    router = APIRouter(prefix="/control", dependencies=[Depends(auth)], route_class=_JSONErrorRoute)

    def pool() -> WorkerPool:
        p = get_pool()
        if p is None:
            raise _fail(503, "the server is starting")
        return p

    def worker(worker_id: str, *, allow_dead: bool = False) -> WorkerHandle:
        w = pool().workers.get(worker_id)
        if w is None or w.state == "stopped":
            known = ", ".join(pool().workers) or "none"
            raise _fail(404, f"no worker {worker_id!r}; workers: {known}")
        if w.state == "dead" and not allow_dead:
            raise _fail(409, f"{w.status_note()}; remove it with DELETE /control/workers/{w.id}")
        return w

    def audit(action: str, target: str, before: Any, after: Any) -> None:
        pool().telemetry.emit(
            "control",
            ts_s=time.time(),
            action=action,
            target=target,
            before=before,
            after=after,
            actor="control-api",
        )

    async def drain(w: WorkerHandle, timeout_s: float, outcome: str, accept_dead: bool = False) -> None:
        """Stop routing to `w` and wait for its in-flight requests; raise if that fails."""
        w.state = "draining"
        deadline = time.monotonic() + timeout_s
        while w.inflight and time.monotonic() < deadline and w.state == "draining":
            await asyncio.sleep(0.02)
        if w.state == "dead" and accept_dead:
            return
        if w.state != "draining":
            raise _fail(409, f"{w.id} became {w.state} while draining; {outcome}")
        if w.inflight:
            w.state = "ready"
            raise _fail(504, f"{w.id} still had {len(w.inflight)} requests after {timeout_s} s; {outcome}")

    @router.get("/layout")
    async def layout() -> dict[str, Any]:
        return pool().layout()

    @router.post("/workers")
    async def add_worker(request: Request) -> JSONResponse:
        """Start a worker: {"role": "mixed"|"prefill"|"decode", "device": "cpu"|"cuda:N"|...}."""
        body = await _body(request)
        _only(body, {"role", "device"})
        role = body.get("role", "mixed")
        if not isinstance(role, str) or role not in ROLES:
            raise _fail(400, f"unknown role {role!r}; allowed: {', '.join(ROLES)}", "role")
        device = body.get("device")
        if device is not None:
            if not isinstance(device, str):
                raise _fail(
                    400, f"'device' must be a string such as 'cpu' or 'cuda:0', got {device!r}", "device"
                )
            try:
                parse_device_spec(device)
            except DeviceError as e:
                raise _fail(400, str(e), "device") from e
        p = pool()
        template = p.template
        if template is None:
            raise _fail(409, "no worker to copy model and engine settings from")
        before = p.layout()
        try:
            w = await p.start_worker(p.spec_like(template, device), role)
        except (RuntimeError, TimeoutError) as e:
            raise _fail(500, f"worker failed to start: {e}") from e
        audit("add_worker", w.id, before, p.layout())
        return JSONResponse(w.describe(), status_code=201)

    @router.delete("/workers/{worker_id}")
    async def remove_worker(worker_id: str, request: Request) -> dict[str, Any]:
        """Drain the worker (no new requests; in-flight ones finish), then stop it. A dead worker is
        taken out of the pool and its pending restart cancelled. Query: timeout_s, force."""
        query = dict(request.query_params)
        unknown = set(query) - {"timeout_s", "force"}
        if unknown:
            raise _fail(400, f"unknown query parameter(s) {sorted(unknown)}; allowed: ['force', 'timeout_s']")
        timeout_s = _timeout(query.get("timeout_s", DEFAULT_DRAIN_TIMEOUT_S))
        force = _flag(query.get("force", False), "force")
        w, p = worker(worker_id, allow_dead=True), pool()
        _refuse_stranding(p, w, None, force)
        before = p.layout()
        if w.state in ("ready", "draining"):
            await drain(w, timeout_s, "left running", accept_dead=True)
        await p.stop_worker(w)
        audit("remove_worker", worker_id, before, p.layout())
        return p.layout()

    @router.post("/workers/{worker_id}/role")
    async def set_role(worker_id: str, request: Request) -> dict[str, Any]:
        """Drain the worker, then give it a new role: {"role": "prefill"|"decode"|"mixed"}, optional
        "timeout_s" (drain limit) and "force" (allow leaving the pool unable to serve)."""
        body = await _body(request)
        _only(body, {"role", "timeout_s", "force"})
        role = body.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise _fail(400, f"unknown role {role!r}; allowed: {', '.join(ROLES)}", "role")
        timeout_s = _timeout(body.get("timeout_s", DEFAULT_DRAIN_TIMEOUT_S))
        force = _flag(body.get("force", False), "force")
        w, p = worker(worker_id), pool()
        if w.state not in ("ready", "draining"):
            raise _fail(409, f"{w.status_note()}; a role can change only on a ready worker")
        if role != w.role:
            _refuse_stranding(p, w, role, force)
        before = w.describe()
        old_role = w.role
        await drain(w, timeout_s, "role unchanged")
        w.role, w.state = role, "ready"
        audit("set_role", worker_id, {"role": old_role, **before}, w.describe())
        return w.describe()

    @router.get("/workers/{worker_id}/device")
    async def get_device(worker_id: str) -> Any:
        return await _call(pool(), worker(worker_id), "knobs")

    @router.post("/workers/{worker_id}/device")
    async def set_device(worker_id: str, request: Request) -> Any:
        """Set knobs: {"power_limit_w": W} and/or {"sm_clock_min_mhz": a, "sm_clock_max_mhz": b};
        {"reset": true} restores defaults. Returns the knobs after the change."""
        body = await _body(request)
        allowed = {"power_limit_w", "sm_clock_min_mhz", "sm_clock_max_mhz", "reset"}
        unknown = set(body) - allowed
        if unknown or not body:
            raise _fail(400, f"unknown or no knob(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
        reset = _flag(body.get("reset", False), "reset")
        w, p = worker(worker_id), pool()
        before = await _call(p, w, "knobs")
        if reset:
            await _call(p, w, "reset_power_limit", tolerate_unsupported=True)
            await _call(p, w, "reset_sm_clocks", tolerate_unsupported=True)
        if "power_limit_w" in body:
            await _call(p, w, "set_power_limit_w", limit_w=_num(body, "power_limit_w"))
        if "sm_clock_min_mhz" in body or "sm_clock_max_mhz" in body:
            if not {"sm_clock_min_mhz", "sm_clock_max_mhz"} <= set(body):
                raise _fail(400, "give both sm_clock_min_mhz and sm_clock_max_mhz")
            await _call(
                p,
                w,
                "set_sm_clock_range_mhz",
                min_mhz=_int(body, "sm_clock_min_mhz"),
                max_mhz=_int(body, "sm_clock_max_mhz"),
            )
        after = await _call(p, w, "knobs")
        audit("set_device", worker_id, before, after)
        return after

    return router


def _num(body: dict[str, Any], key: str) -> float:
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(400, f"'{key}' must be a finite number, got {value!r}", key)
    return float(value)


def _int(body: dict[str, Any], key: str) -> int:
    value = _num(body, key)
    if value != int(value):
        raise _fail(400, f"'{key}' must be a whole number, got {body[key]!r}", key)
    return int(value)


def _only(body: dict[str, Any], allowed: set[str]) -> None:
    unknown = set(body) - allowed
    if unknown:
        raise _fail(400, f"unknown field(s) {sorted(unknown)}; allowed: {sorted(allowed)}")


def _timeout(value: Any) -> float:
    """A drain timeout from JSON (number) or a query string (text): finite, > 0, <= 3600 s."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            value = None
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not 0 < value <= MAX_DRAIN_TIMEOUT_S:
        raise _fail(
            400, f"'timeout_s' must be a number of seconds in (0, {MAX_DRAIN_TIMEOUT_S:g}]", "timeout_s"
        )
    return float(value)


def _flag(value: Any, key: str) -> bool:
    """A boolean from JSON (true/false) or a query string ("true"/"false"/"1"/"0")."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    raise _fail(400, f"'{key}' must be true or false, got {value!r}", key)


def _refuse_stranding(p: WorkerPool, w: WorkerHandle, new_role: str | None, force: bool) -> None:
    reason = p.strand_reason(w, new_role)
    if reason is not None and not force:
        raise _fail(409, reason, "force")


async def _call(
    p: WorkerPool, w: WorkerHandle, method: str, tolerate_unsupported: bool = False, **kw: Any
) -> Any:
    try:
        return await p.call(w, method, **kw)
    except WorkerCallError as e:
        if tolerate_unsupported and e.error_type == "DeviceNotSupportedError":
            return None
        raise _fail(_CALL_STATUS.get(e.error_type, 500), str(e)) from e
    except TimeoutError as e:
        raise _fail(504, f"{w.id} did not answer {method}") from e
