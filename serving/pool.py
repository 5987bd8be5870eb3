"""Router-side worker pool: spawns worker processes, routes requests, survives worker deaths.

All state here is touched on the router's asyncio loop only; each worker's pipe is read by a
thread that forwards messages onto the loop.

A worker that dies (any exit the router did not ask for) is restarted with the same id, role and
spec after a back-off (`restart_delay_s`, doubling to `max_restart_delay_s`, back to the first delay
once a worker has run `stable_s`). The requests in flight on it fail and are never re-dispatched: the
router cannot tell a crash a request caused (a poison request) from an external kill (OOM killer,
operator), and retrying a poison request would take down one worker after another.

:class:`WorkerPool` is one state machine — workers, their restarts and the requests in flight on
them change together on one loop (a death fails its requests, a restart re-reads the layout, an
abort reaches whichever worker holds the request), so it stays whole here; its records (worker
handle, request state) and the read-only views of its workers (health, layout, serving paths, the
strand check) are in :mod:`serving.pool_state`.
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
from dataclasses import replace
from typing import Any

from serving.config import SamplingParams
from serving.kv_transfer import stack_secret
from serving.pool_state import (
    MAX_RESTART_DELAY_S,
    RESTART_DELAY_S,
    STABLE_S,
    NoWorkerError,
    RequestState,
    WorkerCallError,
    WorkerHandle,
    eligible,
    pool_health,
    pool_layout,
    pool_mode,
    serving_paths,
    strand_reason,
)
from serving.routing import choose_route
from serving.telemetry import TelemetryEmitter, TelemetryHub
from serving.worker import ROLES, WorkerSpec, params_to_dict, worker_main

# A fork server that has imported torch and the worker's modules once: each worker (and each
# restart) is forked from it in a fraction of a second instead of importing torch anew (seconds of
# CPU). Nothing in it has touched a device, so a forked worker opens its own (CUDA included).
_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(
    ["torch", "serving.engine", "serving.weights", "serving.devices", "serving.kv_transfer"]
)

# A hand-off that failed waits this long for news of its decode worker's death: a decode worker
# killed while a prefill worker connects to it resets that connection before the router sees it die.
HANDOFF_ERROR_GRACE_S = 1.0


def stop_fork_server() -> None:
    """Stop this process's fork server (started with the first worker) and wait until it has exited,
    so that a stopped router leaves no process behind it. The next worker start starts it again."""
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)  # the standard library's own stop
    if stop is not None:
        stop()


class WorkerPool:
    """Owns the worker processes and every in-flight request's routing."""

    def __init__(
        self,
        hub: TelemetryHub,
        *,
        on_finish: Callable[[RequestState], None] | None = None,
        on_token: Callable[[RequestState, float], None] | None = None,
        restart_delay_s: float = RESTART_DELAY_S,
        max_restart_delay_s: float = MAX_RESTART_DELAY_S,
        stable_s: float = STABLE_S,
        kv_secret: bytes | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        # authenticates the workers' KV hand-off connections (kv_transfer); default: stack_secret()
        self._kv_secret = stack_secret() if kv_secret is None else kv_secret
        self.hub = hub
        self.telemetry = TelemetryEmitter("router", hub.publish, flush_interval_s=0.25)
        self.workers: dict[str, WorkerHandle] = {}
        self.requests: dict[str, RequestState] = {}
        self._on_finish = on_finish or (lambda r: None)
        self._on_token = on_token or (lambda r, ts: None)
        self._ids = itertools.count()
        self._calls: dict[int, tuple[WorkerHandle, asyncio.Future]] = {}
        self._call_ids = itertools.count()
        self.restart_delay_s = restart_delay_s
        self.max_restart_delay_s = max(max_restart_delay_s, restart_delay_s)
        self.stable_s = stable_s
        self.worker_deaths = 0
        self.worker_restarts = 0
        self._closing = False
        self.template: WorkerSpec | None = None  # model and engine settings new workers copy
        self._used_ids: set[str] = set()

    # -- workers ---------------------------------------------------------------------------------

    def next_worker_id(self) -> str:
        """A worker id never used in this pool (a removed worker's id is not given to another)."""
        while (wid := f"worker-{next(self._ids)}") in self.workers or wid in self._used_ids:
            pass
        return wid

    async def start_worker(self, spec: WorkerSpec, role: str, timeout_s: float = 600.0) -> WorkerHandle:
        """Spawn a worker process and wait until it reports ready (or raise with its error)."""
        w = self._spawn(spec, role)
        await self._await_ready(w, timeout_s)
        return w

    def _spawn(self, spec: WorkerSpec, role: str, restart_of: WorkerHandle | None = None) -> WorkerHandle:
        """Start the process of a worker; `restart_of` is the dead handle it replaces (same id)."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; allowed: {', '.join(ROLES)}")
        parent, child = _CTX.Pipe()
        # the secret goes through the fork server's pipe, never a command line
        args = (spec, child, self._kv_secret)
        proc = _CTX.Process(target=worker_main, args=args, name=spec.worker_id, daemon=True)
        proc.start()
        child.close()
        w = WorkerHandle(spec, role, proc, parent, ready=self.loop.create_future())
        self.template = self.template or spec
        self._used_ids.add(spec.worker_id)
        w.next_restart_delay_s = self.restart_delay_s
        if restart_of is not None:
            w.restarts = restart_of.restarts + 1
            w.next_restart_delay_s = restart_of.next_restart_delay_s
            w.died_s, w.exitcode = restart_of.died_s, restart_of.exitcode
        self.workers[w.id] = w
        threading.Thread(target=self._reader, args=(w,), daemon=True, name=f"read-{w.id}").start()
        return w

    async def _await_ready(self, w: WorkerHandle, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(w.ready), timeout_s)
            if w.exited or w.state != "starting" or self.workers.get(w.id) is not w:
                raise RuntimeError(f"{w.id} exited or was removed during start-up")
        except (TimeoutError, RuntimeError):
            w.state = "stopped"
            self._kill(w)
            if self.workers.get(w.id) is w:
                del self.workers[w.id]
            raise
        w.state = "ready"
        w.started_s = time.time()

    def _reader(self, w: WorkerHandle) -> None:
        while True:
            try:
                msg = w.conn.recv()
            except (EOFError, OSError):
                break
            self.loop.call_soon_threadsafe(self._dispatch, w, msg)
        w.process.join(timeout=2)  # so that the exit code is known to _on_worker_exit
        with contextlib.suppress(RuntimeError):  # the loop is closed: the router is gone
            self.loop.call_soon_threadsafe(self._on_worker_exit, w)

    def _kill(self, w: WorkerHandle) -> None:
        if w.process.is_alive():
            w.process.kill()
        w.process.join(timeout=5)

    def _cancel_restart(self, w: WorkerHandle) -> None:
        if w.restart_task is not None and not w.restart_task.done():
            w.restart_task.cancel()
        w.restart_task, w.restart_at_s = None, None

    async def stop_worker(self, w: WorkerHandle, timeout_s: float = 10.0) -> None:
        """Stop `w` for good (no restart); a dead worker is just taken out of the pool."""
        was = w.state
        w.state, w.removed = "stopped", True
        self._cancel_restart(w)
        if was != "dead":
            with contextlib.suppress(OSError):
                w.conn.send(("shutdown",))
            deadline = time.monotonic() + timeout_s
            while w.process.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            self._kill(w)
        if self.workers.get(w.id) is w:
            del self.workers[w.id]

    async def shutdown(self) -> None:
        self._closing = True
        await asyncio.gather(*(self.stop_worker(w, 5.0) for w in list(self.workers.values())))
        self.telemetry.flush()

    def _on_worker_exit(self, w: WorkerHandle) -> None:
        w.exited = True
        for call_id, (cw, fut) in list(self._calls.items()):
            if cw is w and not fut.done():
                fut.set_exception(WorkerCallError("WorkerDied", f"{w.id} died before it answered"))
                self._calls.pop(call_id, None)
        if w.ready is not None and not w.ready.done():
            w.ready.set_exception(RuntimeError(f"{w.id} exited during start-up"))
        if w.state in ("stopped", "starting") or self.workers.get(w.id) is not w:
            return  # asked to stop, or start_worker reports the failed start
        before = {"state": w.state, "inflight": len(w.inflight), "restarts": w.restarts}
        w.state = "dead"
        w.died_s, w.exitcode = time.time(), w.process.exitcode
        w.stats = {}
        self.worker_deaths += 1
        for rid in list(w.inflight):
            req = self.requests.get(rid)
            if req is not None:
                self._worker_lost(req, w)
        w.inflight.clear()
        delay = self._schedule_restart(w)
        self.telemetry.emit(
            "control",
            ts_s=time.time(),
            action="worker_died",
            target=w.id,
            before=before,
            after={"state": "dead", "exitcode": w.exitcode, "restart_in_s": delay},
            actor="router",
        )

    def _schedule_restart(self, w: WorkerHandle) -> float | None:
        """Plan `w`'s restart after its back-off; returns the delay (None while shutting down)."""
        if self._closing:
            return None
        if w.died_s is not None and w.died_s - w.started_s >= self.stable_s:
            w.next_restart_delay_s = self.restart_delay_s
        delay = min(max(w.next_restart_delay_s, self.restart_delay_s), self.max_restart_delay_s)
        w.next_restart_delay_s = min(delay * 2, self.max_restart_delay_s)
        w.restart_at_s = time.time() + delay
        w.restart_task = self.loop.create_task(self._restart_later(w, delay))
        return delay

    async def _restart_later(self, w: WorkerHandle, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        if self._closing or w.state != "dead" or self.workers.get(w.id) is not w:
            return
        w.restart_task, w.restart_at_s = None, None
        nw = self._spawn(w.spec, w.role, restart_of=w)
        try:
            await self._await_ready(nw, 600.0)
        except (RuntimeError, TimeoutError) as e:
            if self._closing or nw.removed or w.id in self.workers:
                return  # shutting down, or removed on purpose while it started
            w.last_error = str(e)
            w.restarts = nw.restarts  # an attempt, even though it failed
            w.started_s = time.time()  # a failed start is not a stable run: keep backing off
            self.workers[w.id] = w
            delay = self._schedule_restart(w)
            self.telemetry.emit(
                "control",
                ts_s=time.time(),
                action="worker_restart_failed",
                target=w.id,
                before={"state": "dead", "restarts": w.restarts},
                after={"state": "dead", "error": str(e), "restart_in_s": delay},
                actor="router",
            )
            return
        self.worker_restarts += 1
        self.telemetry.emit(
            "control",
            ts_s=time.time(),
            action="worker_restarted",
            target=nw.id,
            before={"state": "dead", "exitcode": w.exitcode, "pid": w.process.pid},
            after={"state": nw.state, "pid": nw.process.pid, "role": nw.role, "restarts": nw.restarts},
            actor="router",
        )

    def _worker_lost(self, req: RequestState, w: WorkerHandle) -> None:
        """Fail a request that was in flight on `w` when it died; never re-dispatch it."""
        self._fail(
            req,
            f"worker {w.id} ({w.role}) died while serving this request (exit code {w.exitcode}); "
            "not retried (possible poison request)",
        )

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
        elif kind == "handoff_error":  # a dead decode worker fails it first, naming its exit code
            req = self.requests.get(msg[1])
            if req is not None:
                self.loop.call_later(HANDOFF_ERROR_GRACE_S, self._fail, req, msg[2])
        elif kind == "reply":
            _cw, fut = self._calls.pop(msg[1], (None, None))
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

    def layout(self) -> dict[str, Any]:
        """Every worker (dead ones too, with exit code, time of death and pending restart) and the
        pool's status as /health reports it."""
        return pool_layout(self.workers, self.worker_restarts, self.worker_deaths)

    def mode(self) -> str:
        """The layout the workers make up (dead ones included: they are being restarted)."""
        return pool_mode(self.workers)

    def strand_reason(self, w: WorkerHandle, new_role: str | None = None) -> str | None:
        """Why removing `w` (or giving it `new_role`) would leave the pool unable to serve, else None."""
        return strand_reason(self.workers, w, new_role)

    def serving_paths(self) -> list[str]:
        """How a request can be served right now: "prefill+decode" and/or "mixed"."""
        return serving_paths(self.workers)

    def health(self) -> dict[str, Any]:
        """The pool's status, its roles and reasons (:func:`serving.pool_state.pool_health`)."""
        return pool_health(self.workers, self.worker_restarts, self.worker_deaths)

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
        prefill, decode, mixed = (eligible(self.workers, r) for r in ("prefill", "decode", "mixed"))
        req.attempts += 1
        msg = {
            "request_id": req.request_id,
            "prompt_ids": req.prompt_ids,
            "params": params_to_dict(req.params),
            "arrival_s": req.arrival_s,
        }
        route = choose_route(prefill, decode, mixed, lambda w: w.load)
        if route is not None and route.disaggregated:
            pw, dw = route.prefill, route.decode
            msg["handoff_to"] = {"worker": dw.id, "host": dw.info["kv_host"], "port": dw.info["kv_port"]}
            req.prefill_worker, req.decode_worker = pw.id, dw.id
            pw.inflight.add(req.request_id)
            dw.inflight.add(req.request_id)
            self._send(pw, ("submit", msg))
        elif route is not None:
            w = route.prefill
            req.prefill_worker = req.decode_worker = w.id
            w.inflight.add(req.request_id)
            self._send(w, ("submit", msg))
        else:
            notes = "; ".join(w.status_note() for w in self.workers.values()) or "no workers"
            raise NoWorkerError(
                f"no ready worker can take requests (no ready prefill+decode pair and no ready mixed "
                f"worker: {notes})"
            )

    def abort(self, req: RequestState, reason: str = "aborted by client") -> None:
        """End `req` now (status `aborted`): its workers drop it at their next iteration boundary,
        freeing its KV blocks; `reason` is kept as the request event's `error`."""
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
        if reason == "abort":
            req.events.put_nowait(("error", f"aborted: {error}" if error else "aborted"))
        elif error is not None:
            req.events.put_nowait(("error", error))
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
            status="aborted" if reason == "abort" else ("ok" if error is None else "error"),
            finish_reason=reason,
            error=error,
            attempts=req.attempts,
            preemptions=m.get("num_preemptions", 0),
        )
        self._on_finish(req)

    # -- calls into workers ----------------------------------------------------------------------

    async def call(self, w: WorkerHandle, method: str, timeout_s: float = 30.0, **kwargs: Any) -> Any:
        """Run `method` in worker `w` (device knobs, stats) and return its result."""
        if w.exited or w.state == "dead":
            raise WorkerCallError("WorkerDied", f"{w.id} is dead")
        call_id = next(self._call_ids)
        fut = self.loop.create_future()
        self._calls[call_id] = (w, fut)
        self._send(w, ("call", call_id, method, kwargs))
        try:
            return await asyncio.wait_for(fut, timeout_s)
        finally:
            self._calls.pop(call_id, None)

    def spec_like(self, template: WorkerSpec, device: str | None) -> WorkerSpec:
        return replace(template, worker_id=self.next_worker_id(), device=device or template.device)


__all__ = [
    "NoWorkerError",
    "RequestState",
    "WorkerCallError",
    "WorkerHandle",
    "WorkerPool",
    "stop_fork_server",
]
