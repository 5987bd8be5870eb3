"""Router-side worker pool: spawns worker processes, routes requests, survives worker deaths.

All state here is touched on the router's asyncio loop only; each worker's pipe is read by a
thread that forwards messages onto the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing as mp
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from serving.config import SamplingParams
from serving.telemetry import TelemetryEmitter, TelemetryHub
from serving.worker import ROLES, WorkerSpec, params_to_dict, worker_main

_CTX = mp.get_context("spawn")
MAX_ATTEMPTS = 2  # a request whose worker died before its first token is retried once


class NoWorkerError(RuntimeError):
    """No worker can take a request right now (HTTP 503)."""


class WorkerCallError(RuntimeError):
    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type


@dataclass(slots=True, eq=False)
class WorkerHandle:
    spec: WorkerSpec
    role: str
    process: Any
    conn: Any
    state: str = "starting"  # starting | ready | draining | stopped | dead
    info: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    inflight: set[str] = field(default_factory=set)
    ready: asyncio.Future | None = None
    started_s: float = field(default_factory=time.time)

    @property
    def id(self) -> str:
        return self.spec.worker_id

    @property
    def load(self) -> tuple[int, float]:
        return len(self.inflight), self.stats.get("kv_usage", 0.0)

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "role": self.role,
            "state": self.state,
            "device": self.spec.device,
            "device_name": self.info.get("device_name"),
            "emulated": self.info.get("emulated"),
            "pid": self.process.pid,
            "inflight": len(self.inflight),
            "stats": self.stats,
        }


@dataclass(slots=True, eq=False)
class RequestState:
    """A request as the router sees it, across its prefill and decode workers."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival_s: float
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    output_ids: list[int] = field(default_factory=list)
    token_ts: list[float] = field(default_factory=list)
    prefill_worker: str | None = None
    decode_worker: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None
    error: str | None = None
    attempts: int = 0
    finished_s: float | None = None
    # Called with each output token on the router's loop; True ends the request with finish reason
    # "stop" and aborts it on its workers (the router's stop-string match).
    check_stop: Callable[[int], bool] | None = None

    @property
    def done(self) -> bool:
        return self.finished_s is not None


class WorkerPool:
    """Owns the worker processes and every in-flight request's routing."""

    def __init__(
        self,
        hub: TelemetryHub,
        *,
        on_finish: Callable[[RequestState], None] | None = None,
        on_token: Callable[[RequestState, float], None] | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.hub = hub
        self.telemetry = TelemetryEmitter("router", hub.publish, flush_interval_s=0.25)
        self.workers: dict[str, WorkerHandle] = {}
        self.requests: dict[str, RequestState] = {}
        self._on_finish = on_finish or (lambda r: None)
        self._on_token = on_token or (lambda r, ts: None)
        self._ids = itertools.count()
        self._calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self.worker_deaths = 0
        self.retried = 0

    # -- workers ---------------------------------------------------------------------------------

    def next_worker_id(self) -> str:
        while (wid := f"worker-{next(self._ids)}") in self.workers:
            pass
        return wid

    async def start_worker(self, spec: WorkerSpec, role: str, timeout_s: float = 600.0) -> WorkerHandle:
        """Spawn a worker process and wait until it reports ready (or raise with its error)."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; allowed: {', '.join(ROLES)}")
        parent, child = _CTX.Pipe()
        proc = _CTX.Process(target=worker_main, args=(spec, child), name=spec.worker_id, daemon=True)
        proc.start()
        child.close()
        w = WorkerHandle(spec, role, proc, parent, ready=self.loop.create_future())
        self.workers[w.id] = w
        threading.Thread(target=self._reader, args=(w,), daemon=True, name=f"read-{w.id}").start()
        try:
            await asyncio.wait_for(asyncio.shield(w.ready), timeout_s)
        except (TimeoutError, RuntimeError):
            self._kill(w)
            del self.workers[w.id]
            raise
        w.state = "ready"
        return w

    def _reader(self, w: WorkerHandle) -> None:
        while True:
            try:
                msg = w.conn.recv()
            except (EOFError, OSError):
                break
            self.loop.call_soon_threadsafe(self._dispatch, w, msg)
        self.loop.call_soon_threadsafe(self._on_worker_exit, w)

    def _kill(self, w: WorkerHandle) -> None:
        if w.process.is_alive():
            w.process.kill()
        w.process.join(timeout=5)

    async def stop_worker(self, w: WorkerHandle, timeout_s: float = 10.0) -> None:
        w.state = "stopped"
        with contextlib.suppress(OSError):
            w.conn.send(("shutdown",))
        deadline = time.monotonic() + timeout_s
        while w.process.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self._kill(w)
        self.workers.pop(w.id, None)

    async def shutdown(self) -> None:
        await asyncio.gather(*(self.stop_worker(w, 5.0) for w in list(self.workers.values())))
        self.telemetry.flush()

    def _on_worker_exit(self, w: WorkerHandle) -> None:
        if w.ready is not None and not w.ready.done():
            w.ready.set_exception(RuntimeError(f"{w.id} exited during start-up"))
        if w.state == "stopped":
            return
        w.state = "dead"
        self.worker_deaths += 1
        self.telemetry.emit(
            "control",
            ts_s=time.time(),
            action="worker_died",
            target=w.id,
            before={"state": "ready", "inflight": len(w.inflight)},
            after={"state": "dead", "exitcode": w.process.exitcode},
            actor="router",
        )
        for rid in list(w.inflight):
            req = self.requests.get(rid)
            if req is not None:
                self._worker_lost(req, w)
        w.inflight.clear()

    def _worker_lost(self, req: RequestState, w: WorkerHandle) -> None:
        for other in (req.prefill_worker, req.decode_worker):
            ow = self.workers.get(other) if other else None
            if ow is not None and ow is not w:
                ow.inflight.discard(req.request_id)
                self._send(ow, ("abort", req.request_id))
        if not req.output_ids and req.attempts < MAX_ATTEMPTS:
            self.retried += 1
            try:
                self.dispatch(req)
                return
            except NoWorkerError:
                pass
        self._fail(req, f"worker {w.id} died while serving this request")

    # -- messages from workers -------------------------------------------------------------------

    def _dispatch(self, w: WorkerHandle, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "tokens":
            for rid, token, ts, reason, meta in msg[1]:
                self._on_token_msg(w, rid, token, ts, reason, meta)
        elif kind == "stats":
            w.stats = msg[1]
        elif kind == "telemetry":
            self.hub.publish(msg[1])
        elif kind == "kv_received":
            req = self.requests.get(msg[1])
            if req is None:  # it ended (stop string, abort) while its KV was on the way: drop it there
                self._send(w, ("abort", msg[1]))
            else:
                req.meta.update(msg[2])
                pw = self.workers.get(req.prefill_worker or "")
                if pw is not None and pw is not w:
                    pw.inflight.discard(req.request_id)
        elif kind == "request_error":
            req = self.requests.get(msg[1])
            if req is not None:
                self._fail(req, msg[2])
        elif kind == "reply":
            fut = self._calls.pop(msg[1], None)
            if fut is not None and not fut.done():
                if msg[2]:
                    fut.set_result(msg[3])
                else:
                    fut.set_exception(WorkerCallError(msg[3]["type"], msg[3]["message"]))
        elif kind == "ready":
            w.info = msg[1]
            if w.ready is not None and not w.ready.done():
                w.ready.set_result(w)
        elif kind == "failed" and w.ready is not None and not w.ready.done():
            w.ready.set_exception(RuntimeError(f"{w.id} failed to start: {msg[1]}"))

    def _on_token_msg(
        self, w: WorkerHandle, rid: str, token: int, ts: float, reason: str | None, meta
    ) -> None:
        req = self.requests.get(rid)
        if req is None or req.done:
            return
        if meta:
            req.meta.update(meta)
        req.output_ids.append(token)
        req.token_ts.append(ts)
        self._on_token(req, ts)
        stopped = False
        if req.check_stop is not None:
            try:
                stopped = req.check_stop(token)
            except Exception as e:  # a failing check fails this request only
                self._fail(req, f"stop check failed: {type(e).__name__}: {e}")
                return
        if stopped:
            reason = "stop"
        req.events.put_nowait(("token", token, reason))
        if stopped:
            self._release(req, notify=True)  # the workers would go on generating otherwise
            self._complete(req, reason, None)
        elif reason is not None:
            self._finish(req, reason)

    # -- requests --------------------------------------------------------------------------------

    def new_request_id(self) -> str:
        return f"cmpl-{uuid.uuid4().hex}"

    def _eligible(self, role: str) -> list[WorkerHandle]:
        return [w for w in self.workers.values() if w.role == role and w.state == "ready"]

    def layout(self) -> dict[str, Any]:
        return {"workers": [w.describe() for w in self.workers.values()], "mode": self.mode()}

    def mode(self) -> str:
        roles = {w.role for w in self.workers.values() if w.state in ("ready", "draining")}
        if {"prefill", "decode"} <= roles:
            return "disaggregated" if "mixed" not in roles else "hybrid"
        return "aggregated"

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        check_stop: Callable[[int], bool] | None = None,
    ) -> RequestState:
        """Route a new request; `check_stop(token)` returning True ends it early (stop strings)."""
        req = RequestState(
            self.new_request_id(), list(prompt_ids), params, time.time(), check_stop=check_stop
        )
        self.requests[req.request_id] = req
        try:
            self.dispatch(req)
        except NoWorkerError:
            del self.requests[req.request_id]
            raise
        return req

    def dispatch(self, req: RequestState) -> None:
        """Send `req` to the least-loaded worker(s): a prefill+decode pair, else a mixed worker."""
        prefill, decode, mixed = (self._eligible(r) for r in ("prefill", "decode", "mixed"))
        req.attempts += 1
        msg = {
            "request_id": req.request_id,
            "prompt_ids": req.prompt_ids,
            "params": params_to_dict(req.params),
            "arrival_s": req.arrival_s,
        }
        if prefill and decode:
            pw, dw = min(prefill, key=lambda w: w.load), min(decode, key=lambda w: w.load)
            msg["handoff_to"] = {"worker": dw.id, "host": dw.info["kv_host"], "port": dw.info["kv_port"]}
            req.prefill_worker, req.decode_worker = pw.id, dw.id
            pw.inflight.add(req.request_id)
            dw.inflight.add(req.request_id)
            self._send(pw, ("submit", msg))
        elif mixed:
            w = min(mixed, key=lambda w: w.load)
            req.prefill_worker = req.decode_worker = w.id
            w.inflight.add(req.request_id)
            self._send(w, ("submit", msg))
        else:
            raise NoWorkerError("no ready worker can take requests (all draining, starting or dead)")

    def abort(self, req: RequestState, reason: str = "aborted by client") -> None:
        if req.done:
            return
        self._release(req, notify=True)
        self._complete(req, "abort", reason)

    def _send(self, w: WorkerHandle, msg: tuple[Any, ...]) -> None:
        try:
            w.conn.send(msg)
        except OSError:
            pass  # the reader thread reports the death

    def _release(self, req: RequestState, *, notify: bool) -> None:
        """Take `req` off its workers' in-flight sets; `notify` tells those workers to drop it."""
        for wid in {req.prefill_worker, req.decode_worker} - {None}:
            w = self.workers.get(wid)
            if w is not None and req.request_id in w.inflight:
                w.inflight.discard(req.request_id)
                if notify:
                    self._send(w, ("abort", req.request_id))

    def _finish(self, req: RequestState, reason: str) -> None:
        self._release(req, notify=False)
        self._complete(req, reason, None)

    def _fail(self, req: RequestState, message: str) -> None:
        if req.done:
            return
        self._release(req, notify=True)
        self._complete(req, "error", message)

    def _complete(self, req: RequestState, reason: str, error: str | None) -> None:
        req.finish_reason, req.error, req.finished_s = reason, error, time.time()
        self.requests.pop(req.request_id, None)
        if error is not None:
            req.events.put_nowait(("error", error))
        elif reason == "abort":
            req.events.put_nowait(("error", "aborted"))
        else:
            req.events.put_nowait(("done", reason))
        m = req.meta
        self.telemetry.emit(
            "request",
            request_id=req.request_id,
            arrival_s=req.arrival_s,
            first_scheduled_s=m.get("first_scheduled_s"),
            prefill_start_s=m.get("prefill_start_s"),
            prefill_end_s=m.get("prefill_end_s"),
            kv_transfer_start_s=m.get("kv_transfer_start_s"),
            kv_transfer_end_s=m.get("kv_transfer_end_s"),
            kv_transfer_bytes=m.get("kv_transfer_bytes"),
            first_token_s=req.token_ts[0] if req.token_ts else None,
            token_ts_s=list(req.token_ts),
            finish_s=req.finished_s,
            prompt_tokens=len(req.prompt_ids),
            output_tokens=len(req.output_ids),
            prefill_worker=req.prefill_worker,
            decode_worker=req.decode_worker,
            status="ok" if error is None and reason != "abort" else ("aborted" if error is None else "error"),
            finish_reason=reason,
            error=error,
            attempts=req.attempts,
            preemptions=m.get("num_preemptions", 0),
        )
        self._on_finish(req)

    # -- calls into workers ----------------------------------------------------------------------

    async def call(self, w: WorkerHandle, method: str, timeout_s: float = 30.0, **kwargs: Any) -> Any:
        """Run `method` in worker `w` (device knobs, stats) and return its result."""
        call_id = next(self._call_ids)
        fut = self.loop.create_future()
        self._calls[call_id] = fut
        self._send(w, ("call", call_id, method, kwargs))
        try:
            return await asyncio.wait_for(fut, timeout_s)
        finally:
            self._calls.pop(call_id, None)

    def spec_like(self, template: WorkerSpec, device: str | None) -> WorkerSpec:
        return replace(template, worker_id=self.next_worker_id(), device=device or template.device)
