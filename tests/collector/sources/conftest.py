"""Fixtures: a real local HTTP server with swappable responses, and an injectable clock."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from collector.captures import CAPTURES_DIR, capture

DATA = CAPTURES_DIR  # the captured pages (collector/captures/)
L4_PROM = capture("dcgm-exporter-l4.prom")

Response = tuple[int, str, str]  # status, body, content type
Route = Response | Callable[[dict[str, list[str]]], Response]
TEXT = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class LocalServer:
    """A real HTTP server on 127.0.0.1; ``routes[path]`` is a response or a function of the query."""

    url: str
    routes: dict[str, Route] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)

    def serve_text(self, path: str, body: str, status: int = 200) -> str:
        self.routes[path] = (status, body, TEXT)
        return self.url + path


def _handler(server: LocalServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            server.hits[parts.path] = server.hits.get(parts.path, 0) + 1
            route = server.routes.get(parts.path)
            if route is None:
                status, body, ctype = 404, "not found", "text/plain"
            elif callable(route):
                status, body, ctype = route(parse_qs(parts.query))
            else:
                status, body, ctype = route
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            return None

    return Handler


@pytest.fixture
def http_server() -> Iterator[LocalServer]:
    holder = LocalServer(url="")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(holder))
    holder.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield holder
    finally:
        httpd.shutdown()
        httpd.server_close()
        t.join(5)


class FakeClock:
    """Epoch seconds that move only when a test says so."""

    def __init__(self, t: float = 1_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def closed_port_url(path: str = "/metrics") -> str:
    """A URL on 127.0.0.1 where nothing listens (connection refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}{path}"
