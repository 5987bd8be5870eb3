"""Admission control at the router: a bounded waiting queue (429), a request body limit (413), and
watching for clients that leave (their requests are aborted).

*Waiting* requests are those admitted to the pool that no engine is running yet. The router counts
them per worker as the larger of

- what the worker's engine last reported (`waiting` in its stats, at most 0.2 s old: requests queued
  for a batch slot or KV blocks, preempted ones, KV hand-offs waiting for blocks), and
- for a worker that takes new requests (mixed, prefill), its requests in flight beyond its
  `max_num_seqs` (known at once, so a burst counts before the next stats arrive).

The bound is `max_waiting_requests`, by default one batch per worker that takes new requests: the
sum of `max_num_seqs` over the ready mixed and prefill workers (so a waiting request waits for about
one request's run time, and the bound follows the layout as workers come and go). Beyond it a new
request is answered 429 with `Retry-After`; it is counted in
`/metrics` (`phaselens:requests_rejected_total{reason="queue_full"}`) and published as a `request`
telemetry event with status `error` and finish reason `rejected`, so the store holds it as a failed
request. A body over `max_body_bytes` is answered 413 and counted (`reason="body_too_large"`), like
other invalid requests it is not a request event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.requests import Request

    from serving.pool import RequestState, WorkerHandle, WorkerPool

DEFAULT_MAX_BODY_BYTES = 4 * 2**20  # a 128k-token prompt as JSON token ids is ~1 MB
DEGRADED_FRACTION = 0.8  # /health is `degraded` while the waiting queue is at least this full
RETRY_AFTER_S = 1
ENTRY_ROLES = ("mixed", "prefill")  # roles that take new requests from the router


class BodyTooLarge(ValueError):
    """A request body over the limit (HTTP 413)."""


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, or BodyTooLarge as soon as it (or its declared Content-Length) passes
    `max_bytes`: an oversized body is never held in memory whole."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge(f"request body is {int(declared):,} bytes; the limit is {max_bytes:,} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLarge(f"request body is over the limit of {max_bytes:,} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def worker_waiting(w: WorkerHandle) -> int:
    """Requests waiting on `w` (see the module's docstring)."""
    reported = int(w.stats.get("waiting", 0))
    if w.role not in ENTRY_ROLES:
        return reported
    max_num_seqs = int(w.info.get("engine", {}).get("max_num_seqs") or 0)
    return max(reported, len(w.inflight) - max_num_seqs) if max_num_seqs else reported


def waiting_requests(workers: Iterable[WorkerHandle]) -> int:
    """Requests waiting on the live workers, summed."""
    return sum(worker_waiting(w) for w in workers if w.state in ("ready", "draining"))


class Admission:
    """The router's admission policy and its rejection counts."""

    def __init__(self, max_waiting_requests: int | None, max_body_bytes: int) -> None:
        self.max_waiting = max_waiting_requests  # None: one batch per entry worker
        self.max_body_bytes = max_body_bytes
        self.rejected: dict[str, int] = {"queue_full": 0, "body_too_large": 0}

    def bound(self, pool: WorkerPool) -> int:
        """The waiting-queue bound in effect (at least 1)."""
        if self.max_waiting is not None:
            return self.max_waiting
        seqs = sum(
            int(w.info.get("engine", {}).get("max_num_seqs") or 0)
            for w in pool.workers.values()
            if w.role in ENTRY_ROLES and w.state == "ready"
        )
        return max(1, seqs)

    def full(self, pool: WorkerPool) -> str | None:
        """Why a new request is turned away now (the queue is at its bound), else None."""
        waiting, bound = waiting_requests(pool.workers.values()), self.bound(pool)
        if waiting < bound:
            return None
        return (
            f"the server is overloaded: {waiting} requests are waiting (the bound is {bound}, "
            f"--max-waiting-requests); retry after {RETRY_AFTER_S} s"
        )

    def health_reason(self, pool: WorkerPool) -> str | None:
        """A /health reason while the waiting queue is at least DEGRADED_FRACTION of its bound."""
        waiting, bound = waiting_requests(pool.workers.values()), self.bound(pool)
        if waiting == 0 or waiting < DEGRADED_FRACTION * bound:
            return None
        return (
            f"admission queue {waiting}/{bound} waiting requests (>= "
            f"{DEGRADED_FRACTION:.0%} of --max-waiting-requests); requests beyond it get 429"
        )

    def summary(self, pool: WorkerPool) -> dict[str, Any]:
        """The admission state for /health: waiting requests, the bound, rejections so far."""
        return {
            "waiting_requests": waiting_requests(pool.workers.values()),
            "max_waiting_requests": self.bound(pool),
            "max_body_bytes": self.max_body_bytes,
            "rejected": dict(self.rejected),
        }

    def reject(self, pool: WorkerPool, prompt_tokens: int, message: str) -> None:
        """Count a 429 and publish it as a failed `request` event (status error, reason rejected)."""
        self.rejected["queue_full"] += 1
        now = time.time()
        pool.telemetry.emit(
            "request",
            request_id=pool.new_request_id(),
            arrival_s=now,
            first_scheduled_s=None,
            prefill_start_s=None,
            prefill_end_s=None,
            kv_transfer_start_s=None,
            kv_transfer_end_s=None,
            kv_transfer_bytes=None,
            first_token_s=None,
            token_ts_s=[],
            finish_s=now,
            prompt_tokens=prompt_tokens,
            output_tokens=0,
            prefill_worker=None,
            decode_worker=None,
            status="error",
            finish_reason="rejected",
            error=message,
            attempts=0,
            preemptions=0,
        )


async def abort_on_disconnect(request: Request, pool: WorkerPool, req: RequestState) -> None:
    """Wait until the client of `request` goes away, then abort `req` (run as a task while a
    non-streaming request is served; its body must have been read)."""
    while True:
        message: dict[str, Any] = await request.receive()
        if message["type"] == "http.disconnect":
            pool.abort(req, "client disconnected")
            return
        await asyncio.sleep(0)  # a stray message (none expected after the body): keep watching
