"""A real exporter on a socket that misbehaves on request: it trickles, sends too much, or answers well.

Each connection is served on its own thread, by the ``mode`` current when its request arrived:

- ``ok``: ``page`` with a Content-Length (keep-alive);
- ``trickle_body``: the headers (with the page's Content-Length), then one byte every ``trickle_s``;
- ``trickle_headers``: the status line, then the headers one byte every ``trickle_s``;
- ``chunked``: ``page`` in chunks of 64 KiB with no Content-Length, as fast as the client reads;
- ``declared``: a Content-Length of ``len(page)`` and the page, as fast as the client reads.

``sent[i]`` is how many bytes of the body reached the client's socket on connection ``i`` (what the
kernel took before the client closed), so a test can tell a body read whole from one cut short.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Literal

Mode = Literal["ok", "trickle_body", "trickle_headers", "chunked", "declared"]


class SlowExporter:
    """Serves ``page`` on ``http://127.0.0.1:<port>/metrics`` the way ``mode`` says."""

    def __init__(self, page: str, mode: Mode = "ok", trickle_s: float = 1.0) -> None:
        self.page = page
        self.mode: Mode = mode
        self.trickle_s = trickle_s
        self.requests = 0
        self.last_request = b""  # the last request's line and headers
        self.sent: list[int] = []
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/metrics"
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        index = len(self.sent)
        self.sent.append(0)
        with conn:
            conn.settimeout(0.2)
            buf = b""
            try:
                while not self._stop.is_set():
                    try:
                        data = conn.recv(65536)
                    except TimeoutError:
                        continue
                    if not data:
                        return
                    buf += data
                    while b"\r\n\r\n" in buf:
                        self.last_request, buf = buf.split(b"\r\n\r\n", 1)
                        self.requests += 1
                        if not self._answer(conn, index):
                            return
            except OSError:
                return  # the client went away

    def _answer(self, conn: socket.socket, index: int) -> bool:
        """Answer one request; False when the connection is done with."""
        mode, body = self.mode, self.page.encode()
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
        conn.settimeout(30)
        if mode == "ok":
            conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            self.sent[index] += len(body)
            return True
        if mode == "trickle_headers":
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            return self._trickle(conn, b"X-Slow: " + b"a" * 100_000 + b"\r\n\r\n", None)
        if mode == "trickle_body":
            conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body))
            return self._trickle(conn, body, index)
        if mode == "declared":
            conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body))
            return self._send(conn, [body[i : i + 65536] for i in range(0, len(body), 65536)], index)
        chunks = [body[i : i + 65536] for i in range(0, len(body), 65536)]
        conn.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n")
        framed = [b"%x\r\n%s\r\n" % (len(c), c) for c in chunks] + [b"0\r\n\r\n"]
        return self._send(conn, framed, index)

    def _send(self, conn: socket.socket, parts: list[bytes], index: int) -> bool:
        for part in parts:
            if self._stop.is_set():
                return False
            conn.sendall(part)  # raises once the client has closed (reset or broken pipe)
            self.sent[index] += len(part)
        return True

    def _trickle(self, conn: socket.socket, data: bytes, index: int | None) -> bool:
        for i in range(len(data)):
            if self._stop.wait(self.trickle_s if i else 0):
                return False
            conn.sendall(data[i : i + 1])
            if index is not None:
                self.sent[index] += 1
        return True


def trickle_total_s(exporter: SlowExporter) -> float:
    """How long the whole trickled page takes to arrive."""
    return len(exporter.page.encode()) * exporter.trickle_s


def wait_until(fn, timeout_s: float = 30.0, every_s: float = 0.1) -> None:
    """Wait until ``fn()`` is true (AssertionError after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while not fn():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(every_s)
