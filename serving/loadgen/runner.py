"""The open-loop run: each request sent at its arrival time (never earlier), an optional cap on
requests in flight, a graceful stop on SIGINT/SIGTERM; :func:`arun_load` and :func:`run_load`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, ParamSpec, TypeVar

import httpx
from tqdm import tqdm

from serving.loadgen.client import _payload, _send_one, emulation_during, fetch_emulation, fetch_model
from serving.loadgen.report import LoadReport, RequestResult, build_report
from serving.trace import (
    TraceRequest,
)

P = ParamSpec("P")
T = TypeVar("T")
STOP_GRACE_S = 8.0  # on SIGINT/SIGTERM, how long requests in flight may still take (the demo waits 10 s)


async def arun_load(
    base_url: str,
    requests: Sequence[TraceRequest],
    *,
    model: str | None = None,
    max_concurrency: int | None = None,
    timeout_s: float = 300.0,
    progress: bool = True,
    seed: int = 0,
    clipped: int = 0,
    stop_grace_s: float = STOP_GRACE_S,
) -> LoadReport:
    """Replay ``requests`` open-loop against ``base_url`` and return the report (async version).

    Request *i* is sent no earlier than ``arrival_s`` after the run starts; with ``max_concurrency``
    a request also waits for a free slot (then it is sent late, and TTFT counts from the actual
    send). ``model=None`` uses the first model of ``GET /v1/models``. ``timeout_s`` bounds each
    request end to end. ``clipped`` is only copied into the report. Failed requests are counted,
    never raised; :class:`LoadGenError` is raised only when the run cannot start.

    SIGINT or SIGTERM (when run on the main thread) stops the run gracefully: no further request
    is sent, the ones in flight get up to ``stop_grace_s`` to finish (then they are cancelled and
    count as failed), and the report counts the unsent ones as ``not_sent``, not as failures.
    """
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1 or None, got {max_concurrency!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    base_url = base_url.rstrip("/")
    limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency or 100)
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 30.0))
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        if model is None:
            model = await fetch_model(client, base_url)
        order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
        results = [
            RequestResult(i, r.arrival_s, r.prompt_tokens, r.output_tokens) for i, r in enumerate(requests)
        ]
        # Prompts are built before the clock starts so that building them never delays a send.
        bodies = [_payload(r, i, model, seed) for i, r in enumerate(requests)]
        bar = tqdm(total=len(requests), unit="req", file=sys.stderr, disable=not progress, desc="load")
        sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        failed = [0]
        devices_before = await fetch_emulation(client, base_url)
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            async with sem if sem is not None else contextlib.nullcontext():
                await _send_one(
                    client, base_url, bodies[i], results[i], requests[i], t0=t0, timeout_s=timeout_s
                )
            bar.update(1)
            if not results[i].ok:
                failed[0] += 1
                bar.set_postfix(failed=failed[0])

        stop = asyncio.Event()
        tasks: dict[int, asyncio.Task] = {}
        with _stop_on_signals(stop):
            try:
                for i in order:
                    if not await _sleep_until(t0 + requests[i].arrival_s, stop):
                        break
                    tasks[i] = asyncio.create_task(one(i))
                await _finish(list(tasks.values()), stop, stop_grace_s)
            finally:
                bar.close()
        for i, task in tasks.items():
            if task.cancelled():
                results[i].status, results[i].error = (
                    "cancelled",
                    "the run was stopped while it was in flight",
                )
        duration = time.perf_counter() - t0
        devices_after = await fetch_emulation(client, base_url)
    report = build_report(
        base_url,
        model,
        [results[i] for i in sorted(tasks)],
        duration,
        clipped=clipped,
        max_concurrency=max_concurrency,
        not_sent=len(requests) - len(tasks),
    )
    report.emulation = emulation_during(devices_before, devices_after)
    return report


def _in_own_loop(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """``fn`` run to completion in an event loop of its own, with ``fn``'s parameters and types."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return asyncio.run(fn(*args, **kwargs))

    return run


#: :func:`arun_load` with its parameters, run in its own event loop (call ``arun_load`` from inside a
#: running loop)
run_load = _in_own_loop(arun_load)


async def _sleep_until(deadline: float, stop: asyncio.Event | None = None) -> bool:
    """Sleep until ``time.perf_counter() >= deadline`` (never wakes early); False at once when
    ``stop`` is set before then."""
    while (delay := deadline - time.perf_counter()) > 0:
        if stop is None:
            await asyncio.sleep(delay)
            continue
        try:
            await asyncio.wait_for(stop.wait(), delay)
        except TimeoutError:
            continue
        return False
    return not (stop is not None and stop.is_set())


async def _finish(tasks: list[asyncio.Task], stop: asyncio.Event, grace_s: float) -> None:
    """Wait for ``tasks``; once ``stop`` is set, give them ``grace_s`` more, then cancel the rest."""
    if not tasks:
        return
    pending = set(tasks)
    stopper = asyncio.create_task(stop.wait())
    try:
        while pending and not stop.is_set():
            _, pending = await asyncio.wait(pending | {stopper}, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(stopper)
        if pending:
            _, pending = await asyncio.wait(pending, timeout=grace_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        stopper.cancel()


@contextlib.contextmanager
def _stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """Set ``stop`` on SIGINT/SIGTERM while inside (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    sigs = (signal.SIGINT, signal.SIGTERM)
    for sig in sigs:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig in sigs:
            loop.remove_signal_handler(sig)
