"""Fixtures that run the real collector: `phaselens collect` in a subprocess on a free port
(phaselens/testing.py starts it; its names are re-exported here for the tests)."""

from __future__ import annotations

from phaselens.testing import collect_command, start_collector

__all__ = ["collect_command", "start_collector"]
