"""The collector's HTTP API: health, the tables, simulated scenarios, and the import of Parquet
exports, with the API's error shape; the service process (phaselens/api.py) adds the reads (table
ranges, latest values per device, the analytics, reports, GET /metrics) to this app.

The dashboard, reports and CLI read the store only through the service's API (DuckDB admits no
second process beside the writer). ``POST /api/v1/import`` is a control endpoint (bearer token, ``phaselens collect
--control-token`` or ``PHASELENS_CONTROL_TOKEN``): the writer thread merges the export, so a
simulator (or another node) adds rows while the collector holds the file.

Every error is JSON, ``{"error": {"message", "type", "param", "code"}}``: a bad parameter a 400
naming it and what is allowed, an unknown route a 404 and a wrong method a 405 in the same shape,
and any unexpected failure a 500 naming the error (logged), never a plain-text page. Time
parameters (phaselens/api.py's reads) are checked in one place (``analytics.window.epoch_s`` /
``parse_span_s``, through ``analytics.reads.window_of`` for the analytics reads): finite, UTC
epoch seconds up to 9999, spans in (0, 36500d].
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pandas as pd
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from collector.service import Collector, CollectorNotRunning
from collector.store import ExportFormatError, ImportResult, StoreError, list_scenarios
from collector.store.tables import TABLES

log = logging.getLogger(__name__)

MAX_ROWS = 100_000
IMPORT_TIMEOUT_S = 600.0  # how long POST /api/v1/import waits for the writer to merge an export
_IMPORT_FIELDS = ("path",)
_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """DataFrame rows as JSON-safe dicts (NaN/NaT → null)."""
    rows = df.astype(object).where(df.notna(), None).to_dict(orient="records")
    for row in rows:
        for k, v in row.items():
            if isinstance(v, float) and not math.isfinite(v):
                row[k] = None
            elif hasattr(v, "item"):  # numpy scalars
                row[k] = v.item()
    return rows


def error_response(
    status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The API's JSON error, ``{"error": {"message", "type", "param", "code"}}``, with ``status``."""
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body = {"message": message, "type": kind, "param": param, "code": status}
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def param_of(e: Exception, allowed: set[str]) -> str | None:
    """The request parameter an analytics error is about: its ``param``, else the one its message
    starts with."""
    return getattr(e, "param", None) or next((p for p in sorted(allowed) if str(e).startswith(p)), None)


def _route_paths(app: FastAPI) -> list[str]:
    """The app's route paths, sorted (a 404 lists them)."""
    return sorted({getattr(r, "path", "") for r in app.routes} - {""})


def _allowed_methods(app: FastAPI, request: Request) -> str:
    """The methods of every route at the request's path (Starlette's 405 names one route's)."""
    from starlette.routing import Match

    methods: set[str] = set()
    for route in app.routes:
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods - {"HEAD"})) or "none"


def control_denied(request: Request, token: str | None) -> JSONResponse | None:
    """The error response of a control request without the right bearer token, else None."""
    if not token:
        return error_response(
            403,
            "control endpoints are off: start the collector with `phaselens collect --control-token TOKEN` "
            "(or PHASELENS_CONTROL_TOKEN=TOKEN) and send `Authorization: Bearer TOKEN`",
        )
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        return error_response(
            401,
            "missing or wrong bearer token for the control endpoint (send `Authorization: Bearer TOKEN`, "
            "the collector's --control-token)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return None


async def control_post_body(
    request: Request, token: str | None, example: str
) -> dict[str, Any] | JSONResponse:
    """A POST's JSON object body (an empty body is ``{}``), after the bearer check when the collector
    has a control token; else the error response to send (401, or 400 naming what was wrong, with
    ``example`` of a good body)."""
    if token:
        denied = control_denied(request, token)
        if denied is not None:
            return denied
    try:
        body = await request.json() if (await request.body()).strip() else {}
    except ValueError as e:
        return error_response(400, f"request body is not valid JSON: {e}")
    if not isinstance(body, dict):
        return error_response(400, f"request body must be a JSON object, e.g. {example}")
    return body


async def _import_path(request: Request) -> Path | JSONResponse:
    """The export directory named by an import request's JSON body, or the 400 saying what is wrong."""
    try:
        body = await request.json()
    except (ValueError, RecursionError) as e:
        return error_response(400, f"request body is not valid JSON: {e}")
    if not isinstance(body, dict):
        return error_response(400, 'request body must be a JSON object: {"path": "<export directory>"}')
    unknown = sorted(set(body) - set(_IMPORT_FIELDS))
    if unknown:
        return error_response(
            400, f"unknown field(s) {', '.join(unknown)}; fields: {', '.join(_IMPORT_FIELDS)}", unknown[0]
        )
    path = body.get("path")
    if path is None:
        return error_response(
            400, "missing 'path': the export directory to import (absolute, on the collector's host)", "path"
        )
    if not isinstance(path, str) or not path.strip():
        return error_response(400, f"'path' must be a non-empty string, got {path!r}", "path")
    if "\x00" in path or not Path(path).is_absolute():
        return error_response(
            400, f"'path' must be an absolute path on the collector's host, got {path!r}", "path"
        )
    return Path(path)


def _import_body(path: Path, result: ImportResult) -> dict[str, Any]:
    names = sorted(set(result.inserted) | set(result.duplicates))
    tables = {
        n: {"inserted": result.inserted.get(n, 0), "duplicates": result.duplicates.get(n, 0)} for n in names
    }
    return {
        "path": str(path),
        "schema_version": result.schema_version,
        "tables": tables,
        "inserted": sum(result.inserted.values()),
        "duplicates": sum(result.duplicates.values()),
        "ignored_columns": result.ignored_columns,
    }


def _decode_json(rows: list[dict[str, Any]], columns: list[str]) -> list[dict[str, Any]]:
    """JSON text of ``columns`` as values (a row stored by DuckDB always holds valid JSON)."""
    for row in rows:
        for c in columns:
            if isinstance(row.get(c), str):
                row[c] = json.loads(row[c])
    return rows


def create_collector_app(collector: Collector) -> FastAPI:
    """The app; the collector's threads (and the jobs added to it) run for the app's lifetime and
    are flushed at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        collector.start()
        try:
            yield
        finally:
            collector.stop()
            try:
                collector.store.close()
            except StoreError as e:  # rows the disk refused to the end: said, the process still exits
                log.error("closing the store: %s", e)

    app = FastAPI(title="phaselens collector", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def invalid_params(request: Request, exc: RequestValidationError) -> JSONResponse:
        """A query parameter of the wrong type (``limit=x``): a 400 in the API's error shape."""
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(
            400, f"invalid parameter '{param}': {first.get('msg', 'invalid value')}", param=param
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Starlette's own errors (an unknown route, a wrong method) in the API's error shape."""
        path, method = request.url.path, request.method
        if exc.status_code == 404:
            message = f"no route {method} {path}; routes: {', '.join(_route_paths(app))} (GET /openapi.json)"
        elif exc.status_code == 405:
            allowed = _allowed_methods(app, request)
            message = f"method {method} is not allowed on {path}; allowed: {allowed}"
            return error_response(405, message, headers={"Allow": allowed})
        else:
            message = str(exc.detail)
        return error_response(exc.status_code, message, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        """Anything a route did not handle: a JSON 500 naming the error (and logged)."""
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(
            500, f"{request.method} {request.url.path} failed on the collector: {type(exc).__name__}: {exc}"
        )

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return collector.health()

    @app.get("/api/v1/tables")
    async def tables() -> dict[str, Any]:
        return {"tables": {name: {"time_column": spec.time_column} for name, spec in sorted(TABLES.items())}}

    # Reads are plain functions (FastAPI runs them on its thread pool): one waiting for the store
    # (an import holds its lock while it runs) does not stall the event loop, /health or the others.
    @app.get("/api/v1/scenarios")
    async def scenarios(limit: int = 1_000) -> Any:
        """Simulated scenarios, newest first (JSON fields as values)."""
        if not 1 <= limit <= MAX_ROWS:
            return error_response(400, f"limit must be in [1, {MAX_ROWS}], got {limit}", "limit")
        try:  # off the event loop: a running import holds the store's lock
            df = await asyncio.to_thread(list_scenarios, collector.store, limit=limit)
        except StoreError as e:
            return error_response(400, str(e))
        json_cols = [c.name for c in collector.store.columns("scenarios") if c.is_json]
        return {"scenarios": _decode_json(records(df), json_cols), "truncated": len(df) == limit}

    @app.post("/api/v1/import")
    async def import_export(request: Request) -> Any:
        """Merge a `phaselens store export` directory into the store (control endpoint)."""
        denied = control_denied(request, collector.settings.control_token)
        if denied is not None:
            return denied
        path = await _import_path(request)
        if isinstance(path, JSONResponse):
            return path
        try:
            job = collector.import_export(path)
        except CollectorNotRunning as e:
            return error_response(503, str(e))
        try:
            result = await asyncio.wait_for(asyncio.wrap_future(job), IMPORT_TIMEOUT_S)
        except TimeoutError:
            return error_response(
                504,
                f"the import of {path} did not finish within {IMPORT_TIMEOUT_S:g} s; it is cancelled if it "
                "had not started, else it commits whole or not at all (GET /api/v1/scenarios, /health)",
            )
        except CollectorNotRunning as e:
            return error_response(503, str(e))
        except ExportFormatError as e:
            return error_response(422, str(e), "path")
        except StoreError as e:
            return error_response(500, f"import of {path} failed, nothing was imported: {e}")
        except Exception as e:  # a JSON 500 naming the error, never a plain-text page
            log.exception("import of %s failed", path)
            return error_response(
                500, f"import of {path} failed, nothing was imported: {type(e).__name__}: {e}"
            )
        return _import_body(path, result)

    return app
