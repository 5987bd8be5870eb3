"""The HTTP frontend: OpenAI-compatible API, /metrics, /health, telemetry and the control API."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from serving.admission import RETRY_AFTER_S, Admission, BodyTooLarge, abort_on_disconnect, read_body
from serving.control import build_control_router, error_type
from serving.device_sampler import SAMPLED_STATES, DeviceSampler, snapshot_workers, worker_item
from serving.devices.emulated_label import emulated_device_label
from serving.metrics import ServingMetrics
from serving.openai_api import (
    BadRequest,
    ParsedRequest,
    chunk,
    full_response,
    loads_body,
    parse_request,
    usage_chunk,
)
from serving.output_text import OutputText
from serving.pool import NoWorkerError, RequestState, WorkerPool, stop_fork_server
from serving.scheduler import AdmissionError, Scheduler
from serving.settings import ServeSettings
from serving.telemetry import TelemetryHub, parse_after
from serving.tokenizer import load_tokenizer

log = logging.getLogger("phaselens.router")


def _error(
    status: int, message: str, kind: str = "invalid_request_error", param: str | None = None
) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}, status_code=status
    )


MAX_WINDOW_S = 10.0  # an emulated device keeps this much modeled history
COLLECT_SCHEMA = "phaselens.collect"  # GET /v1/collect's answer


def _emulation_summary(label: dict[str, Any], sample: dict[str, Any]) -> dict[str, Any]:
    """An emulated worker's ``emulation`` object in /v1/devices: what it models and its lag counters."""
    iterations = sample.get("iterations_total") or 0
    lagged = sample.get("lagged_iterations_total") or 0
    return {
        "gpu": label["gpu"],
        "models_shape": label["models_shape"],
        "dtype": label.get("dtype", "bf16"),
        "validated": label.get("validated", True),
        **({"fidelity": label["fidelity"]} if label.get("fidelity") else {}),
        "iterations": iterations,
        "paced_iterations": sample.get("paced_iterations_total"),
        "lagged_iterations": lagged,
        "lag_s_total": sample.get("lag_s_total"),
        "modeled_s_total": sample.get("modeled_s_total"),
        "host_bound_fraction": lagged / iterations if iterations else 0.0,
    }


def create_app(settings: ServeSettings) -> FastAPI:
    """Build the app; the worker processes start in its lifespan (before it accepts requests)."""
    settings.validate()
    model_cfg = settings.model_config()
    tokenizer = load_tokenizer(settings.model, model_cfg)
    dtype_bytes = 2 if settings.dtype in ("bfloat16", "bf16", "float16", "fp16") else 4
    limits = Scheduler(settings.engine.resolved(model_cfg, dtype_bytes))  # admission checks only
    token = settings.resolve_token()
    hub = TelemetryHub(spool_path=settings.telemetry_spool)
    state: dict[str, Any] = {"pool": None}
    admission = Admission(settings.max_waiting_requests, settings.max_body_bytes)
    metrics = ServingMetrics(settings.model_name, lambda: state["pool"], admission.rejected)
    sampler = DeviceSampler(lambda: state["pool"], settings.device_sample_interval_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = WorkerPool(
            hub,
            on_finish=metrics.on_finish,
            on_token=metrics.on_token,
            restart_delay_s=settings.restart_delay_s,
            max_restart_delay_s=settings.max_restart_delay_s,
        )
        state["pool"] = app.state.pool = pool
        try:
            await asyncio.gather(*(pool.start_worker(spec, role) for role, spec in settings.worker_specs()))
            pool.telemetry.emit(
                "control",
                ts_s=time.time(),
                action="start",
                target="pool",
                before=None,
                # the served model (/v1/models' id): the collector's exports label its GPUs with it
                after={**pool.layout(), "model": settings.model_name},
                actor="cli",
            )
            yield
        finally:
            await sampler.stop()
            await pool.shutdown()
            stop_fork_server()
            hub.close()

    app = FastAPI(title="phaselens serving", lifespan=lifespan)
    app.state.settings = settings

    @app.exception_handler(RequestValidationError)
    async def invalid_params(request: Request, exc: RequestValidationError) -> JSONResponse:
        """FastAPI's query/path validation failures as 400s in the OpenAI error shape."""
        errors = exc.errors()
        first = errors[0] if errors else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return _error(400, f"invalid parameter '{param}': {first.get('msg', 'invalid value')}", param=param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """Routing errors (404, 405) and the control API's errors in the OpenAI error shape."""
        detail = exc.detail if isinstance(exc.detail, dict) else {"message": str(exc.detail)}
        response = _error(
            exc.status_code,
            str(detail.get("message")),
            kind=error_type(exc.status_code),
            param=detail.get("param"),
        )
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        """Whatever escapes a handler: logged, answered as a JSON 500 (never a plain-text one)."""
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return _error(500, f"internal server error: {type(exc).__name__}", kind="server_error")

    app.state.hub = hub
    app.state.sampler = sampler
    app.include_router(build_control_router(lambda: state["pool"], token))

    @app.get("/health")
    async def health() -> JSONResponse:
        """`ok` / `degraded` (200: requests can be served) or `unavailable` (503), per role, with reasons."""
        pool: WorkerPool | None = state["pool"]
        if pool is None:
            body = {"status": "unavailable", "reasons": ["the server is starting"], "ready_workers": []}
        else:
            body = pool.health()
            body["admission"] = admission.summary(pool)
            overload = admission.health_reason(pool)
            if overload is not None:
                body["reasons"].append(overload)
                if body["status"] == "ok":
                    body["status"] = "degraded"
        return JSONResponse(body, status_code=503 if body["status"] == "unavailable" else 200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": settings.model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "phaselens",
                    "max_model_len": limits.cfg.max_model_len,
                    "phaselens": {"devices": _worker_devices()},
                }
            ],
        }

    def _worker_devices() -> list[dict[str, Any]]:
        """Each worker's device and, for an emulated GPU, that it is emulated and which shape it models."""
        pool: WorkerPool | None = state["pool"]
        out = []
        for w in pool.workers.values() if pool else []:
            if w.state not in ("ready", "draining"):
                continue
            label = emulated_device_label(
                w.spec.device, w.spec.emulate_shape or w.spec.model, w.spec.emulate_dtype
            )
            out.append({"worker": w.id, **(label or {"device": w.spec.device, "emulated": False})})
        return out

    @app.get("/v1/devices")
    async def devices(window_s: float | None = None) -> JSONResponse:
        """One consistent snapshot per worker's device (read-only; emulated devices are labelled).

        ``window_s``: the trailing window an emulated device's means cover (default 0.1 s); measured
        devices ignore it. An emulated worker's item also has ``emulation``: what it models and how
        well the host kept pace (lag counters).
        """
        if window_s is not None and not 0 < window_s <= MAX_WINDOW_S:
            return _error(
                400,
                f"'window_s' must be in (0, {MAX_WINDOW_S:g}] seconds, got {window_s:g}",
                param="window_s",
            )
        pool: WorkerPool | None = state["pool"]
        workers = [w for w in pool.workers.values() if w.state in SAMPLED_STATES] if pool else []
        results = await snapshot_workers(pool, workers, window_s)
        out = []
        for w, res in zip(workers, results, strict=True):
            item: dict[str, Any] = worker_item(w)
            if isinstance(res, BaseException):
                item["error"] = str(res) or type(res).__name__
            else:
                item["sample"] = res
                label = emulated_device_label(
                    w.spec.device, w.spec.emulate_shape or w.spec.model, w.spec.emulate_dtype
                )
                if label is not None:
                    item["emulation"] = _emulation_summary(label, res)
            out.append(item)
        return JSONResponse({"devices": out})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    def _telemetry_read(after: str | None, limit: int) -> dict[str, Any] | JSONResponse:
        try:
            cursors = parse_after(after)
        except ValueError as e:
            return _error(400, str(e), param="after")
        if not 1 <= limit <= 10_000:
            return _error(400, f"'limit' must be in [1, 10000], got {limit}", param="limit")
        pool: WorkerPool | None = state["pool"]
        if pool is not None:
            pool.telemetry.flush()
        return hub.read(cursors, limit)

    @app.get("/v1/telemetry")
    async def telemetry(after: str | None = None, limit: int = 1000) -> JSONResponse:
        """Telemetry batches after the given per-source cursors ("src:seq,src:seq")."""
        read = _telemetry_read(after, limit)
        return read if isinstance(read, JSONResponse) else JSONResponse(read)

    @app.get("/v1/collect")
    async def collect(
        devices_after: int | None = None, after: str | None = None, limit: int = 1000, telemetry: bool = True
    ) -> JSONResponse:
        """Everything a collector polls, in one read: every worker's device samples the router took
        since ``devices_after`` (its sampler's tick seq; runs while read, every
        ``--device-sample-interval-s``), each tick with one item per worker (a sample, or the
        worker's error: a dead or restarting worker is ``down``), and the telemetry batches after
        ``after`` (as ``GET /v1/telemetry``; ``telemetry=false``: none, null). Read-only, like
        /v1/devices and /v1/telemetry."""
        read = _telemetry_read(after, limit) if telemetry else None
        if isinstance(read, JSONResponse):
            return read
        devices = await sampler.read(devices_after)
        return JSONResponse({"schema": COLLECT_SCHEMA, "version": 1, "devices": devices, "telemetry": read})

    async def _parse(request: Request, chat: bool) -> ParsedRequest | JSONResponse:
        try:
            body = loads_body(await read_body(request, admission.max_body_bytes))
            return parse_request(body, chat=chat, served_model=settings.model_name)
        except BadRequest as e:
            return JSONResponse(e.body(), status_code=400)
        except BodyTooLarge as e:
            admission.rejected["body_too_large"] += 1
            return _error(413, f"{e}; send a smaller request (--max-request-body-mb)")

    async def _serve(request: Request, chat: bool) -> Response:
        parsed = await _parse(request, chat)
        if isinstance(parsed, JSONResponse):
            return parsed
        prompt_ids = (
            parsed.prompt_ids if parsed.prompt_ids is not None else tokenizer.encode(parsed.prompt or "")
        )
        bad = [t for t in prompt_ids if not 0 <= t < model_cfg.vocab_size]
        if bad:
            return _error(
                400,
                f"prompt token id {bad[0]} is outside the vocabulary [0, {model_cfg.vocab_size})",
                param="prompt",
            )
        try:
            limits.check_admissible(len(prompt_ids), parsed.params.max_tokens)
        except AdmissionError as e:
            return _error(400, f"{e}; shorten the prompt or lower max_tokens", param="max_tokens")
        pool: WorkerPool | None = state["pool"]
        out = OutputText(tokenizer, prompt_ids, parsed.stop)
        try:
            if pool is None:
                raise NoWorkerError("the server is starting")
            full = admission.full(pool)
            if full is not None:
                admission.reject(pool, len(prompt_ids), full)
                response = _error(429, full, kind="rate_limit_exceeded")
                response.headers["Retry-After"] = str(RETRY_AFTER_S)
                return response
            req = pool.submit(prompt_ids, parsed.params, check_stop=out.add)
        except NoWorkerError as e:
            return _error(503, str(e), kind="service_unavailable")
        if parsed.stream:  # StreamingResponse cancels the stream when the client leaves
            return StreamingResponse(_stream(pool, req, parsed, out), media_type="text/event-stream")
        return await _collect(request, pool, req, parsed, out)

    async def _collect(
        request: Request,
        pool: WorkerPool,
        req: RequestState,
        parsed: ParsedRequest,
        out: OutputText,
    ) -> Response:
        watch = asyncio.create_task(abort_on_disconnect(request, pool, req))
        try:
            while True:
                kind, *rest = await req.events.get()
                if kind == "error":
                    return _error(500, f"request failed: {rest[0]}", kind="server_error")
                if kind == "done":
                    out.finish()
                    body = full_response(
                        req.request_id,
                        settings.model_name,
                        out.text,
                        rest[0],
                        len(req.prompt_ids),
                        len(req.output_ids),
                        chat=parsed.chat,
                        token_ids=(req.prompt_ids, req.output_ids) if parsed.return_token_ids else None,
                    )
                    return JSONResponse(body)
        except asyncio.CancelledError:
            pool.abort(req)
            raise
        finally:
            watch.cancel()

    async def _stream(
        pool: WorkerPool,
        req: RequestState,
        parsed: ParsedRequest,
        out: OutputText,
    ) -> AsyncIterator[bytes]:
        def sse(obj: dict[str, Any]) -> bytes:
            return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()

        def error_event(message: str) -> bytes:
            return sse({"error": {"message": message, "type": "server_error", "param": None, "code": 500}})

        first = True
        received = 0  # tokens taken off the queue: the text they decide is released with them
        try:
            while True:
                kind, *rest = await req.events.get()
                if kind == "token":
                    received += 1
                    reason = rest[1]
                    if reason is not None:
                        out.finish()
                    text = out.release(received)
                    yield sse(
                        chunk(
                            req.request_id, settings.model_name, text, reason, chat=parsed.chat, first=first
                        )
                    )
                    first = False
                elif kind == "error":
                    yield error_event(f"request failed: {rest[0]}")
                    break
                else:
                    if parsed.include_usage:
                        yield sse(
                            usage_chunk(
                                req.request_id,
                                settings.model_name,
                                len(req.prompt_ids),
                                len(req.output_ids),
                                chat=parsed.chat,
                            )
                        )
                    break
            yield b"data: [DONE]\n\n"
        except Exception as e:  # the status line is sent: report in-band, then end the stream
            log.error("stream of %s failed", req.request_id, exc_info=e)
            yield error_event(f"internal server error: {type(e).__name__}")
            yield b"data: [DONE]\n\n"
        finally:
            if not req.done:
                pool.abort(req, "client disconnected")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _serve(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _serve(request, chat=True)

    return app
