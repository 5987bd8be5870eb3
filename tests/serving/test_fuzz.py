"""Malformed input at every endpoint of a real server: never a 5xx, always a JSON error body.

One server (one tiny-model worker) takes ~2,000 requests: wrong types for every field, NaN and
Infinity, huge numbers, lone surrogates, nested junk, non-JSON bytes, non-object JSON, odd content
types, deep nesting, wrong methods and paths, bad query parameters, and the control API's bodies.
At the end the worker must still be the one it started with and serve a normal request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.serving.conftest import TOKEN, Server, start_server, stop_server

pytestmark = pytest.mark.slow
FUZZ_CLIENTS = 8


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


JUNK: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1.5,
    10**30,
    -(10**30),
    1e308,
    -1e308,
    float("nan"),
    float("inf"),
    float("-inf"),
    "",
    "x",
    "\ud800",
    "0.5",
    "a" * 20_000,
    [],
    [None],
    [1, "a", {}],
    {},
    {"a": {"b": [1, {"c": None}]}},
    _nested(300),
]

COMMON_FIELDS = [
    "model", "max_tokens", "temperature", "top_p", "n", "seed", "stop", "stop_token_ids", "stream",
    "stream_options", "ignore_eos", "return_token_ids", "user", "logprobs", "top_logprobs", "echo",
    "presence_penalty", "frequency_penalty", "logit_bias", "best_of", "suffix", "tools", "tool_choice",
    "response_format", "top_k",
]  # fmt: skip

RAW_BODIES = [
    b"",
    b" ",
    b"\xff\xfe\x00\x01",
    b"{",
    b"[]",
    b"null",
    b"123",
    b'"a string"',
    b"NaN",
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    b'{"prompt": "x", "max_tokens": 1' + b"0" * 5000 + b"}",
    b'{"prompt": "x", "max_tokens": 2, "temperature": NaN}',
    b'{"prompt": "x", "max_tokens": 2, "top_p": -Infinity}',
    b'{"prompt": "\\ud800\\udc00\\udc00", "max_tokens": 2}',
    b'{"messages": [{"role": "user", "content": "\\udfff"}], "max_tokens": 2}',
    b'{"prompt": "x", "prompt": 5}',
]
CONTENT_TYPES = [
    "application/json",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    None,
]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = start_server("--workers", "1", "--max-model-len", "256")
    yield s
    stop_server(s)


def _dumps(body: Any) -> bytes:
    return json.dumps(body, allow_nan=True).encode()  # NaN/Infinity written as JS literals


def _check(r: httpx.Response, what: str, *, control: bool = False, allow_501: bool = False) -> None:
    """No 5xx (501 only where a device knob is not supported); JSON error bodies for 4xx."""
    assert r.status_code < 500 or (allow_501 and r.status_code == 501), (
        f"{what}: {r.status_code} {r.text[:300]}"
    )
    if r.status_code >= 400:
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["message"], what
        assert err["code"] == r.status_code and "param" in err, what
        if not control:
            assert err["type"] == "invalid_request_error", what


def _post_api(client: httpx.Client, path: str, raw: bytes, what: str, ctype: str | None = None) -> None:
    headers = {"content-type": ctype} if ctype else {}
    with client.stream("POST", path, content=raw, headers=headers) as r:
        if r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"):
            lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
            assert lines and lines[-1] == "[DONE]", what
            for line in lines[:-1]:
                assert "error" not in json.loads(line), f"{what}: {line}"
            return
        r.read()
    _check(r, what)
    if r.status_code == 200:
        assert r.json()["choices"], what


def _field_bodies() -> Iterator[tuple[str, dict]]:
    completion = {"prompt": "fuzz", "max_tokens": 2}
    chat = {"messages": [{"role": "user", "content": "fuzz"}], "max_tokens": 2}
    for value in JUNK:
        for field in COMMON_FIELDS:
            yield "/v1/completions", {**completion, field: value}
            yield "/v1/chat/completions", {**chat, field: value}
        yield "/v1/completions", {**completion, "prompt": value}
        yield "/v1/chat/completions", {**chat, "max_completion_tokens": value}
        yield "/v1/completions", {**completion, "stream_options": {"include_usage": value}, "stream": True}
        for messages in (
            value,
            [value],
            [{"role": value, "content": "x"}],
            [{"role": "user", "content": value}],
            [{"role": "user", "content": [value]}],
            [{"role": "user", "content": [{"type": value, "text": "x"}]}],
            [{"role": "user", "content": [{"type": "text", "text": value}]}],
        ):
            yield "/v1/chat/completions", {**chat, "messages": messages}


def test_openai_endpoints_survive_malformed_bodies(server: Server) -> None:
    cases = [(path, _dumps(body), f"{path} {str(body)[:200]}", None) for path, body in _field_bodies()]
    for path in ("/v1/completions", "/v1/chat/completions"):
        for raw in RAW_BODIES:
            for ctype in CONTENT_TYPES:
                cases.append((path, raw, f"{path} raw {raw[:60]!r} as {ctype}", ctype))
    assert len(cases) > 1500
    limits = httpx.Limits(max_connections=FUZZ_CLIENTS, max_keepalive_connections=FUZZ_CLIENTS)
    with (
        httpx.Client(base_url=server.url, timeout=120, limits=limits) as c,
        ThreadPoolExecutor(FUZZ_CLIENTS) as pool,
    ):
        # several clients at once, as real traffic comes: the accepted bodies share batches
        list(pool.map(lambda case: _post_api(c, *case), cases))


def test_get_endpoints_and_routing_errors(server: Server) -> None:
    bad_after = ["x", "a:b", "worker-0:-1", ":" * 1000, "\x00", "worker-0:1" + "0" * 5000, "a:1,a:2", ",,,"]
    bad_limit = ["abc", "-1", "0", "1e3", "99999999999999999999999", "NaN", "", "10001"]
    with httpx.Client(base_url=server.url, timeout=60) as c:
        for path in ("/v1/models", "/health", "/metrics", "/v1/devices", "/v1/telemetry"):
            _check(c.get(f"{path}?junk=%ED%A0%80&x={'y' * 5000}&%ff=%00"), path)
        for after in bad_after:
            _check(c.get("/v1/telemetry", params={"after": after}), f"telemetry after={after[:40]!r}")
        for limit in bad_limit:
            r = c.get("/v1/telemetry", params={"limit": limit})
            _check(r, f"telemetry limit={limit!r}")
            assert r.status_code == 400, limit
        for path in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"):
            for method in ("GET", "PUT", "DELETE", "PATCH", "POST"):
                _check(c.request(method, path, content=b"{}"), f"{method} {path}")
        for path in ("/v1/nope", "/v1/completions/extra", "/%00", "/" + "a" * 5000):
            r = c.get(path)
            _check(r, path)
            assert r.status_code == 404


def test_control_api_survives_malformed_input(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=120, headers={"Authorization": f"Bearer {TOKEN}"}) as c:

        def post(path: str, raw: bytes) -> httpx.Response:
            return c.post(path, content=raw, headers={"content-type": "application/json"})

        _check(c.get("/control/layout", params={"junk": "1"}), "layout", control=True)
        for raw in RAW_BODIES:
            paths = ["/control/workers/worker-0/role", "/control/workers/worker-0/device"]
            if not raw.startswith(b'{"'):  # an object without "role" would start a mixed worker
                paths.append("/control/workers")
            for path in paths:
                _check(post(path, raw), f"{path} raw {raw[:60]!r}", control=True, allow_501=True)
        for value in JUNK:
            what = f"value {str(value)[:80]}"
            if value not in ("mixed", "prefill", "decode"):
                _check(post("/control/workers", _dumps({"role": value})), what, control=True)
                _check(post("/control/workers/worker-0/role", _dumps({"role": value})), what, control=True)
            if value is not None:  # a null device means the default: that would start a worker
                r = post("/control/workers", _dumps({"role": "decode", "device": value}))
                _check(r, what, control=True)
                assert r.status_code >= 400, what
            if not isinstance(value, int | float) or isinstance(value, bool):
                body = {"role": "mixed", "timeout_s": value}
                _check(post("/control/workers/worker-0/role", _dumps(body)), what, control=True)
            for body in (
                {"power_limit_w": value},
                {"sm_clock_min_mhz": value, "sm_clock_max_mhz": value},
                {"sm_clock_min_mhz": value},
                {"reset": value},
                {"fan": value},
            ):
                r = post("/control/workers/worker-0/device", _dumps(body))
                _check(r, f"device {body}"[:120], control=True, allow_501=True)
        for wid in ("nope", "worker-99", "%00", "a" * 2000, "worker-0/x"):
            _check(c.get(f"/control/workers/{wid}/device"), f"GET device {wid[:20]}", control=True)
            _check(c.delete(f"/control/workers/{wid}"), f"DELETE {wid[:20]}", control=True)
        for timeout in ("abc", "", "[]", "1e999x"):  # not numbers: worker-0 must not be drained
            r = c.delete("/control/workers/worker-0", params={"timeout_s": timeout})
            _check(r, f"DELETE timeout_s={timeout!r}", control=True)
            assert r.status_code >= 400
    # the worker it started with is still there and serves
    layout = server.layout()
    assert [(w["id"], w["state"]) for w in layout["workers"]] == [("worker-0", "ready")]
    assert "phaselens:worker_deaths_total 0.0" in httpx.get(f"{server.url}/metrics").text
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "still fine", "max_tokens": 3}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
