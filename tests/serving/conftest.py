"""Fixtures that run the real serving stack: `phaselens serve` in a subprocess on a free port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from serving.cli import wait_ready

TOKEN = "test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    proc: subprocess.Popen

    def control(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)

    def layout(self) -> dict:
        with self.control() as c:
            return c.get("/control/layout").json()


def start_server(*args: str) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "serving.cli", "serve", "--port", str(port), "--control-token", TOKEN]
    cmd += ["--threads-per-worker", "1", "--kv-cache-mb", "32", *args]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, timeout_s=180)
    except Exception:
        proc.kill()
        raise
    return Server(url, proc)


def stop_server(server: Server) -> None:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGINT)
        try:
            server.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


@pytest.fixture(scope="module")
def aggregated_server() -> Iterator[Server]:
    server = start_server("--mode", "aggregated", "--workers", "2", "--max-model-len", "512")
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def disaggregated_server() -> Iterator[Server]:
    server = start_server("--mode", "disaggregated", "--prefill-workers", "1", "--decode-workers", "1")
    yield server
    stop_server(server)
