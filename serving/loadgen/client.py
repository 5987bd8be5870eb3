"""The HTTP side of a load run: the prompt text, one streaming ``POST /v1/completions`` timed token
by token into its :class:`~serving.loadgen.report.RequestResult`, the model to ask for, and the
emulated GPUs' counters (``GET /v1/devices``) before and after the run."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import httpx

from serving.loadgen.report import LoadGenError, RequestResult
from serving.trace import (
    TraceRequest,
)

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
