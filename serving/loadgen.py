"""Open-loop HTTP load generator for OpenAI-compatible completion servers.

Each :class:`~serving.trace.TraceRequest` is sent at its arrival time (never earlier, whatever the
server's state: open loop) as a streaming ``POST /v1/completions`` with ``ignore_eos`` so that the
server generates exactly ``output_tokens`` tokens. Per request it measures time to first token
(send → first token chunk), every inter-token latency and end-to-end latency, and reads the
token counts from the final ``usage`` chunk. :func:`run_load` returns a :class:`LoadReport`;
:func:`format_report` renders it; :func:`add_load_arguments` / :func:`main_load` are the
``phaselens load`` subcommand.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from serving.trace import (
    TraceRequest,
    clip_trace,
    load_azure_trace_clipped,
    poisson_trace,
    vendored_trace_path,
)

__all__ = [
    "LatencyStats",
    "LoadGenError",
    "LoadReport",
    "RequestResult",
    "add_load_arguments",
    "arun_load",
    "build_report",
    "fetch_model",
    "format_report",
    "latency_stats",
    "main_load",
    "percentile",
    "run_load",
    "synthetic_prompt",
]

DEFAULT_URL = "http://127.0.0.1:8000"
MAX_ERRORS_SHOWN = 5
STOP_GRACE_S = 8.0  # on SIGINT/SIGTERM, how long requests in flight may still take (the demo waits 10 s)
_WORDS = (
    "the of and to in is was for on that with as by at from his her an which this are be it or had "
    "not have one were all they their there been has when who will more no if out so said what up its "
    "about into than them can only other new some could time these two may then do first any my now "
    "such like our over man me even most made after also did many before must through back years where "
    "much your way well down should because each just those people how too little state good very make "
    "world still own see men work long get here between both life being under never day same another "
    "know while last might us great old year off come since against go came right used take three"
)
_VOCABULARY: tuple[str, ...] = tuple(_WORDS.split())


class LoadGenError(RuntimeError):
    """The load run cannot start (e.g. the server is unreachable or lists no model)."""


@dataclass(slots=True)
class RequestResult:
    """What happened to one request. Times are seconds; ``*_s`` offsets are from the run start."""

    index: int
    arrival_s: float
    prompt_tokens_requested: int
    output_tokens_requested: int
    sent_s: float | None = None
    status: str = "pending"
    error: str | None = None
    http_status: int | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usage_reported: bool = False

    @property
    def ok(self) -> bool:
        """True when the request streamed to ``[DONE]`` without an error."""
        return self.status == "ok"


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Percentiles and mean of one latency, in milliseconds (NaN when there are no samples)."""

    n: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float


@dataclass(slots=True)
class LoadReport:
    """Per-request results and the run's summary (ok requests only count toward throughput)."""

    url: str
    model: str
    results: list[RequestResult]
    duration_s: float
    n_requests: int
    n_ok: int
    n_failed: int
    request_throughput_rps: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    prompt_tokens_total: int
    completion_tokens_total: int
    ttft: LatencyStats
    itl: LatencyStats
    e2e: LatencyStats
    clipped: int = 0
    max_concurrency: int | None = None
    errors: list[str] = field(default_factory=list)
    # Per emulated worker, what the run's iterations did on the modeled GPU (see emulation_during).
    emulation: list[dict[str, Any]] | None = None
    # Requests of the trace never sent because the run was stopped (SIGINT/SIGTERM): not failures.
    not_sent: int = 0

    def summary_dict(self) -> dict[str, Any]:
        """The summary (everything but the per-request results) as JSON-ready data."""
        d = self.to_dict()
        d.pop("results")
        return d

    def to_dict(self) -> dict[str, Any]:
        """The whole report as JSON-ready data (NaN becomes null)."""
        return _nan_to_none(asdict(self))


# --------------------------------------------------------------------------------------------- stats


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) with linear interpolation (numpy's default); NaN if empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q!r}")
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def latency_stats(values_s: Sequence[float]) -> LatencyStats:
    """p50/p90/p99/mean in ms of latencies given in seconds."""
    ms = [v * 1000.0 for v in values_s]
    mean = sum(ms) / len(ms) if ms else math.nan
    return LatencyStats(len(ms), percentile(ms, 50), percentile(ms, 90), percentile(ms, 99), mean)


def build_report(
    url: str,
    model: str,
    results: list[RequestResult],
    duration_s: float,
    *,
    clipped: int = 0,
    max_concurrency: int | None = None,
    not_sent: int = 0,
) -> LoadReport:
    """Summarise per-request results into a :class:`LoadReport` (``results``: the requests sent)."""
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    prompt_total = sum(r.prompt_tokens for r in ok)
    completion_total = sum(r.completion_tokens for r in ok)

    def per_s(x: float) -> float:
        return x / duration_s if duration_s > 0 else 0.0

    return LoadReport(
        url=url,
        model=model,
        results=results,
        duration_s=duration_s,
        n_requests=len(results),
        n_ok=len(ok),
        n_failed=len(failed),
        request_throughput_rps=per_s(len(ok)),
        output_tokens_per_s=per_s(completion_total),
        total_tokens_per_s=per_s(prompt_total + completion_total),
        prompt_tokens_total=prompt_total,
        completion_tokens_total=completion_total,
        ttft=latency_stats([r.ttft_s for r in ok if r.ttft_s is not None]),
        itl=latency_stats([x for r in ok for x in r.itl_s]),
        e2e=latency_stats([r.e2e_s for r in ok if r.e2e_s is not None]),
        clipped=clipped,
        max_concurrency=max_concurrency,
        errors=[f"#{r.index} {r.status}: {r.error}" for r in failed[:MAX_ERRORS_SHOWN]],
        not_sent=not_sent,
    )


def _nan_to_none(obj: Any) -> Any:
    """Replace NaN floats by None, recursively (JSON has no NaN)."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nan_to_none(v) for v in obj]
    return obj


# ------------------------------------------------------------------------------------------- prompts


def synthetic_prompt(n_chars: int, index: int, seed: int = 0) -> str:
    """Deterministic ASCII text of exactly ``n_chars`` characters, distinct per ``index``.

    It starts with the request index so that no two prompts share a long prefix (no prefix-cache
    hits between requests). With the byte-level tokenizer, ``n_chars`` characters are
    ``n_chars + 1`` prompt tokens (BOS).
    """
    if n_chars <= 0:
        return ""
    rng = random.Random(f"{seed}:{index}")
    parts = [f"{index}"]
    length = len(parts[0])
    while length < n_chars:
        word = rng.choice(_VOCABULARY)
        parts.append(word)
        length += len(word) + 1
    return " ".join(parts)[:n_chars]


def _prompt_for(request: TraceRequest, index: int, seed: int) -> str:
    """The prompt text for a trace request: prompt_tokens - 1 characters (BOS), at least one."""
    return synthetic_prompt(max(request.prompt_tokens - 1, 1), index, seed)


# --------------------------------------------------------------------------------------------- HTTP


async def fetch_model(client: httpx.AsyncClient, base_url: str) -> str:
    """The first model id that ``GET /v1/models`` lists."""
    url = f"{base_url}/v1/models"
    try:
        resp = await client.get(url)
    except httpx.HTTPError as e:
        raise LoadGenError(f"cannot reach {url}: {type(e).__name__}: {e}") from e
    if resp.status_code != 200:
        raise LoadGenError(f"{url} answered HTTP {resp.status_code}: {_error_message(resp.content)}")
    try:
        models = resp.json()["data"]
        return str(models[0]["id"])
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise LoadGenError(f"{url} lists no model (answer: {resp.text[:200]!r})") from e


def _error_message(body: bytes) -> str:
    """The ``error.message`` of an OpenAI-style error body, else the start of the body."""
    try:
        data = json.loads(body)
        err = data.get("error", data) if isinstance(data, dict) else data
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail") or json.dumps(err)
            return str(msg)
        return str(err)
    except ValueError:
        return body[:200].decode("utf-8", "replace") or "(empty body)"


def _payload(request: TraceRequest, index: int, model: str, seed: int) -> dict[str, Any]:
    """The JSON body of one streaming completion request."""
    return {
        "model": model,
        "prompt": _prompt_for(request, index, seed),
        "max_tokens": max(request.output_tokens, 1),
        "temperature": 0.0,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }


class _StreamState:
    """Token timing bookkeeping while one response streams."""

    def __init__(self, result: RequestResult, send_t: float) -> None:
        self.result = result
        self.send_t = send_t
        self.last_t: float | None = None
        self.chunks = 0
        self.done = False

    def on_data(self, data: str) -> None:
        """Handle the payload of one ``data:`` SSE line."""
        if data == "[DONE]":
            self.done = True
            return
        obj = json.loads(data)
        if not isinstance(obj, dict):
            return
        if obj.get("error"):
            err = obj["error"]
            raise _StreamError(err.get("message", str(err)) if isinstance(err, dict) else str(err))
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.result.completion_tokens = int(usage.get("completion_tokens") or 0)
            self.result.usage_reported = True
        for choice in obj.get("choices") or ():
            # One chunk per generated token; its text may be empty (a character split across tokens).
            if choice.get("text") is not None:
                self.on_token(time.perf_counter())

    def on_token(self, now: float) -> None:
        """Record one token chunk arriving at ``now``."""
        if self.last_t is None:
            self.result.ttft_s = now - self.send_t
        else:
            self.result.itl_s.append(now - self.last_t)
        self.last_t = now
        self.chunks += 1


class _StreamError(Exception):
    """The server reported an error inside the stream."""


async def _send_one(
    client: httpx.AsyncClient,
    base_url: str,
    body: dict[str, Any],
    result: RequestResult,
    request: TraceRequest,
    *,
    t0: float,
    timeout_s: float,
) -> None:
    """Send one prepared request body and fill ``result``; never raises (except on cancellation)."""
    send_t = time.perf_counter()
    result.sent_s = send_t - t0
    state = _StreamState(result, send_t)
    try:
        async with asyncio.timeout(timeout_s):
            await _stream(client, base_url, body, state)
    except (TimeoutError, httpx.TimeoutException):
        _fail(result, "timeout", f"no complete answer within {timeout_s:g} s")
    except _StreamError as e:
        _fail(result, "stream error", str(e))
    except httpx.HTTPError as e:
        _fail(result, "exception", f"{type(e).__name__}: {e}")
    except (ValueError, TypeError, AttributeError) as e:
        _fail(result, "bad response", f"{type(e).__name__}: {e}")
    except Exception as e:  # a failed request never stops the run
        _fail(result, "exception", f"{type(e).__name__}: {e}")
    if result.status == "pending":
        if state.done:
            result.status = "ok"
            result.e2e_s = time.perf_counter() - send_t
            if not result.usage_reported:
                result.prompt_tokens = request.prompt_tokens
                result.completion_tokens = state.chunks
        else:
            _fail(result, "incomplete", "stream ended before data: [DONE]")


async def _stream(
    client: httpx.AsyncClient, base_url: str, body: dict[str, Any], state: _StreamState
) -> None:
    """POST the completion and feed every SSE ``data:`` line to ``state``."""
    async with client.stream("POST", f"{base_url}/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            state.result.http_status = resp.status_code
            _fail(state.result, f"http {resp.status_code}", _error_message(await resp.aread()))
            return
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            state.on_data(line[5:].strip())
            if state.done:
                return


def _fail(result: RequestResult, status: str, message: str) -> None:
    """Mark a request failed."""
    result.status = status
    result.error = message


# ------------------------------------------------------------------------------------------- runner


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


async def fetch_emulation(client: httpx.AsyncClient, base_url: str) -> dict[str, dict[str, Any]] | None:
    """Each emulated worker's ``emulation`` object from ``GET /v1/devices`` (a phaselens stack); ``None``
    when the server has no such endpoint (another engine) or does not answer it."""
    try:
        r = await client.get(f"{base_url}/v1/devices", timeout=10.0)
        if r.status_code != 200:
            return None
        items = r.json().get("devices", [])
        return {
            d["worker"]: {**d["emulation"], "device": d.get("device")} for d in items if d.get("emulation")
        }
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        return None


def emulation_during(
    before: dict[str, dict[str, Any]] | None, after: dict[str, dict[str, Any]] | None
) -> list[dict[str, Any]] | None:
    """Per emulated worker, the run's iterations, host-bound (lagged) iterations and lag seconds: the
    difference of its lag counters after and before the run (a worker absent before counts from 0)."""
    if not after:
        return None
    out = []
    for worker, now in sorted(after.items()):
        was = (before or {}).get(worker, {})
        if was.get("device", now.get("device")) != now.get("device"):
            was = {}  # the worker's device changed during the run: its counters restarted
        iterations = now["iterations"] - was.get("iterations", 0)
        lagged = now["lagged_iterations"] - was.get("lagged_iterations", 0)
        if iterations < 0 or lagged < 0:  # restarted during the run: count what the new device saw
            iterations, lagged, was = now["iterations"], now["lagged_iterations"], {}
        out.append(
            {
                "worker": worker,
                "device": now.get("device"),
                "models_shape": now.get("models_shape"),
                "iterations": iterations,
                "lagged_iterations": lagged,
                "lag_s": (now.get("lag_s_total") or 0.0) - (was.get("lag_s_total") or 0.0),
                "host_bound_fraction": lagged / iterations if iterations else 0.0,
            }
        )
    return out


def run_load(
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
    """Replay ``requests`` against ``base_url`` and return the report (runs its own event loop).

    See :func:`arun_load` for the semantics; call that one from inside a running event loop.
    """
    return asyncio.run(
        arun_load(
            base_url,
            requests,
            model=model,
            max_concurrency=max_concurrency,
            timeout_s=timeout_s,
            progress=progress,
            seed=seed,
            clipped=clipped,
            stop_grace_s=stop_grace_s,
        )
    )


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


# ------------------------------------------------------------------------------------------- output


def format_report(report: LoadReport) -> str:
    """The report as a readable plain-text table."""
    lines = [
        f"load run against {report.url} (model {report.model})",
        f"  requests    {report.n_requests} sent, {report.n_ok} ok, {report.n_failed} failed, "
        f"{report.clipped} clipped"
        + (f", max concurrency {report.max_concurrency}" if report.max_concurrency else "")
        + (f"; stopped early: {report.not_sent} not sent" if report.not_sent else ""),
        f"  duration    {report.duration_s:.2f} s",
        f"  throughput  {report.request_throughput_rps:.3f} req/s, "
        f"{report.output_tokens_per_s:.1f} output tok/s, {report.total_tokens_per_s:.1f} total tok/s",
        f"  tokens      {report.prompt_tokens_total} prompt, {report.completion_tokens_total} completion",
        "",
        f"  {'latency (ms)':<14}{'n':>8}{'p50':>10}{'p90':>10}{'p99':>10}{'mean':>10}",
    ]
    for name, s in (("TTFT", report.ttft), ("ITL", report.itl), ("end-to-end", report.e2e)):
        cells = "".join(f"{_fmt_ms(v):>10}" for v in (s.p50_ms, s.p90_ms, s.p99_ms, s.mean_ms))
        lines.append(f"  {name:<14}{s.n:>8}{cells}")
    if report.emulation:
        lines += [
            "",
            "  emulated GPUs (modeled, not measured): host-bound = iterations the host could not pace",
        ]
        for e in report.emulation:
            lines.append(
                f"    {e['worker']:<10} {e['device']} modeling {e['models_shape']}: {e['iterations']} iterations, "
                f"{e['lagged_iterations']} host-bound ({100 * e['host_bound_fraction']:.1f} %), "
                f"lag {e['lag_s']:.2f} s"
            )
    if report.errors:
        lines += ["", f"  errors (first {len(report.errors)} of {report.n_failed}):"]
        lines += [f"    {e}" for e in report.errors]
    return "\n".join(lines)


def _fmt_ms(v: float) -> str:
    """A latency cell: '-' for NaN."""
    return "-" if math.isnan(v) else f"{v:.1f}"


# ---------------------------------------------------------------------------------------------- CLI


def _number(kind: type, *, minimum: float, strict: bool, what: str) -> Callable[[str], Any]:
    """An argparse ``type=`` that parses ``kind`` and enforces a lower bound."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if (value <= minimum) if strict else (value < minimum):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


_POS_FLOAT = _number(float, minimum=0, strict=True, what="a number > 0")
_NONNEG_FLOAT = _number(float, minimum=0, strict=False, what="a number >= 0")
_POS_INT = _number(int, minimum=1, strict=False, what="an integer >= 1")


def _fraction(text: str) -> float:
    """Parse a share in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


def _token_spec(text: str) -> int | tuple[int, int]:
    """Parse ``N`` or ``MIN:MAX`` token counts."""
    try:
        parts = [int(p) for p in text.split(":")]
    except ValueError:
        parts = []
    if len(parts) == 1 and parts[0] >= 1:
        return parts[0]
    if len(parts) == 2 and 1 <= parts[0] <= parts[1]:
        return parts[0], parts[1]
    raise argparse.ArgumentTypeError(f"expected N or MIN:MAX with 1 <= MIN <= MAX, got {text!r}")


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``phaselens load`` options to ``parser`` (call :func:`main_load` with the result)."""
    parser.add_argument("--url", default=DEFAULT_URL, help=f"server base URL (default {DEFAULT_URL})")
    parser.add_argument("--model", default=None, help="model name (default: first of GET /v1/models)")
    add_trace_arguments(parser)
    parser.add_argument(
        "--max-concurrency", metavar="N", type=_POS_INT, default=None, help="cap requests in flight"
    )
    parser.add_argument("--timeout", type=_POS_FLOAT, default=300.0, metavar="S", help="per request (300)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the report as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--max-failure-rate",
        type=_fraction,
        default=0.0,
        metavar="F",
        help="exit 0 when at most this share of requests failed, 0..1 (0: any failure exits 1)",
    )
    parser.set_defaults(_load_parser=parser)


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options that choose the requests (a trace or Poisson arrivals); see :func:`build_trace`."""
    src = parser.add_mutually_exclusive_group()
    src.add_argument(
        "--trace",
        type=Path,
        default=None,
        metavar="PATH",
        help="Azure LLM inference trace CSV to replay (default: the vendored 2,000-request slice)",
    )
    src.add_argument(
        "--poisson", type=_POS_FLOAT, default=None, metavar="RATE", help="synthetic Poisson arrivals, req/s"
    )
    parser.add_argument(
        "--num-requests", type=_POS_INT, default=None, metavar="N", help="with --poisson: requests (100)"
    )
    parser.add_argument(
        "--prompt-tokens", type=_token_spec, default=None, metavar="N|MIN:MAX", help="with --poisson (32:512)"
    )
    parser.add_argument(
        "--output-tokens", type=_token_spec, default=None, metavar="N|MIN:MAX", help="with --poisson (16:128)"
    )
    parser.add_argument(
        "--time-scale",
        metavar="X",
        type=_POS_FLOAT,
        default=None,
        help="trace: multiply times (0.1 = 10x faster)",
    )
    parser.add_argument(
        "--rate-scale", metavar="X", type=_POS_FLOAT, default=None, help="trace: multiply the request rate"
    )
    parser.add_argument(
        "--start", type=_NONNEG_FLOAT, default=None, metavar="S", help="trace: skip the first S s"
    )
    parser.add_argument(
        "--duration", type=_POS_FLOAT, default=None, metavar="S", help="trace: replay S s of it"
    )
    parser.add_argument(
        "--limit", type=_POS_INT, default=None, metavar="N", help="trace: first N requests only"
    )
    parser.add_argument(
        "--max-prompt-tokens", metavar="N", type=_POS_INT, default=None, help="clip prompt lengths"
    )
    parser.add_argument(
        "--max-output-tokens", metavar="N", type=_POS_INT, default=None, help="clip output lengths"
    )
    parser.add_argument("--seed", metavar="N", type=int, default=0, help="prompt text and Poisson seed (0)")


_TRACE_ONLY = ("time_scale", "rate_scale", "start", "duration", "limit")
_POISSON_ONLY = ("num_requests", "prompt_tokens", "output_tokens")


def trace_option_error(args: argparse.Namespace) -> str | None:
    """A message for options that do not fit together, else None."""
    if args.poisson is not None:
        bad = [n for n in _TRACE_ONLY if getattr(args, n) is not None]
        if bad:
            return f"{_flags(bad)} apply to a trace, not to --poisson (use --num-requests)"
    else:
        bad = [n for n in _POISSON_ONLY if getattr(args, n) is not None]
        if bad:
            return f"{_flags(bad)} apply to --poisson only (use --limit/--duration with a trace)"
        if args.trace is not None and not args.trace.is_file():
            return f"--trace {args.trace}: no such file"
    return None


def _flags(names: list[str]) -> str:
    """Option names as flags."""
    return ", ".join("--" + n.replace("_", "-") for n in names)


def build_trace(args: argparse.Namespace) -> tuple[list[TraceRequest], int, str]:
    """The requests to send, the clipped count and a description of the source."""
    if args.poisson is not None:
        n = args.num_requests or 100
        reqs = poisson_trace(
            args.poisson,
            n,
            prompt_tokens=args.prompt_tokens or (32, 512),
            output_tokens=args.output_tokens or (16, 128),
            seed=args.seed,
        )
        clipped = clip_trace(
            reqs, max_prompt_tokens=args.max_prompt_tokens, max_output_tokens=args.max_output_tokens
        )
        return clipped.requests, clipped.clipped, f"Poisson {args.poisson:g} req/s, {n} requests"
    path = args.trace or vendored_trace_path()
    loaded = load_azure_trace_clipped(
        path,
        time_scale=args.time_scale or 1.0,
        rate_scale=args.rate_scale or 1.0,
        limit=args.limit,
        start_s=args.start or 0.0,
        duration_s=args.duration,
        max_prompt_tokens=args.max_prompt_tokens,
        max_output_tokens=args.max_output_tokens,
    )
    return loaded.requests, loaded.clipped, f"trace {path}"


def main_load(args: argparse.Namespace) -> int:
    """Run ``phaselens load``; 1 when more than ``--max-failure-rate`` of the requests failed (by
    default: any) or none succeeded, 2 on bad options, else 0."""
    message = trace_option_error(args)
    if message:
        parser = getattr(args, "_load_parser", None)
        if parser is not None:
            parser.error(message)  # exits with status 2
        print(f"phaselens load: error: {message}", file=sys.stderr)
        return 2
    try:
        requests, clipped, source = build_trace(args)
    except (OSError, ValueError) as e:
        print(f"phaselens load: error: {e}", file=sys.stderr)
        return 2
    span = requests[-1].arrival_s if requests else 0.0
    print(
        f"{source}: {len(requests)} requests over {span:.1f} s, "
        f"{clipped} clipped to --max-prompt-tokens/--max-output-tokens",
        file=sys.stderr,
    )
    try:
        report = run_load(
            args.url,
            requests,
            model=args.model,
            max_concurrency=args.max_concurrency,
            timeout_s=args.timeout,
            progress=not args.no_progress,
            seed=args.seed,
            clipped=clipped,
        )
    except LoadGenError as e:
        print(f"phaselens load: error: {e}", file=sys.stderr)
        return 1
    print(format_report(report))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        print(f"report written to {args.json}", file=sys.stderr)
    return _exit_code(report, getattr(args, "max_failure_rate", 0.0))


def _exit_code(report: LoadReport, max_failure_rate: float) -> int:
    """1 (with a line on stderr) when the run failed more requests than allowed, else 0."""
    if not report.n_requests or not report.n_failed:
        return 0
    share = report.n_failed / report.n_requests
    if report.n_ok and share <= max_failure_rate:
        return 0
    print(
        f"phaselens load: {report.n_failed} of {report.n_requests} requests failed ({share:.1%}); "
        f"allowed: {max_failure_rate:.1%} (--max-failure-rate)",
        file=sys.stderr,
    )
    return 1
