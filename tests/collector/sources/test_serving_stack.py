"""The serving sources' keep-alive JSON client against a scripted HTTP server (raw bytes)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from collector.sources.base import SourceUnavailable
from collector.sources.serving_stack import _JsonClient

CLOSE = b""  # scripted "answer": close the connection without responding


class ThenClose(bytes):
    """A scripted answer after which the server closes the connection."""


class ScriptedServer:
    """Answers each request (read up to the blank line) with the next scripted raw response."""

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/base"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while self.answers:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            with conn, conn.makefile("rb") as reader:
                while self.answers:
                    request = b""
                    while not request.endswith(b"\r\n\r\n"):
                        line = reader.readline()
                        if not line:
                            break
                        request += line
                    if not request:
                        break
                    self.requests.append(request)
                    answer = self.answers.pop(0)
                    if answer is CLOSE:
                        break
                    conn.sendall(answer)
                    if isinstance(answer, ThenClose) or b"Connection: close" in answer:
                        break

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def serve() -> Iterator[type[ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def start(answers: list[bytes]) -> ScriptedServer:
        servers.append(ScriptedServer(answers))
        return servers[-1]

    yield start  # type: ignore[misc]
    for s in servers:
        s.close()


def ok(body: bytes, *headers: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"".join(h + b"\r\n" for h in headers)
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def test_keep_alive_gets_with_content_length_and_chunked_bodies(serve) -> None:
    chunked = b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{"a"\r\n5;x=1\r\n: [1]\r\n1\r\n}\r\n0\r\n\r\n'
    server = serve([ok(b'{"devices": []}'), chunked, ok(b"[1, 2]")])
    client = _JsonClient(server.url, timeout_s=5)
    assert client.get("/v1/devices", "devices") == {"devices": []}
    assert client.get("/v1/telemetry", "telemetry", after="router:3") == {"a": [1]}
    assert client.get("/v1/x", "x") == [1, 2]
    assert server.connections == 1  # one connection kept alive for all three
    first = server.requests[0].decode()
    assert first.startswith("GET /base/v1/devices HTTP/1.1\r\n") and f"Host: {server.url[7:-5]}\r\n" in first
    assert server.requests[1].startswith(b"GET /base/v1/telemetry?after=router%3A3 HTTP/1.1\r\n")
    client.close()


def test_a_connection_the_server_closed_is_reopened_once(serve) -> None:
    server = serve([ok(b"1"), CLOSE, ok(b"2"), ok(b"3", b"Connection: close"), ok(b"4")])
    client = _JsonClient(server.url, timeout_s=5)
    assert [client.get("/p", "p") for _ in range(4)] == [1, 2, 3, 4]
    assert server.connections == 3  # reopened after the silent close and after Connection: close


def test_failures_are_source_unavailable_with_a_kind(serve) -> None:
    server = serve(
        [
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy",
            ok(b"not json"),
            ThenClose(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"),
            CLOSE,
            ThenClose(b"garbage\r\n\r\n"),
            ThenClose(b"garbage\r\n\r\n"),
            CLOSE,
            CLOSE,
        ]
    )
    client = _JsonClient(server.url, timeout_s=5)
    with pytest.raises(SourceUnavailable, match=r"devices: HTTP 503: b'busy'") as err:
        client.get("/v1/devices", "devices")
    assert err.value.kind == "http_status"
    with pytest.raises(SourceUnavailable, match="not JSON") as err:
        client.get("/v1/devices", "devices")
    assert err.value.kind == "bad_response"
    with pytest.raises(SourceUnavailable, match="closed by the server") as err:
        client.get("/v1/devices", "devices")  # truncated body; the retry's connection closes unanswered
    assert err.value.kind == "unreachable"
    with pytest.raises(SourceUnavailable, match="bad status line") as err:
        client.get("/v1/devices", "devices")
    assert err.value.kind == "unreachable"
    assert client.status("/v1/devices") == 0


def test_unreachable_endpoint() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    client = _JsonClient(f"http://127.0.0.1:{port}", timeout_s=2)
    with pytest.raises(SourceUnavailable, match="devices: ") as err:
        client.get("/v1/devices", "devices")
    assert err.value.kind == "unreachable"
    with pytest.raises(ValueError, match="http://host:port"):
        _JsonClient("https://x:1", timeout_s=1)
