"""Bad peers on a real decode worker's KV hand-off port (any local user can connect to it).

Before, a frame without ``request_id`` raised ``KeyError`` in the worker's main loop: the worker died
and was restarted, failing every request in flight on it. Now each bad connection is closed and
counted, and the worker goes on serving. The stack runs with a known ``PHASELENS_KV_SECRET`` so that
this test can also be a peer holding the secret (a prefill worker with a bug).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.kv_transfer import MAGIC, SECRET_ENV, connect
from tests.serving.conftest import Server, start_server, stop_server

pytestmark = pytest.mark.slow

SECRET = bytes.fromhex("5e" * 32)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SECRET_ENV, SECRET.hex())
        s = start_server("--mode", "disaggregated", "--prefill-workers", "1", "--decode-workers", "1")
    yield s
    stop_server(s)


def kv_port(pid: int) -> int:
    """The TCP port the worker process ``pid`` listens on (its KV receiver)."""
    ports = [
        c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN
    ]
    assert len(ports) == 1, ports
    return ports[0]


def closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(60)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    sock.close()
    return True


def drain(sock: socket.socket) -> None:
    """Read ``sock`` until the peer closes it (or this test does)."""
    try:
        while sock.recv(65536):
            pass
    except OSError:
        pass


def health(server: Server) -> dict:
    return httpx.get(f"{server.url}/health", timeout=30).json()


def rejected(server: Server, worker: str) -> dict[str, int]:
    return health(server).get("kv_handoff_rejected", {}).get(worker, {})


def complete(server: Server) -> dict:
    r = httpx.post(
        f"{server.url}/v1/completions",
        json={"prompt": "the KV goes", "max_tokens": 6, "ignore_eos": True},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_bad_peers_are_closed_and_counted_and_the_decode_worker_keeps_serving(server: Server) -> None:
    workers = {w["role"]: w for w in server.layout()["workers"]}
    decode = workers["decode"]
    target = ("127.0.0.1", kv_port(decode["pid"]))
    assert complete(server)["usage"]["completion_tokens"] == 6  # a hand-off works before

    # a frame without request_id, from a peer holding the secret (it killed the worker before)
    head = json.dumps({"token_ids": [1, 2], "dtype": "torch.float32", "shape": [2, 1, 1, 1, 1]}).encode()
    sock = connect(target, SECRET)
    sock.sendall(struct.pack(">I", len(head)) + head + struct.pack(">Q", 8) + bytes(8))
    assert closed_by_peer(sock)
    # a header length of 4 GiB
    sock = connect(target, SECRET)
    sock.sendall(struct.pack(">I", 0xFFFFFFFF) + b"{")
    assert closed_by_peer(sock)
    # garbage bytes, no handshake
    sock = socket.create_connection(target)
    sock.sendall(b"\x00\x00\x00\x05hello" + bytes(range(256)) * 8)
    assert closed_by_peer(sock)
    # the handshake with a wrong secret
    with pytest.raises(ConnectionError):
        connect(target, b"wrong secret, 32 bytes long....!")

    want = {"malformed": 1, "oversized": 1, "unauthenticated": 2, "too_many_connections": 0}
    deadline = time.monotonic() + 60  # the worker's stats reach the router every 0.2 s
    while rejected(server, decode["id"]) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rejected(server, decode["id"]) == want

    body = complete(server)  # the same decode worker serves the next hand-off
    assert body["usage"]["completion_tokens"] == 6
    h = health(server)
    assert h["status"] == "ok" and h["worker_deaths"] == 0 and h["worker_restarts"] == 0, h
    now = {w["role"]: w for w in server.layout()["workers"]}
    assert now["decode"]["pid"] == decode["pid"] and now["decode"]["restarts"] == 0

    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    counts = {
        s.labels["reason"]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == "phaselens:kv_handoff_rejected_connections"
        for s in f.samples
        if s.labels.get("engine") == decode["id"] and s.name.endswith("_total")
    }
    assert counts == {k: float(v) for k, v in want.items()}


class Flood:
    """Keeps every free connection slot of the receiver at ``target`` (64) open in its handshake
    (the receiver closes each after its 5 s handshake timeout; the flood opens another)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target, self.held, self.refused = target, [], 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.held[:] = [s for s in self.held if s.fileno() >= 0]
            s = socket.create_connection(self.target)
            s.settimeout(30)
            if s.recv(len(MAGIC), socket.MSG_WAITALL) == MAGIC:
                self.held.append(s)
                threading.Thread(target=self._hold, args=(s,), daemon=True).start()
            else:  # refused: the limit is reached
                self.refused += 1
                s.close()
                time.sleep(0.05)

    @staticmethod
    def _hold(sock: socket.socket) -> None:
        drain(sock)
        sock.close()

    def __enter__(self) -> Flood:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.refused and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self.refused:
            self.__exit__()
            pytest.fail(f"the receiver refused no connection with {len(self.held)} held")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)
        for s in self.held:
            s.close()


def post(server: Server, prompt: str) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/completions",
        json={"prompt": prompt, "max_tokens": 4, "ignore_eos": True},
        timeout=120,
    )


def test_a_flood_of_connections_fails_new_hand_off_connections_visibly_not_established_ones() -> None:
    """While 64 connections are held open on the decode worker's port, the prefill worker's first
    connection is refused: that request fails with the hand-off error (it does not hang). Once the
    flood is over, hand-offs pass; the connection they use then keeps working through a new flood."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SECRET_ENV, SECRET.hex())
        server = start_server("--mode", "disaggregated", "--prefill-workers", "1", "--decode-workers", "1")
    try:
        decode = next(w for w in server.layout()["workers"] if w["role"] == "decode")
        target = ("127.0.0.1", kv_port(decode["pid"]))
        with Flood(target):
            r = post(server, "blocked")
        assert r.status_code == 500 and "KV hand-off to 127.0.0.1" in r.json()["error"]["message"], r.text
        assert rejected(server, decode["id"])["too_many_connections"] >= 1
        deadline = time.monotonic() + 60  # once the receiver has seen the held connections close
        while (r := post(server, "free")).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
        with Flood(target):  # the prefill worker's connection is established: it is not refused
            r = post(server, "through")
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
        h = health(server)
        assert h["worker_deaths"] == 0 and h["worker_restarts"] == 0, h
    finally:
        stop_server(server)


@pytest.mark.parametrize(
    ("value", "needle"),
    [("zz", "must be hexadecimal"), ("abcd", "must be at least 16 bytes (32 hex digits)")],
)
def test_a_malformed_secret_in_the_environment_is_a_one_line_start_error(value: str, needle: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "serving.cli", "serve", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, SECRET_ENV: value},
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"phaselens serve: error: {SECRET_ENV} {needle}"), lines
