"""The KV hand-off channel over real sockets: the handshake, frame checks, and what a refusal costs.

A receiver and senders in this process talk over 127.0.0.1 as two workers would; bad peers are raw
sockets sending what a local user could send to the port.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
import torch

from serving.kv_transfer import (
    MAGIC,
    NONCE_BYTES,
    SECRET_ENV,
    KVLayout,
    KVReceiver,
    KVSender,
    connect,
    encode,
    stack_secret,
)

SECRET = bytes(range(32))
LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=4, max_tokens=64, vocab_size=100)


def _kv(tokens: int = 3) -> torch.Tensor:
    return torch.arange(2 * 2 * tokens * 2 * 4, dtype=torch.float32).reshape(2, 2, tokens, 2, 4)


def _header(**changes: object) -> dict:
    header = {
        "request_id": "cmpl-1",
        "token_ids": [1, 2, 3, 4],
        "num_prompt_tokens": 3,
        "params": {"max_tokens": 4},
        "from_worker": "worker-0",
        "meta": {},
        "sent_s": 1.0,
    }
    for k, v in changes.items():
        if v is ...:
            del header[k]
        else:
            header[k] = v
    return header


class Rejections:
    """What the receiver's on_reject hook heard, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str | None, bool]] = []
        self.event = threading.Event()

    def __call__(self, reason: str, message: str, request_id: str | None, authenticated: bool) -> None:
        self.calls.append((reason, message, request_id, authenticated))
        self.event.set()

    def wait(self, n: int) -> list[tuple[str, str, str | None, bool]]:
        deadline = time.monotonic() + 30
        while len(self.calls) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.calls) >= n, self.calls
        return self.calls


@pytest.fixture
def receiver() -> Iterator[tuple[KVReceiver, Rejections]]:
    heard = Rejections()
    r = KVReceiver(SECRET, LAYOUT, on_reject=heard, handshake_timeout_s=2.0)
    yield r, heard
    r.close()


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the peer closed the connection (everything it sent before is read and dropped)."""
    sock.settimeout(30)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def _send_frame(receiver: KVReceiver, head: bytes, payload: bytes = b"") -> socket.socket:
    sock = connect((receiver.host, receiver.port), SECRET)
    sock.sendall(head + payload)
    return sock


def test_a_hand_off_between_peers_holding_the_secret_arrives_whole(receiver) -> None:
    r, heard = receiver
    done = []
    sender = KVSender(SECRET, lambda h, n, t, err: done.append((h["request_id"], n, err)))
    kv = _kv()
    sender.send((r.host, r.port), _header(), kv)
    sender.send((r.host, r.port), _header(request_id="cmpl-2"), kv)  # same connection
    got = [r.inbox.get(timeout=30), r.inbox.get(timeout=30)]
    sender.close()
    assert [g.header["request_id"] for g in got] == ["cmpl-1", "cmpl-2"]
    assert torch.equal(got[0].kv, kv) and got[0].nbytes == kv.numel() * 4
    assert done == [("cmpl-1", kv.numel() * 4, None), ("cmpl-2", kv.numel() * 4, None)]
    assert r.rejected_total() == 0 and heard.calls == []


def test_a_sender_with_another_secret_is_refused_and_sends_nothing(receiver) -> None:
    r, heard = receiver
    done = []
    sender = KVSender(b"x" * 32, lambda h, n, t, err: done.append(err))
    sender.send((r.host, r.port), _header(), _kv())
    deadline = time.monotonic() + 30
    while not done and time.monotonic() < deadline:
        time.sleep(0.01)
    sender.close()
    assert done and "failed" in done[0]  # the request fails on the sender's side, visibly
    assert heard.wait(1)[0][0] == "unauthenticated" and not heard.calls[0][3]
    assert r.rejected["unauthenticated"] == 1 and r.inbox.empty()


@pytest.mark.parametrize(
    ("greeting", "says"),
    [
        (MAGIC + bytes(NONCE_BYTES), "does not hold this stack's secret"),
        (b"HTTP/1.1 200 OK\r\n" * 4, "bad greeting"),
    ],
    ids=["impostor", "other-service"],
)
def test_a_sender_sends_no_kv_to_a_port_without_the_secret(greeting: bytes, says: str) -> None:
    """A process that took over a worker's port (it cannot prove the secret) gets no KV."""
    server = socket.create_server(("127.0.0.1", 0))
    received = bytearray()

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(greeting)
            conn.settimeout(5)
            try:
                received.extend(conn.recv(2 * NONCE_BYTES, socket.MSG_WAITALL))
                conn.sendall(bytes(32))  # a made-up proof
                while chunk := conn.recv(65536):
                    received.extend(chunk)
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pytest.raises(ConnectionError, match=says):
            connect(server.getsockname()[:2], SECRET)
        t.join(30)
    finally:
        server.close()
    assert len(received) <= 2 * NONCE_BYTES  # the sender's nonce and proof at most, never a frame


def test_garbage_bytes_close_that_connection_only(receiver) -> None:
    r, heard = receiver
    idle = connect((r.host, r.port), SECRET)  # an authenticated peer, before and after
    bad = socket.create_connection((r.host, r.port))
    bad.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)) * 4)
    assert closed_by_peer(bad)
    reason, message, rid, authenticated = heard.wait(1)[0]
    assert (reason, rid, authenticated) == ("unauthenticated", None, False) and "secret" in message
    head, payload = encode(_header(), _kv())
    idle.sendall(head + bytes(payload))
    assert r.inbox.get(timeout=30).header["request_id"] == "cmpl-1"
    idle.close()


def test_a_peer_that_never_finishes_the_handshake_is_closed(receiver) -> None:
    r, heard = receiver
    sock = socket.create_connection((r.host, r.port))
    assert sock.recv(len(MAGIC) + NONCE_BYTES, socket.MSG_WAITALL)[: len(MAGIC)] == MAGIC
    assert closed_by_peer(sock)  # after handshake_timeout_s
    assert heard.wait(1)[0][0] == "unauthenticated" and "no handshake" in heard.calls[0][1]


def _raw_header(header: object) -> bytes:
    head = json.dumps(header).encode()
    return struct.pack(">I", len(head)) + head


@pytest.mark.parametrize(
    ("head", "reason", "rid", "says"),
    [
        (
            _raw_header(_header(request_id=...)) + struct.pack(">Q", 0),
            "malformed",
            None,
            "lacks 'request_id'",
        ),
        (_raw_header(_header(token_ids="1,2")), "malformed", "cmpl-1", "'token_ids' is a str"),
        (_raw_header(_header(token_ids=[1, 2, 300])), "malformed", "cmpl-1", "[0, 100)"),
        (_raw_header(_header(num_prompt_tokens=9)), "malformed", "cmpl-1", "'num_prompt_tokens'"),
        (_raw_header([1, 2]), "malformed", None, "not an object"),
        (struct.pack(">I", 5) + b"{nope", "malformed", None, "not JSON"),
        (struct.pack(">I", 4000) + b"[" * 2000 + b"]" * 2000, "malformed", None, "not JSON"),
        (struct.pack(">I", 0xFFFFFFFF), "oversized", None, "header length 4294967295"),
    ],
    ids=[
        "no-request-id",
        "token-ids-type",
        "token-id-range",
        "prompt-count",
        "array",
        "json",
        "nesting",
        "hlen",
    ],
)
def test_a_bad_frame_closes_its_connection_and_is_counted(receiver, head, reason, rid, says) -> None:
    r, heard = receiver
    sock = _send_frame(r, head)
    assert closed_by_peer(sock)
    got_reason, message, got_rid, authenticated = heard.wait(1)[0]
    assert (got_reason, got_rid, authenticated) == (reason, rid, True)
    assert says in message
    assert r.rejected[reason] == 1 and r.rejected_total() == 1 and r.inbox.empty()


@pytest.mark.parametrize(
    ("changes", "payload_len", "reason", "says"),
    [
        ({"shape": [2, 2, 3, 2, 8]}, None, "malformed", "not this model's"),
        ({"shape": [2, 2, 9, 2, 4]}, None, "malformed", "9 tokens"),
        ({"shape": [2, 2, 4, 2, 4]}, None, "malformed", "must be in [1, 3] (all but the newest"),
        ({"dtype": "torch.int64"}, None, "malformed", "dtype 'torch.int64' not supported"),
        ({}, 2**40, "oversized", "payload length 1099511627776"),
        ({}, 17, "malformed", "payload length 17"),
    ],
    ids=["shape", "tokens", "all-tokens", "dtype", "huge-payload", "short-payload"],
)
def test_a_frame_whose_tensor_does_not_fit_the_model_is_refused(receiver, changes, payload_len, reason, says):
    r, heard = receiver
    head, payload = encode(_header(), _kv())
    header = {**json.loads(head[4:-8]), **changes}
    plen = len(payload) if payload_len is None else payload_len
    sock = _send_frame(r, _raw_header(header) + struct.pack(">Q", plen))
    assert closed_by_peer(sock)
    got = heard.wait(1)[0]
    assert (got[0], got[2], got[3]) == (reason, "cmpl-1", True) and says in got[1]


def test_connections_beyond_the_limit_are_closed_at_once() -> None:
    heard = Rejections()
    r = KVReceiver(SECRET, LAYOUT, on_reject=heard, max_connections=2, handshake_timeout_s=60)
    try:
        held = [socket.create_connection((r.host, r.port)) for _ in range(2)]
        for s in held:  # both are in their handshake
            assert s.recv(len(MAGIC), socket.MSG_WAITALL) == MAGIC
        extra = socket.create_connection((r.host, r.port))
        assert closed_by_peer(extra)
        assert heard.wait(1)[0][0] == "too_many_connections"
        for s in held:
            s.close()
        deadline = time.monotonic() + 30  # the slots free up: a peer gets in again
        while time.monotonic() < deadline:
            try:
                connect((r.host, r.port), SECRET).close()
                break
            except ConnectionError:
                time.sleep(0.05)
        else:
            pytest.fail("no connection admitted after the held ones closed")
    finally:
        r.close()


def test_the_stack_secret_comes_from_the_environment_or_is_random() -> None:
    assert stack_secret({SECRET_ENV: "ab" * 16}) == b"\xab" * 16
    a, b = stack_secret({}), stack_secret({})
    assert len(a) == 32 and a != b
    with pytest.raises(ValueError, match=f"{SECRET_ENV} must be hexadecimal"):
        stack_secret({SECRET_ENV: "not hex"})
    with pytest.raises(ValueError, match="at least 16 bytes"):
        stack_secret({SECRET_ENV: "abcd"})
