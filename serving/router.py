"""The HTTP frontend: OpenAI-compatible API, /metrics, /health, telemetry and the control API."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from serving.control import build_control_router
from serving.metrics import ServingMetrics
from serving.openai_api import BadRequest, ParsedRequest, chunk, full_response, parse_request, usage_chunk
from serving.pool import NoWorkerError, RequestState, WorkerPool
from serving.scheduler import AdmissionError, Scheduler
from serving.settings import ServeSettings
from serving.telemetry import TelemetryHub, parse_after
from serving.tokenizer import IncrementalDetokenizer, load_tokenizer


def _error(
    status: int, message: str, kind: str = "invalid_request_error", param: str | None = None
) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}, status_code=status
    )


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
    metrics = ServingMetrics(settings.model_name, lambda: state["pool"])

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = WorkerPool(hub, on_finish=metrics.on_finish, on_token=metrics.on_token)
        state["pool"] = app.state.pool = pool
        try:
            await asyncio.gather(*(pool.start_worker(spec, role) for role, spec in settings.worker_specs()))
            pool.telemetry.emit(
                "control",
                ts_s=time.time(),
                action="start",
                target="pool",
                before=None,
                after=pool.layout(),
                actor="cli",
            )
            yield
        finally:
            await pool.shutdown()
            hub.close()

    app = FastAPI(title="phaselens serving", lifespan=lifespan)
    app.state.settings = settings
    app.state.hub = hub
    app.include_router(build_control_router(lambda: state["pool"], token))

    @app.get("/health")
    async def health() -> JSONResponse:
        pool: WorkerPool | None = state["pool"]
        ready = [w.id for w in pool.workers.values() if w.state == "ready"] if pool else []
        body = {"status": "ok" if ready else "unavailable", "ready_workers": ready}
        return JSONResponse(body, status_code=200 if ready else 503)

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
                }
            ],
        }

    @app.get("/v1/devices")
    async def devices() -> JSONResponse:
        """One consistent snapshot per worker's device (read-only; emulated devices are labelled)."""
        pool: WorkerPool | None = state["pool"]
        workers = [w for w in pool.workers.values() if w.state in ("ready", "draining")] if pool else []
        results = await asyncio.gather(
            *(pool.call(w, "snapshot", 10.0) for w in workers), return_exceptions=True
        )
        out = []
        for w, res in zip(workers, results, strict=True):
            item: dict[str, Any] = {
                "worker": w.id,
                "role": w.role,
                "device": w.spec.device,
                "gpu_uuid": w.info.get("gpu_uuid"),
                "gpu_index": w.info.get("gpu_index"),
                "pid": w.process.pid,
            }
            if isinstance(res, BaseException):
                item["error"] = str(res) or type(res).__name__
            else:
                item["sample"] = res
            out.append(item)
        return JSONResponse({"devices": out})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/telemetry")
    async def telemetry(after: str | None = None, limit: int = 1000) -> JSONResponse:
        """Telemetry batches after the given per-source cursors ("src:seq,src:seq")."""
        try:
            cursors = parse_after(after)
        except ValueError as e:
            return _error(400, str(e), param="after")
        if not 1 <= limit <= 10_000:
            return _error(400, f"'limit' must be in [1, 10000], got {limit}", param="limit")
        pool: WorkerPool | None = state["pool"]
        if pool is not None:
            pool.telemetry.flush()
        return JSONResponse(hub.read(cursors, limit))

    async def _parse(request: Request, chat: bool) -> ParsedRequest | JSONResponse:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return _error(400, f"request body is not valid JSON: {e}")
        try:
            return parse_request(body, chat=chat, served_model=settings.model_name)
        except BadRequest as e:
            return JSONResponse(e.body(), status_code=400)

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
        try:
            if pool is None:
                raise NoWorkerError("the server is starting")
            req = pool.submit(prompt_ids, parsed.params)
        except NoWorkerError as e:
            return _error(503, str(e), kind="service_unavailable")
        detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        if parsed.stream:
            return StreamingResponse(_stream(pool, req, parsed, detok), media_type="text/event-stream")
        return await _collect(pool, req, parsed, detok)

    async def _collect(
        pool: WorkerPool,
        req: RequestState,
        parsed: ParsedRequest,
        detok: IncrementalDetokenizer,
    ) -> Response:
        parts: list[str] = []
        try:
            while True:
                kind, *rest = await req.events.get()
                if kind == "token":
                    parts.append(detok.add(rest[0]))
                elif kind == "error":
                    return _error(500, f"request failed: {rest[0]}", kind="server_error")
                else:
                    parts.append(detok.flush())
                    body = full_response(
                        req.request_id,
                        settings.model_name,
                        "".join(parts),
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

    async def _stream(
        pool: WorkerPool,
        req: RequestState,
        parsed: ParsedRequest,
        detok: IncrementalDetokenizer,
    ) -> AsyncIterator[bytes]:
        def sse(obj: dict[str, Any]) -> bytes:
            return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()

        first = True
        try:
            while True:
                kind, *rest = await req.events.get()
                if kind == "token":
                    reason = rest[1]
                    text = detok.add(rest[0]) + (detok.flush() if reason else "")
                    yield sse(
                        chunk(
                            req.request_id, settings.model_name, text, reason, chat=parsed.chat, first=first
                        )
                    )
                    first = False
                elif kind == "error":
                    yield sse(
                        {
                            "error": {
                                "message": f"request failed: {rest[0]}",
                                "type": "server_error",
                                "code": 500,
                            }
                        }
                    )
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
