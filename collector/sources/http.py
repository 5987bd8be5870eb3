"""HTTP/1.1 GETs for the sources, with one deadline per request and a limit on the body's size.

Per-read socket timeouts do not bound a request: an exporter that sends its headers and then one
byte every 2 s never trips a 5 s read timeout, and held a source for as long as it trickled.
:class:`HttpClient` gives every request one wall-clock deadline (``timeout_s`` from the start of
the request): the connect, the TLS handshake, every ``recv`` of the headers and of the body wait
at most what is left of it, so a request ends by its deadline whatever the peer does.

The body is read into one buffer and no further than ``max_body_bytes``: a ``Content-Length`` over
the limit is refused before its body is read, and a chunked or read-to-close body is read no
further than the limit. Either raises :class:`~collector.sources.base.PageTooLarge`.

It keeps one connection alive per client (one client per source, one base URL) and reads the
status line and headers itself (``http.client`` parses each response's headers with the email
package, ~0.4 ms a request; httpx ten times that, which matters at 10 polls per second).
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit

from collector.sources.base import PageTooLarge, SourceUnavailable

#: The deadline of one scrape of a ``/metrics`` page (connect, headers and body), s.
DEFAULT_SCRAPE_TIMEOUT_S = 5.0
#: The largest ``/metrics`` page read (``phaselens collect --max-page-bytes``): a dcgm-exporter page
#: of 8 GPUs is ~60 KB and a vLLM page with its histograms ~100-300 KB. Parsing a page takes ~25× its
#: size in memory (a 16 MB page took the collector from 310 to 700 MB RSS), so a runaway exporter
#: must not be read whole.
DEFAULT_MAX_PAGE_BYTES = 4 * 1024 * 1024
#: The longest status or header line read (a longer one is a bad response).
MAX_LINE_BYTES = 65_536
_RECV_BYTES = 262_144


class _HttpError(Exception):
    """The server's answer was not a well-formed HTTP/1.1 response."""


class _DeadlinePassed(Exception):
    """The request's deadline passed before its response was read."""


class _TooLarge(Exception):
    """The body is larger than the client's limit."""


class HttpClient:
    """Keep-alive HTTP/1.1 GETs from one base URL (``http://`` or ``https://``), each bounded by one
    deadline of ``timeout_s`` and a body of at most ``max_body_bytes`` (None: no limit); ``headers``
    go with every request."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float,
        max_body_bytes: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"URL must be http(s)://host[:port][/path], got {base_url!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if max_body_bytes is not None and max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1 or None, got {max_body_bytes!r}")
        self.url = base_url
        extra = b""
        for name, value in (headers or {}).items():
            if not name.isascii() or any(c in f"{name}{value}" for c in "\r\n") or ":" in name:
                raise ValueError(f"bad HTTP header {name!r}: an ASCII name without ':', no line breaks")
            extra += f"{name}: {value}\r\n".encode("latin-1")
        self._headers = extra  # sent with every request (e.g. an Authorization)
        self._tls = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port or (443 if self._tls else 80)
        self._prefix = parts.path.rstrip("/") if parts.path != "/" else ""
        self._query = parts.query
        self._host_header = parts.netloc.encode("ascii")
        self.timeout_s = timeout_s
        self.max_body_bytes = max_body_bytes
        self._sock: socket.socket | None = None
        self._buf = bytearray()  # bytes received and not yet consumed
        self._deadline = 0.0  # time.monotonic() by which the current request must end

    def get(
        self,
        path: str = "",
        params: Mapping[str, Any] | None = None,
        *,
        what: str | None = None,
        accept: str = "*/*",
    ) -> tuple[int, bytearray]:
        """GET ``path`` (after the base URL's path) and return ``(status, body)``.

        Raises :class:`SourceUnavailable` naming ``what`` (default: the URL): ``unreachable`` (no
        connection, a malformed response), ``timeout`` (the deadline passed), or
        :class:`PageTooLarge` (the body is over ``max_body_bytes``; what was read is dropped).
        """
        target = (self._prefix + path) or "/"
        query = "&".join(q for q in (self._query, urlencode(params) if params else "") if q)
        if query:
            target += "?" + query
        what = what or self.url
        request = b"GET %s HTTP/1.1\r\nHost: %s\r\nAccept: %s\r\n%s\r\n" % (
            target.encode("ascii"),
            self._host_header,
            accept.encode("ascii"),
            self._headers,
        )
        self._deadline = time.monotonic() + self.timeout_s
        for attempt in (1, 2):  # a kept-alive connection the server closed is retried once
            try:
                sock = self._sock or self._connect()
                sock.settimeout(self._left())
                sock.sendall(request)
                status, body, keep_alive = self._read_response()
                break
            except _DeadlinePassed:
                self.close()
                raise SourceUnavailable(
                    "timeout", f"{what}: no whole response within the {self.timeout_s:g} s deadline"
                ) from None
            except _TooLarge as e:
                self.close()
                raise PageTooLarge(f"{what}: {e}") from None
            except (OSError, _HttpError) as e:
                self.close()
                if isinstance(e, TimeoutError):  # the connect or the TLS handshake
                    raise SourceUnavailable(
                        "timeout", f"{what}: no whole response within the {self.timeout_s:g} s deadline"
                    ) from None
                if attempt == 2:
                    raise SourceUnavailable("unreachable", f"{what}: {str(e) or type(e).__name__}") from e
        if not keep_alive:
            self.close()
        return status, body

    def close(self) -> None:
        """Drop the kept-alive connection (the next request opens another). Safe to call twice."""
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._buf.clear()

    # --- internals -------------------------------------------------------------------------------

    def _left(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise _DeadlinePassed
        return left

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self._host, self._port), timeout=self._left())
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls:
                sock.settimeout(self._left())  # the handshake is bounded by the deadline too
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self._host)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._buf.clear()
        return sock

    def _recv(self) -> bytes:
        """One ``recv``, waiting at most what is left of the deadline; b'' at the end of the stream."""
        assert self._sock is not None
        self._sock.settimeout(self._left())
        try:
            return self._sock.recv(_RECV_BYTES)
        except TimeoutError:
            raise _DeadlinePassed from None

    def _readline(self) -> bytes:
        while True:
            i = self._buf.find(b"\n")
            if i >= 0:
                line = bytes(self._buf[: i + 1])
                del self._buf[: i + 1]
                return line
            if len(self._buf) > MAX_LINE_BYTES:
                raise _HttpError(f"a header line longer than {MAX_LINE_BYTES} bytes")
            data = self._recv()
            if not data:
                line = bytes(self._buf)
                self._buf.clear()
                return line
            self._buf += data

    def _read_into(self, body: bytearray, n: int | None, limit: int | None) -> None:
        """Append ``n`` bytes (None: up to the end of the stream) to ``body``, never past ``limit``."""
        if n is not None and limit is not None and len(body) + n > limit:
            raise _TooLarge(f"a body of {len(body) + n} bytes or more, over the limit of {limit} bytes")
        want = n
        if self._buf:
            take = len(self._buf) if want is None else min(want, len(self._buf))
            body += self._buf[:take]
            del self._buf[:take]
            if want is not None:
                want -= take
        while want is None or want > 0:
            if limit is not None and len(body) > limit:
                raise _TooLarge(f"a body over the limit of {limit} bytes, read no further")
            data = self._recv()
            if not data:
                if want is None:
                    return
                raise _HttpError(f"connection closed with {want} body bytes still to come")
            if want is not None and len(data) > want:  # the rest belongs to what follows
                self._buf += data[want:]
                data = data[:want]
            body += data
            if want is not None:
                want -= len(data)
        if limit is not None and len(body) > limit:
            raise _TooLarge(f"a body over the limit of {limit} bytes, read no further")

    def _read_response(self) -> tuple[int, bytearray, bool]:
        """(status, body, whether the connection stays open) of the next response."""
        line = self._readline()
        if not line:
            raise _HttpError("connection closed by the server")
        version, _, rest = line.partition(b" ")
        code = rest[:3]
        if not version.startswith(b"HTTP/1.") or not code.isdigit():
            raise _HttpError(f"bad status line {line[:80]!r}")
        length, chunked, keep_alive = None, False, version == b"HTTP/1.1"
        while True:
            line = self._readline()
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                raise _HttpError("connection closed inside the headers")
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"content-length":
                if not value.isdigit():
                    raise _HttpError(f"bad Content-Length {value[:40]!r}")
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = value.endswith(b"chunked")
            elif name == b"connection":
                keep_alive = value != b"close" and (keep_alive or value == b"keep-alive")
        status = int(code)
        body = bytearray()
        if status < 200 or status in (204, 304):  # no body
            pass
        elif chunked:
            self._read_chunked(body)
        elif length is not None:
            self._read_into(body, length, self.max_body_bytes)
        else:  # the body runs to the end of the connection
            self._read_into(body, None, self.max_body_bytes)
            keep_alive = False
        return status, body, keep_alive

    def _read_chunked(self, body: bytearray) -> None:
        while True:
            size_line = self._readline().split(b";", 1)[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                raise _HttpError(f"bad chunk size {size_line[:40]!r}") from None
            if size == 0:
                while self._readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return
            self._read_into(body, size, self.max_body_bytes)
            self._read_into(bytearray(), 2, None)  # the CRLF after the chunk


__all__ = ["DEFAULT_MAX_PAGE_BYTES", "DEFAULT_SCRAPE_TIMEOUT_S", "MAX_LINE_BYTES", "HttpClient"]
