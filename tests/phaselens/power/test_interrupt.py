"""A sweep killed mid-way (a real `phaselens calibrate` process, SIGTERM or SIGINT while a power
limit is set) restores the defaults before it exits, says so, and audits it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collector.store import Store
from serving.testing import Server

from .conftest import TOKEN, at_defaults, knobs, reset_knobs


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_sweep_killed_mid_way_restores_the_defaults(
    stack: Server, tmp_path: Path, sig: signal.Signals
) -> None:
    reset_knobs(stack)
    db = tmp_path / "s.duckdb"
    cmd = [sys.executable, "-m", "phaselens", "calibrate", "--url", stack.url, "--token", TOKEN, "--execute"]
    cmd += ["--roles", "decode", "--knobs", "power_limit", "--power-limits", "450,300,200", "--point-s", "3"]
    cmd += ["--settle-s", "0.2", "--rate", "3", "--db", str(db)]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if not at_defaults(knobs(stack, "worker-1")):  # the sweep has set a power limit: kill it now
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[0]
        assert knobs(stack, "worker-1")["power_limit_w"] == 450.0
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, out
    assert f"interrupted by signal {sig.name}" in out and "knobs restored" in out
    assert at_defaults(knobs(stack, "worker-1"))
    with Store.open(db) as store:
        act = store.query("SELECT status, message FROM actions WHERE action = 'calibrate'").to_dict("records")
        cal = store.query("SELECT status FROM power_calibrations").to_dict("records")
    assert act == [{"status": "rolled_back", "message": f"interrupted by signal {sig.name}"}]
    assert [c["status"] for c in cal] == ["incomplete"]  # the reference it measured is kept, never used


def test_an_error_mid_sweep_restores_the_defaults(stack: Server) -> None:
    from phaselens.apply.stack import StackClient
    from phaselens.power.live import LiveSweep
    from phaselens.power.load import LoadSpec
    from phaselens.power.plan import Bounds, plan_sweep

    reset_knobs(stack)

    def note(text: str) -> None:  # the caller's own code fails after the first capped point
        if "cap 450 W" in text:
            raise RuntimeError("the terminal went away")

    with StackClient(stack.url, TOKEN) as client:
        b = Bounds.from_knobs(client.device_knobs("worker-1"), where="worker-1")
        plan = plan_sweep(
            {"decode": [("worker-1", b)]},
            knobs=["power_limit"],
            power_limits_w=[450, 300],
            point_s=1,
            settle_s=0.1,
        )
        sweep = LiveSweep(
            client, plan, LoadSpec(rate_rps=3.0, prompt_tokens=(32, 64), output_tokens=(8, 16)), on_note=note
        )
        with pytest.raises(RuntimeError, match="went away"):
            sweep.run()
    assert sweep.restored is not None and sweep.restored["restored"] is True
    assert at_defaults(knobs(stack, "worker-1"))
    assert [p["setting"]["label"] for p in sweep.results["decode"]["points"]] == ["default", "cap 450 W"]
