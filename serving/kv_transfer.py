"""KV hand-off between workers over TCP: one authenticated connection per sender and receiver, one
framed message per request (header JSON + raw tensor).

Connection: the receiver sends ``MAGIC`` and a random 32-byte nonce; the sender answers with its own
nonce and HMAC-SHA256(secret, sender label + both nonces); the receiver checks it
(``hmac.compare_digest``) and answers HMAC-SHA256(secret, receiver label + both nonces), which the
sender checks. So both ends prove they hold the stack's secret (:func:`stack_secret`, given to every
worker at start through its process pipe, never on a command line) without sending it, and a KV
tensor never goes to a port some other process took over.

Frame: 4-byte big-endian header length, header (UTF-8 JSON), 8-byte payload length, payload (the
K/V tensor's bytes, C order). The header names dtype and shape, so the receiver can rebuild the
tensor on any device. Each frame is checked against the receiving worker's :class:`KVLayout`
(required fields and their types, the KV shape of its model, lengths) before its payload is read.

A connection that fails the handshake, sends a frame that fails a check, or comes beyond
``max_connections``, is closed -- only that connection -- and counted by reason
(:data:`REJECT_REASONS`) in :attr:`KVReceiver.rejected`; the worker goes on serving.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import queue
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

_DTYPES = {str(t): t for t in (torch.float32, torch.float16, torch.bfloat16)}
MAGIC = b"PLKV1\n"  # the receiver's greeting: protocol and version
NONCE_BYTES = DIGEST_BYTES = 32
_SENDER, _RECEIVER = b"phaselens-kv-sender", b"phaselens-kv-receiver"
SECRET_ENV = "PHASELENS_KV_SECRET"  # hex; unset: a random secret per stack
MIN_SECRET_BYTES = 16
REJECT_REASONS = ("unauthenticated", "malformed", "oversized", "too_many_connections")
MAX_REQUEST_ID_CHARS = 256
# The header fields every hand-off has and their JSON types (dtype and shape are checked apart).
_FIELDS: dict[str, tuple[type, ...]] = {
    "request_id": (str,),
    "token_ids": (list,),
    "num_prompt_tokens": (int,),
    "params": (dict,),
    "from_worker": (str,),
    "meta": (dict,),
    "sent_s": (int, float),
}


def stack_secret(environ: dict[str, str] | None = None) -> bytes:
    """The hand-off secret of a new stack: ``$PHASELENS_KV_SECRET`` (hex, at least 16 bytes) when
    set, else 32 random bytes. Raises ValueError naming the variable when it is malformed."""
    text = (os.environ if environ is None else environ).get(SECRET_ENV, "").strip()
    if not text:
        return secrets.token_bytes(32)
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{SECRET_ENV} must be hexadecimal (e.g. from `openssl rand -hex 32`)") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"{SECRET_ENV} must be at least {MIN_SECRET_BYTES} bytes ({2 * MIN_SECRET_BYTES} hex digits)"
        )
    return secret


def _mac(secret: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, label + b"".join(parts), hashlib.sha256).digest()


class FrameError(ValueError):
    """A connection refused: ``reason`` is one of :data:`REJECT_REASONS`; ``request_id`` is the
    frame's when its header named one."""

    def __init__(self, reason: str, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.reason, self.request_id = reason, request_id


@dataclass(frozen=True, slots=True)
class KVLayout:
    """What a receiving worker accepts: its model's KV shape ``[2, num_layers, tokens, num_kv_heads,
    head_dim]`` with tokens below the number of token ids (at most ``max_tokens``, its max model
    length), token ids below ``vocab_size``."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_tokens: int
    vocab_size: int

    @property
    def max_header_bytes(self) -> int:
        """Room for ``max_tokens`` token ids of up to 10 digits and the other fields."""
        return 64 * 1024 + 12 * self.max_tokens

    @property
    def max_payload_bytes(self) -> int:
        """The largest KV tensor: ``max_tokens`` tokens in float32."""
        return 2 * self.num_layers * self.max_tokens * self.num_kv_heads * self.head_dim * 4


@dataclass(slots=True)
class ReceivedKV:
    header: dict[str, Any]
    kv: torch.Tensor
    nbytes: int
    received_s: float


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's bytes in host memory, without a further copy."""
    return memoryview(t.detach().contiguous().cpu().view(torch.uint8).flatten().numpy())


def encode(header: dict[str, Any], kv: torch.Tensor) -> tuple[bytes, memoryview]:
    """Frame parts for one hand-off; `header` gets dtype and shape added."""
    payload = _tensor_bytes(kv)
    head = json.dumps({**header, "dtype": str(kv.dtype), "shape": list(kv.shape)}).encode()
    return struct.pack(">I", len(head)) + head + struct.pack(">Q", len(payload)), payload


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError(f"peer closed after {got} of {n} bytes")
        got += k
    return buf


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_header(header: Any, layout: KVLayout) -> str | None:
    """Why ``header`` is no hand-off ``layout`` accepts (the first problem found), or None."""
    if not isinstance(header, dict):
        return f"header is a JSON {type(header).__name__}, not an object"
    for name, types in _FIELDS.items():
        if name not in header:
            return f"header lacks {name!r} (required: {', '.join(_FIELDS)}, dtype, shape)"
        value = header[name]
        if not isinstance(value, types) or isinstance(value, bool):
            return f"{name!r} is a {type(value).__name__}, expected {' or '.join(t.__name__ for t in types)}"
    rid, tokens, n_prompt = header["request_id"], header["token_ids"], header["num_prompt_tokens"]
    if not 0 < len(rid) <= MAX_REQUEST_ID_CHARS:
        return f"'request_id' must have 1 to {MAX_REQUEST_ID_CHARS} characters, got {len(rid)}"
    if not 0 < len(tokens) <= layout.max_tokens:
        return f"'token_ids' must hold 1 to {layout.max_tokens} ids (the max model length), got {len(tokens)}"
    if not all(_is_int(t) and 0 <= t < layout.vocab_size for t in tokens):
        return f"'token_ids' must be integers in [0, {layout.vocab_size})"
    if not 0 < n_prompt <= len(tokens):
        return f"'num_prompt_tokens' must be in [1, {len(tokens)}] (the token ids), got {n_prompt}"
    if not math.isfinite(header["sent_s"]):
        return "'sent_s' must be a finite number"
    if header.get("dtype") not in _DTYPES:
        return f"KV dtype {header.get('dtype')!r} not supported; allowed: {list(_DTYPES)}"
    shape = header.get("shape")
    want = [2, layout.num_layers, "tokens", layout.num_kv_heads, layout.head_dim]
    if (
        not isinstance(shape, list)
        or len(shape) != 5
        or not all(_is_int(d) for d in shape)
        or [shape[0], shape[1], shape[3], shape[4]] != [want[0], want[1], want[3], want[4]]
    ):
        return f"KV shape {shape!r} is not this model's {want}"
    if not 0 < shape[2] < len(tokens):  # the newest token's K/V is computed by the decode worker
        return (
            f"KV shape has {shape[2]} tokens; must be in [1, {len(tokens) - 1}] (all but the newest token id)"
        )
    return None


def read_frame(sock: socket.socket, layout: KVLayout, frame_timeout_s: float = 30.0) -> ReceivedKV:
    """Read and check one frame. ConnectionError: the peer closed the connection between frames;
    FrameError: the frame (or what arrived of it) is not a hand-off ``layout`` accepts."""
    (hlen,) = struct.unpack(">I", _recv_exact(sock, 4))
    sock.settimeout(frame_timeout_s)  # a frame, once begun, arrives whole and soon
    try:
        if not 0 < hlen <= layout.max_header_bytes:
            reason = "oversized" if hlen else "malformed"
            raise FrameError(reason, f"header length {hlen} is outside [1, {layout.max_header_bytes}] bytes")
        try:
            header = json.loads(_recv_exact(sock, hlen))
        except (ValueError, RecursionError) as e:
            raise FrameError("malformed", f"header is not JSON: {type(e).__name__}: {e}") from None
        rid = header.get("request_id") if isinstance(header, dict) else None
        rid = rid if isinstance(rid, str) and 0 < len(rid) <= MAX_REQUEST_ID_CHARS else None
        problem = check_header(header, layout)
        if problem is not None:
            raise FrameError("malformed", problem, rid)
        (plen,) = struct.unpack(">Q", _recv_exact(sock, 8))
        dtype = _DTYPES[header["dtype"]]
        want = math.prod(header["shape"]) * dtype.itemsize
        if plen != want:
            reason = "oversized" if plen > layout.max_payload_bytes else "malformed"
            raise FrameError(
                reason, f"payload length {plen} is not the {want} bytes its shape and dtype take", rid
            )
        payload = _recv_exact(sock, plen)
    except ConnectionError as e:
        raise FrameError("malformed", f"connection closed inside a frame ({e})") from None
    except TimeoutError:
        raise FrameError("malformed", f"frame incomplete after {frame_timeout_s:g} s") from None
    sock.settimeout(None)
    received_s = time.time()
    kv = torch.frombuffer(payload, dtype=torch.uint8).view(dtype).reshape(header["shape"])
    return ReceivedKV(header, kv, plen, received_s)


# on_reject(reason, message, request_id, authenticated): runs on the connection's thread.
RejectHook = Callable[[str, str, "str | None", bool], None]


class KVReceiver:
    """Listens on 127.0.0.1 (or `host`) and puts every received hand-off into `inbox`.

    Only peers holding ``secret`` get past the handshake; every frame is checked against ``layout``.
    """

    def __init__(
        self,
        secret: bytes,
        layout: KVLayout,
        host: str = "127.0.0.1",
        on_reject: RejectHook | None = None,
        *,
        max_connections: int = 64,
        handshake_timeout_s: float = 5.0,
        frame_timeout_s: float = 30.0,
    ) -> None:
        self.inbox: queue.Queue[ReceivedKV] = queue.Queue()
        self.layout = layout
        self.rejected: dict[str, int] = dict.fromkeys(REJECT_REASONS, 0)
        self._secret = secret
        self._on_reject = on_reject or (lambda *a: None)
        self._max_connections = max_connections
        self._handshake_timeout_s, self._frame_timeout_s = handshake_timeout_s, frame_timeout_s
        self._lock = threading.Lock()
        self._open = 0
        self._server = socket.create_server((host, 0))
        self.host, self.port = self._server.getsockname()[:2]
        threading.Thread(target=self._accept_loop, daemon=True, name="kv-accept").start()

    def rejected_total(self) -> int:
        with self._lock:
            return sum(self.rejected.values())

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                full = self._open >= self._max_connections
                self._open += not full
            if full:
                conn.close()
                self._reject(
                    FrameError("too_many_connections", f"{self._max_connections} already open"), False
                )
                continue
            threading.Thread(target=self._conn_loop, args=(conn,), daemon=True, name="kv-recv").start()

    def _conn_loop(self, conn: socket.socket) -> None:
        authenticated = False
        try:
            with conn:
                self._authenticate(conn)
                authenticated = True
                while True:
                    self.inbox.put(read_frame(conn, self.layout, self._frame_timeout_s))
        except ConnectionError:
            if not authenticated:  # the peer hung up during the handshake
                self._reject(FrameError("unauthenticated", "closed during the handshake"), False)
        except FrameError as e:
            self._reject(e, authenticated)
        except Exception as e:  # anything else a peer's bytes provoke ends its connection only
            self._reject(FrameError("malformed", f"{type(e).__name__}: {e}"), authenticated)
        finally:
            with self._lock:
                self._open -= 1

    def _authenticate(self, conn: socket.socket) -> None:
        conn.settimeout(self._handshake_timeout_s)
        nonce = secrets.token_bytes(NONCE_BYTES)
        try:
            conn.sendall(MAGIC + nonce)
            reply = _recv_exact(conn, NONCE_BYTES + DIGEST_BYTES)
        except TimeoutError:
            raise FrameError(
                "unauthenticated", f"no handshake within {self._handshake_timeout_s:g} s"
            ) from None
        peer_nonce, mac = bytes(reply[:NONCE_BYTES]), bytes(reply[NONCE_BYTES:])
        if not hmac.compare_digest(mac, _mac(self._secret, _SENDER, nonce, peer_nonce)):
            raise FrameError(
                "unauthenticated", "handshake failed: the peer does not hold this stack's secret"
            )
        conn.sendall(_mac(self._secret, _RECEIVER, peer_nonce, nonce))
        conn.settimeout(None)

    def _reject(self, error: FrameError, authenticated: bool) -> None:
        with self._lock:
            self.rejected[error.reason] += 1
        self._on_reject(error.reason, str(error), error.request_id, authenticated)

    def close(self) -> None:
        self._server.close()


def connect(target: tuple[str, int], secret: bytes, timeout_s: float = 30.0) -> socket.socket:
    """Open an authenticated hand-off connection to a receiver at ``target``; ConnectionError when
    the peer is no receiver holding ``secret``."""
    sock = socket.create_connection(target, timeout=timeout_s)
    try:
        greeting = _recv_exact(sock, len(MAGIC) + NONCE_BYTES)
        if bytes(greeting[: len(MAGIC)]) != MAGIC:
            raise ConnectionError("the peer is not a phaselens KV receiver (bad greeting)")
        nonce, mine = bytes(greeting[len(MAGIC) :]), secrets.token_bytes(NONCE_BYTES)
        sock.sendall(mine + _mac(secret, _SENDER, nonce, mine))
        proof = bytes(_recv_exact(sock, DIGEST_BYTES))
        if not hmac.compare_digest(proof, _mac(secret, _RECEIVER, mine, nonce)):
            raise ConnectionError("the peer does not hold this stack's secret")
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass(slots=True)
class SendJob:
    target: tuple[str, int]
    header: dict[str, Any]
    kv: torch.Tensor


class KVSender:
    """Sends hand-offs from a background thread, one persistent authenticated connection per target.

    `on_done(header, nbytes, started_s, error)` runs on that thread after each send.
    """

    def __init__(
        self, secret: bytes, on_done: Callable[[dict[str, Any], int, float, str | None], None]
    ) -> None:
        self._secret = secret
        self._q: queue.Queue[SendJob | None] = queue.Queue()
        self._conns: dict[tuple[str, int], socket.socket] = {}
        self._on_done = on_done
        threading.Thread(target=self._loop, daemon=True, name="kv-send").start()

    def send(self, target: tuple[str, int], header: dict[str, Any], kv: torch.Tensor) -> None:
        self._q.put(SendJob(target, header, kv))

    def _loop(self) -> None:
        while (job := self._q.get()) is not None:
            started_s = time.time()
            header = {**job.header, "sent_s": started_s}
            nbytes, error = 0, None
            try:
                head, payload = encode(header, job.kv)
                nbytes = payload.nbytes
                sock = self._conns.get(job.target)
                if sock is None:
                    sock = self._conns[job.target] = connect(job.target, self._secret)
                sock.sendall(head)
                sock.sendall(payload)
            except OSError as e:
                error = f"KV hand-off to {job.target[0]}:{job.target[1]} failed: {e}"
                dead = self._conns.pop(job.target, None)
                if dead is not None:
                    dead.close()
            self._on_done(header, nbytes, started_s, error)

    def close(self) -> None:
        self._q.put(None)
