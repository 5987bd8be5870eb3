"""The router's device samples: one snapshot per worker's device (``GET /v1/devices``), and the
router's own sampler behind the batched read ``GET /v1/collect``.

A collector that polls ``/v1/devices`` every 100 ms makes ten HTTP round trips a second per stack,
and the router asks every worker for a snapshot on each. With ``/v1/collect`` the router takes the
same snapshots itself, every ``interval_s``, into a bounded ring of ticks, and a reader fetches all
the ticks since its cursor (with the telemetry batches since its telemetry cursors) in one GET, a
few times a second. The snapshots the workers take are the same; the HTTP requests, their JSON and
the reader's per-request cost go from ten a second to one per read.

The sampler runs only while someone reads: it starts on the first read and stops after
``idle_stop_s`` without one, so a stack nobody collects from pays nothing. Every tick has one item
per worker the pool holds: its sample, or why there is none (``error``; a worker that is dead or
restarting is ``down`` with its state), so a missing worker is counted by the reader, never absent.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("phaselens.router")

#: workers whose device can be asked for a snapshot
SAMPLED_STATES = ("ready", "draining")
#: the ticks the ring holds (at 100 ms: 60 s, eight workers' samples ~4 MB): a reader that
#: falls further behind finds the oldest gone and is told how many (``missed_ticks``)
MAX_TICKS = 600
IDLE_STOP_S = 30.0  # no read for this long: the sampler stops
SNAPSHOT_TIMEOUT_S = 10.0


def worker_item(w: Any) -> dict[str, Any]:
    """A worker's identity in a device item: id, role, device, GPU, pid."""
    return {
        "worker": w.id,
        "role": w.role,
        "device": w.spec.device,
        "gpu_uuid": w.info.get("gpu_uuid"),
        "gpu_index": w.info.get("gpu_index"),
        "pid": w.process.pid,
    }


async def snapshot_workers(
    pool: Any, workers: list[Any], window_s: float | None = None
) -> list[BaseException | dict[str, Any]]:
    """One snapshot per worker (its device's ``DeviceSample`` as a dict), concurrently; an exception
    in place of a worker that did not answer."""

    def snapshot(w: Any) -> Any:
        if window_s is not None and w.spec.device.startswith("emulated:"):
            return pool.call(w, "snapshot", SNAPSHOT_TIMEOUT_S, window_s=window_s)
        return pool.call(w, "snapshot", SNAPSHOT_TIMEOUT_S)

    return await asyncio.gather(*(snapshot(w) for w in workers), return_exceptions=True)


@dataclass(slots=True)
class Tick:
    """One sampling round: ``items`` has one entry per worker the pool held (a ``sample``, or an
    ``error`` and, for a worker not running, ``down: True`` and its ``state``)."""

    seq: int
    ts_s: float
    items: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "ts_s": self.ts_s, "items": self.items}


class DeviceSampler:
    """Samples every worker's device each ``interval_s`` into a ring of :class:`Tick`, while read.

    ``pool`` is a callable returning the :class:`~serving.pool.WorkerPool` (None while starting).
    ``sampler_id`` changes with every router process: a reader whose cursor belongs to another one
    starts over (a restarted router numbers its ticks from 0 again)."""

    def __init__(
        self,
        pool: Any,
        interval_s: float = 0.1,
        *,
        max_ticks: int = MAX_TICKS,
        idle_stop_s: float = IDLE_STOP_S,
    ) -> None:
        self._pool = pool
        self.interval_s = interval_s
        self.idle_stop_s = idle_stop_s
        self.sampler_id = uuid.uuid4().hex[:12]
        self._ticks: deque[Tick] = deque(maxlen=max_ticks)
        self._seq = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._last_read = 0.0  # monotonic
        self.late_ticks = 0  # ticks skipped because a round took longer than the interval
        self.evicted_ticks = 0

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def tick(self) -> Tick:
        """Take one round now: every worker's snapshot, or why there is none."""
        pool = self._pool()
        workers = list(pool.workers.values()) if pool is not None else []
        live = [w for w in workers if w.state in SAMPLED_STATES]
        results = await snapshot_workers(pool, live) if live else []
        answers = {w.id: r for w, r in zip(live, results, strict=True)}
        items = []
        for w in workers:
            if w.state == "stopped":
                continue  # removed on purpose: not a missing sample
            item = worker_item(w)
            if w.id not in answers:
                item.update(down=True, state=w.state, error=w.status_note())
            elif isinstance(answers[w.id], BaseException):
                res = answers[w.id]
                item.update(state=w.state, error=str(res) or type(res).__name__)
            else:
                item["sample"] = answers[w.id]
            items.append(item)
        tick = Tick(next(self._seq), time.time(), items)
        if len(self._ticks) == self._ticks.maxlen:
            self.evicted_ticks += 1
        self._ticks.append(tick)
        return tick

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while loop.time() - self._last_read < self.idle_stop_s:
            due += self.interval_s
            delay = due - loop.time()
            if delay < 0:  # the round took longer than the interval: skip the missed deadlines
                skipped = int(-delay // self.interval_s) + 1
                self.late_ticks += skipped
                due += skipped * self.interval_s
                delay = due - loop.time()
            await asyncio.sleep(delay)
            try:
                await self.tick()
            except Exception:  # a bug: logged, the next round tried (the reader sees no tick)
                log.exception("device sampler round failed")

    async def read(self, after: int | None) -> dict[str, Any]:
        """The ticks after ``after`` (all held when None), oldest first; starts the sampler (with a
        round taken at once) when it was not running."""
        self._last_read = asyncio.get_running_loop().time()
        if not self.running:
            await self.tick()
            self._task = asyncio.get_running_loop().create_task(self._run())
        ticks = list(self._ticks)
        first = ticks[0].seq if ticks else None
        missed = 0
        if after is not None and first is not None and after < first - 1:
            missed = first - 1 - after  # taken, then evicted before this read
        fresh = [t.to_dict() for t in ticks if after is None or t.seq > after]
        pool = self._pool()
        workers = list(pool.workers.values()) if pool is not None else []
        return {
            "sampler": self.sampler_id,
            "interval_s": self.interval_s,
            "first_seq": first,
            "last_seq": ticks[-1].seq if ticks else None,
            "missed_ticks": missed,
            "late_ticks": self.late_ticks,
            "ticks": fresh,
            "workers": [{**worker_item(w), "state": w.state} for w in workers if w.state != "stopped"],
        }

    async def stop(self) -> None:
        """Stop sampling (the router's shutdown)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None


__all__ = ["DeviceSampler", "Tick", "snapshot_workers", "worker_item"]
