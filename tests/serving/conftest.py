"""Fixtures that run the real serving stack: `phaselens serve` in a subprocess on a free port
(serving/testing.py starts and stops it; its names are re-exported here for the tests)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from serving.testing import TOKEN, Server, free_port, start_server, stop_server

__all__ = ["TOKEN", "Server", "free_port", "start_server", "stop_server"]


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
