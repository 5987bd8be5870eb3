"""A real emulated stack (``phaselens serve``, 2 mixed workers on emulated H200s modeling 70B, the
control token of serving.testing), a load running against it, and store files holding
recommendation rows per the issue-22 contract (test input)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from collector.store import Store
from phaselens.apply.testing import recommendation_row
from serving.loadgen import run_load
from serving.sim.live_compare import serve_args_emulated
from serving.testing import TOKEN, Server, start_server, stop_server
from serving.trace import poisson_trace

__all__ = ["TOKEN", "background_load", "reset_layout", "roles", "write_recs"]


@pytest.fixture(scope="package")  # one stack for the directory; each test resets its layout
def stack() -> Iterator[Server]:
    server = start_server(*serve_args_emulated(2))
    yield server
    stop_server(server)


def roles(server: Server) -> list[str]:
    """The workers' roles, sorted."""
    return sorted(w["role"] for w in server.layout()["workers"])


def reset_layout(server: Server) -> None:
    """Back to 2 mixed workers (what the fixture started), whatever a test left."""
    with server.control() as c:
        workers = c.get("/control/layout").json()["workers"]
        mixed = [w for w in workers if w["role"] == "mixed"]
        if not mixed:
            c.post("/control/workers", json={"role": "mixed"}).raise_for_status()
        for w in workers:
            if w["role"] != "mixed":
                c.post(f"/control/workers/{w['id']}/role", json={"role": "mixed"}).raise_for_status()
        workers = c.get("/control/layout").json()["workers"]
        for w in workers[2:]:
            c.delete(f"/control/workers/{w['id']}").raise_for_status()
        for _ in range(2 - len(workers)):
            c.post("/control/workers", json={"role": "mixed"}).raise_for_status()


def write_recs(db: Path, rows: list[dict[str, Any]]) -> None:
    """Store ``rows`` in ``recommendations`` of the store file ``db`` (created if absent), then close it."""
    store = Store.open(db)
    try:
        store.append("recommendations", rows)
        store.flush()
    finally:
        store.close()


@contextmanager
def background_load(url: str, rate: float = 4.0, output_tokens: int = 16) -> Iterator[None]:
    """Poisson requests (short prompts, ``output_tokens`` each) against ``url`` until the block ends."""
    stop = threading.Event()

    def loop() -> None:
        seed = 0
        while not stop.is_set():
            seed += 1
            trace = poisson_trace(rate, 8, prompt_tokens=(32, 128), output_tokens=output_tokens, seed=seed)
            run_load(url, trace, progress=False)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(timeout=60)


@pytest.fixture
def rec() -> Any:
    return recommendation_row
