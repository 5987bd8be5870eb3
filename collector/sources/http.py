"""HTTP GETs for the sources (httpcore, httpx's transport layer), with one deadline per request and
a limit on the body's size.

Per-operation timeouts do not bound a request: an exporter that sends its headers and then one byte
every 2 s never trips a 5 s read timeout, and held a source for as long as it trickled.
:class:`HttpClient` gives every request one wall-clock deadline (``timeout_s`` from the start of the
request): its ``httpcore.ConnectionPool`` connects through a network backend
(:class:`_DeadlineBackend`, passed as the pool's public ``network_backend`` argument) whose connect,
TLS handshake and every socket read and write wait at most what is left of the deadline, so a
request ends by its deadline whatever the peer does, a trickle inside the headers included.

The body is streamed and read no further than ``max_body_bytes``: a ``Content-Length`` over the
limit is refused before its body is read, and a chunked or read-to-close body is read no further
than the limit. Either raises :class:`~collector.sources.base.PageTooLarge`.

One pool of one connection per :class:`HttpClient` (one per source, one base URL) keeps its
connection alive between polls; a kept-alive connection the server closed meanwhile is retried
once. The pool is used directly rather than through ``httpx.Client``, whose request and response
objects, URL merging and cookies cost ~0.5 ms of CPU a GET on top of httpcore's (h11's parser),
over a quarter of a 10 Hz ``/v1/devices`` poll; a request without params is built once
(``bench/collector_overhead.py``; docs/BENCHMARKS.md, collector_overhead).
An injected ``httpx.Client`` (an in-process transport) is read through httpx with the same limits.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import httpcore
import httpx

from collector.sources.base import PageTooLarge, SourceUnavailable

#: The deadline of one scrape of a ``/metrics`` page (connect, headers and body), s.
DEFAULT_SCRAPE_TIMEOUT_S = 5.0
#: The largest ``/metrics`` page read (``phaselens collect --max-page-bytes``): a dcgm-exporter page
#: of 8 GPUs is ~60 KB and a vLLM page with its histograms ~100-300 KB. Parsing a page takes ~25× its
#: size in memory (a 16 MB page took the collector from 310 to 700 MB RSS), so a runaway exporter
#: must not be read whole.
DEFAULT_MAX_PAGE_BYTES = 4 * 1024 * 1024
#: How long an idle kept-alive connection is kept (httpx's default is 5 s: an engine scraped every
#: 5 s would reconnect on every scrape); one the server closed sooner is noticed and replaced.
KEEPALIVE_EXPIRY_S = 60.0
#: The characters of a path or query sent as they are (RFC 3986's unreserved, sub-delims, ':', '@',
#: '/', '?' and an existing percent-escape); any other is percent-encoded, as httpx does.
_SAFE_TARGET = "/?:@!$&'()*+,;=-._~%"

#: A request that did not end by its deadline (httpcore's and, for an injected client, httpx's).
_TIMEOUTS = (httpcore.TimeoutException, httpx.TimeoutException)
#: No connection or a malformed response: retried once on a fresh connection.
_TRANSPORT_ERRORS = (
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.UnsupportedProtocol,
    httpx.TransportError,
)


class _Deadline:
    """The time (``time.monotonic()``) by which a client's current request must end."""

    __slots__ = ("at_s",)

    def __init__(self) -> None:
        self.at_s = float("inf")

    def wait_s(self, timeout_s: float | None, expired: type[Exception]) -> float:
        """How long one socket operation may wait: ``timeout_s`` or what is left of the deadline,
        whichever is less; raises ``expired`` once the deadline has passed."""
        left = self.at_s - time.monotonic()
        if left <= 0:
            raise expired("the request's deadline passed")
        return left if timeout_s is None else min(timeout_s, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read, write and TLS handshake ends by the request's deadline."""

    def __init__(self, stream: httpcore.NetworkStream, deadline: _Deadline) -> None:
        self._stream, self._deadline = stream, deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, self._deadline.wait_s(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._deadline.wait_s(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        wait_s = self._deadline.wait_s(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, wait_s), self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's sockets (``SyncBackend``), each operation bounded by the request's deadline."""

    def __init__(self, deadline: _Deadline) -> None:
        self._backend, self._deadline = httpcore.SyncBackend(), deadline

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        wait_s = self._deadline.wait_s(timeout, httpcore.ConnectTimeout)
        stream = self._backend.connect_tcp(host, port, wait_s, local_address, socket_options)
        return _DeadlineStream(stream, self._deadline)

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class HttpClient:
    """Keep-alive HTTP GETs from one base URL (``http://`` or ``https://``), each bounded by one
    deadline of ``timeout_s`` and a body of at most ``max_body_bytes`` (None: no limit); ``headers``
    go with every request.

    ``client``: an ``httpx.Client`` to send the requests with instead of a connection pool of its
    own (an in-process transport: the ingest bench, the external validation); its transport does
    not know the deadline, which is then checked between the chunks of the body. Not for use by
    two threads at once (one client per source)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float,
        max_body_bytes: int | None = None,
        headers: Mapping[str, str] | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"URL must be http(s)://host[:port][/path], got {base_url!r}")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"URL must be http(s)://host[:port][/path], got {base_url!r}") from None
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if max_body_bytes is not None and max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1 or None, got {max_body_bytes!r}")
        for name, value in (headers or {}).items():
            if not name.isascii() or any(c in f"{name}{value}" for c in "\r\n") or ":" in name:
                raise ValueError(f"bad HTTP header {name!r}: an ASCII name without ':', no line breaks")
        self.url = base_url
        self.timeout_s = timeout_s
        self.max_body_bytes = max_body_bytes
        self._base = base_url.split("?", 1)[0].rstrip("/")
        self._path = parts.path.rstrip("/")
        self._query = parts.query
        # sent with every request (e.g. an Authorization); no compression, as the size limit is on
        # what is parsed
        self._headers = {"Accept-Encoding": "identity", **(headers or {})}
        self._deadline = _Deadline()
        self._own = client is None
        self._client = client
        self._pool: httpcore.ConnectionPool | None = None
        self._tls = parts.scheme == "https"
        host = parts.hostname
        self._origin = (
            parts.scheme.encode("ascii"),
            host.encode("ascii") if host.isascii() else host.encode("idna"),
            port,
        )
        netloc = parts.netloc.rsplit("@", 1)[-1]
        self._wire_headers = [
            (b"Host", netloc.encode("ascii") if netloc.isascii() else netloc.encode("idna")),
            *((k.encode("latin-1"), v.encode("latin-1")) for k, v in self._headers.items()),
        ]
        # the requests without params, per path and Accept (a keyed dict, each built once)
        self._requests: dict[tuple[str, str], httpcore.Request] = {}
        # the deadline bounds every socket operation (the backend); the pool waits no longer either
        self._extensions = {"timeout": {"pool": timeout_s}}

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
        what = what or self.url
        self._deadline.at_s = time.monotonic() + self.timeout_s
        try:
            for attempt in (1, 2):  # a kept-alive connection the server closed is retried once
                try:
                    if self._own:
                        return self._get(path, params, accept, what)
                    return self._get_injected(path, params, accept, what)
                except _TIMEOUTS:
                    raise SourceUnavailable(
                        "timeout", f"{what}: no whole response within the {self.timeout_s:g} s deadline"
                    ) from None
                except httpx.DecodingError as e:
                    raise SourceUnavailable("bad_response", f"{what}: {type(e).__name__}: {e}") from e
                except _TRANSPORT_ERRORS as e:
                    if attempt == 2:
                        raise SourceUnavailable("unreachable", f"{what}: {type(e).__name__}: {e}") from e
            raise AssertionError("not reached: the second attempt returns or raises")
        finally:
            self._deadline.at_s = float("inf")

    def _request(self, path: str, params: Mapping[str, Any] | None, accept: str) -> httpcore.Request:
        """The GET of ``path`` with ``params``; one without params is built once and sent again
        (an httpcore request with no body holds nothing a send changes)."""
        if params:
            return self._build(path, urlencode(params, doseq=True), accept)
        request = self._requests.get((path, accept))
        if request is None:
            request = self._requests[(path, accept)] = self._build(path, "", accept)
        return request

    def _build(self, path: str, query: str, accept: str) -> httpcore.Request:
        target = quote((self._path + path) or "/", safe=_SAFE_TARGET)
        query = "&".join(q for q in (self._query, query) if q)
        if query:
            target += "?" + quote(query, safe=_SAFE_TARGET)
        scheme, host, port = self._origin
        url = httpcore.URL(scheme=scheme, host=host, port=port, target=target.encode("ascii"))
        headers = [*self._wire_headers, (b"Accept", accept.encode("latin-1"))]
        return httpcore.Request(b"GET", url, headers=headers, extensions=self._extensions)

    def _get(
        self, path: str, params: Mapping[str, Any] | None, accept: str, what: str
    ) -> tuple[int, bytearray]:
        if self._pool is None:
            self._pool = httpcore.ConnectionPool(
                # https: the system's CAs (httpcore's default is certifi's)
                ssl_context=ssl.create_default_context() if self._tls else None,
                max_keepalive_connections=1,
                keepalive_expiry=KEEPALIVE_EXPIRY_S,
                network_backend=_DeadlineBackend(self._deadline),
            )
        response = self._pool.handle_request(self._request(path, params, accept))
        try:
            limit = self.max_body_bytes
            if limit is not None:
                for name, value in response.headers:
                    if name.lower() == b"content-length" and value.isdigit() and int(value) > limit:
                        raise PageTooLarge(
                            f"{what}: a body of {value.decode()} bytes or more, over the limit of {limit} bytes"
                        )
            body = bytearray()
            for chunk in response.stream:  # type: ignore[union-attr]  # a sync pool's stream
                body += chunk
                if limit is not None and len(body) > limit:
                    raise PageTooLarge(f"{what}: a body over the limit of {limit} bytes, read no further")
            return response.status, body
        finally:
            response.close()

    def _get_injected(
        self, path: str, params: Mapping[str, Any] | None, accept: str, what: str
    ) -> tuple[int, bytearray]:
        """:meth:`_get` through the injected ``httpx.Client``: the deadline checked between chunks."""
        assert self._client is not None
        url = self._base + path
        if self._query:
            url += "?" + self._query
        limit = self.max_body_bytes
        headers = {**self._headers, "Accept": accept}
        left_s = max(self._deadline.at_s - time.monotonic(), 0.001)
        with self._client.stream("GET", url, params=params, headers=headers, timeout=left_s) as resp:
            declared = resp.headers.get("content-length", "")
            if limit is not None and declared.isdigit() and int(declared) > limit:
                raise PageTooLarge(
                    f"{what}: a body of {declared} bytes or more, over the limit of {limit} bytes"
                )
            body = bytearray()
            for chunk in resp.iter_bytes():
                body += chunk
                if limit is not None and len(body) > limit:
                    raise PageTooLarge(f"{what}: a body over the limit of {limit} bytes, read no further")
                if time.monotonic() > self._deadline.at_s:
                    raise httpx.ReadTimeout("the request's deadline passed")
            return resp.status_code, body

    def close(self) -> None:
        """Drop the kept-alive connection (the next request opens another). Safe to call twice."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None


__all__ = ["DEFAULT_MAX_PAGE_BYTES", "DEFAULT_SCRAPE_TIMEOUT_S", "HttpClient"]
