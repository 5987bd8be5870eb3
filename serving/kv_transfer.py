"""KV hand-off between workers over TCP: one framed message per request (header JSON + raw tensor).

Frame: 4-byte big-endian header length, header (UTF-8 JSON), 8-byte payload length, payload
(the K/V tensor's bytes, C order). The header names dtype and shape, so the receiver can rebuild
the tensor on any device.
"""

from __future__ import annotations

import json
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

_DTYPES = {str(t): t for t in (torch.float32, torch.float16, torch.bfloat16)}


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


def read_frame(sock: socket.socket) -> ReceivedKV:
    (hlen,) = struct.unpack(">I", _recv_exact(sock, 4))
    header = json.loads(_recv_exact(sock, hlen))
    (plen,) = struct.unpack(">Q", _recv_exact(sock, 8))
    payload = _recv_exact(sock, plen)
    received_s = time.time()
    dtype = _DTYPES.get(header["dtype"])
    if dtype is None:
        raise ValueError(f"KV dtype {header['dtype']!r} not supported; allowed: {list(_DTYPES)}")
    kv = torch.frombuffer(payload, dtype=torch.uint8).view(dtype).reshape(header["shape"])
    return ReceivedKV(header, kv, plen, received_s)


class KVReceiver:
    """Listens on 127.0.0.1 (or `host`) and puts every received hand-off into `inbox`."""

    def __init__(self, host: str = "127.0.0.1", on_error: Callable[[str], None] | None = None) -> None:
        self.inbox: queue.Queue[ReceivedKV] = queue.Queue()
        self._server = socket.create_server((host, 0))
        self.host, self.port = self._server.getsockname()[:2]
        self._on_error = on_error or (lambda msg: None)
        threading.Thread(target=self._accept_loop, daemon=True, name="kv-accept").start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._conn_loop, args=(conn,), daemon=True, name="kv-recv").start()

    def _conn_loop(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    self.inbox.put(read_frame(conn))
                except ConnectionError:
                    return
                except (OSError, ValueError, KeyError) as e:
                    self._on_error(f"KV receive failed: {e}")
                    return

    def close(self) -> None:
        self._server.close()


@dataclass(slots=True)
class SendJob:
    target: tuple[str, int]
    header: dict[str, Any]
    kv: torch.Tensor


class KVSender:
    """Sends hand-offs from a background thread, one persistent connection per target.

    `on_done(header, nbytes, started_s, error)` runs on that thread after each send.
    """

    def __init__(self, on_done: Callable[[dict[str, Any], int, float, str | None], None]) -> None:
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
                    sock = self._conns[job.target] = socket.create_connection(job.target, timeout=30)
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
