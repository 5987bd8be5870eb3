"""Run the real serving stack for tests and benches: ``phaselens serve`` in a subprocess on a free
port (``start_server`` / ``stop_server``). tests/serving/conftest.py builds its fixtures on these and
bench/*.py start their live stacks with them, so neither imports the other."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass

import httpx

from serving.cli import wait_ready

TOKEN = "test-token"  # the control token every server started here uses


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A running ``phaselens serve``: its base URL and process."""

    url: str
    proc: subprocess.Popen

    def control(self) -> httpx.Client:
        """A client for the control API, authorised with :data:`TOKEN`."""
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)

    def layout(self) -> dict:
        """``GET /control/layout``."""
        with self.control() as c:
            return c.get("/control/layout").json()


def start_server(*args: str) -> Server:
    """Start ``phaselens serve`` (1 thread per worker, a 32 MB KV cache, then ``args``) on a free port
    and wait until it is ready (up to 180 s; killed if it is not)."""
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
    """Stop ``server`` with SIGINT (its graceful shutdown), killed after 30 s."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGINT)
        try:
            server.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
