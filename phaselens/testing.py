"""Run the real collector for tests and benches: ``phaselens collect`` in a subprocess on a free port
(``start_collector``). tests/collector/conftest.py re-exports these and bench/*.py use them, so
neither imports the other."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from serving.testing import free_port


def collect_command(db: Path, port: int) -> list[str]:
    """`phaselens collect` on `db` and `port`, without this host's NVML GPUs."""
    return [
        sys.executable,
        "-m",
        "phaselens.cli",
        "collect",
        "--db",
        str(db),
        "--port",
        str(port),
        "--no-nvml",
    ]


def start_collector(db: Path, *args: str) -> tuple[subprocess.Popen, str]:
    """Start ``phaselens collect`` on ``db`` (then ``args``) on a free port; its process and URL once
    ``/health`` answers (RuntimeError with its stderr if it exits first, TimeoutError after 120 s: a
    loaded host)."""
    port = free_port()
    cmd = collect_command(db, port)
    proc = subprocess.Popen([*cmd, *args], stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"collector exited: {proc.stderr.read()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise TimeoutError("collector not ready")
