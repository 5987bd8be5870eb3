"""`phaselens export ID --format nvidia-smi`: a power recommendation as a script per node and role,
run here against a stand-in `nvidia-smi` (no GPU on this machine) that records its calls: apply resets
then sets the role's knob on each GPU, restore puts the defaults back, a GPU of another model is not
touched, and a layout recommendation is refused."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from analytics.prices import load_prices
from analytics.recommend.records import save_recommendation
from collector.store import Store
from phaselens.apply.testing import recommendation_row
from phaselens.cli import main
from phaselens.power.choose import choose_modes
from phaselens.power.fingerprint import Fingerprint
from phaselens.power.load import LoadSpec
from phaselens.power.plan import plan_sweep
from phaselens.power.records import calibration_row, power_recommendation
from phaselens.power.simulate import sim_bounds, simulate_sweep

LAYOUT = "1p1d:h200:gpu_memory_utilization=0.96"

FAKE = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
case "$*" in
  *--query-gpu=index*) printf '0\\n1\\n' ;;
  *--query-gpu=name*) echo "${GPU_NAME:-NVIDIA H200}" ;;
  *--query-gpu=power.default_limit*) echo 700.00 ;;
esac
"""


@pytest.fixture(scope="module")
def rec_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    roles, _ = sim_bounds(LAYOUT, "llama-3.1-70b")
    rows = {}
    for role in ("prefill", "decode"):
        plan = plan_sweep(
            {role: roles[role]}, knobs=["sm_clock"], sm_clocks_mhz=[1440, 885], point_s=20, settle_s=0
        )
        points = simulate_sweep(LAYOUT, "llama-3.1-70b", plan, LoadSpec(rate_rps=3.0))[role]["points"]
        fp = Fingerprint("NVIDIA H200 (simulated)", "simulated", "llama-3.1-70b", "bfloat16", 1, "x")
        rows[role] = calibration_row(
            node="t",
            source="simulated",
            target="sim:x",
            fingerprint=fp,
            role=role,
            phase=role,
            result={"points": points, "complete": True, "workers": [f"{role}-pool"]},
            analysis=choose_modes(points, role),
            duration_s=1.0,
            trust=["simulated"],
            details={},
        )
    rec = power_recommendation(
        node="t", target="fleet:prod", rows=rows, mode="eff", before={}, prices=load_prices()
    )
    db = tmp_path_factory.mktemp("smi") / "s.duckdb"
    with Store.open(db) as store:
        save_recommendation(store, rec)
        save_recommendation(store, recommendation_row("http://x", "agg:2xh200", "1p1d:h200"))
    return db, rec


def _run(script: Path, tmp: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_ = tmp / "bin"
    bin_.mkdir(exist_ok=True)
    fake = bin_ / "nvidia-smi"
    fake.write_text(FAKE)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    calls = tmp / "calls.txt"
    calls.write_text("")
    full = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "CALLS": str(calls), **env}
    proc = subprocess.run(["bash", str(script)], env=full, capture_output=True, text=True, timeout=30)
    return proc, calls.read_text().splitlines()


@pytest.mark.skipif(os.geteuid() != 0, reason="the script refuses to run without root, as it should")
def test_the_script_applies_each_roles_knob_and_restores(rec_db: tuple[Path, dict], tmp_path: Path) -> None:
    db, rec = rec_db
    script = tmp_path / "power.sh"
    assert (
        main(
            [
                "export",
                rec["recommendation_id"],
                "--format",
                "nvidia-smi",
                "--db",
                str(db),
                "--out",
                str(script),
            ]
        )
        == 0
    )
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    decode = rec["proposed"]["settings"]["decode"]["setting"]
    proc, calls = _run(script, tmp_path, ROLE="decode")
    assert proc.returncode == 0, proc.stderr
    knob = (
        f"-lgc {decode['sm_clock_min_mhz']},{decode['sm_clock_max_mhz']}"
        if decode["knob"] == "sm_clock"
        else None
    )
    for gpu in ("0", "1"):  # on every GPU: clocks unlocked and the default limit first, then the knob
        mine = [
            c.removeprefix(f"-i {gpu} ") for c in calls if c.startswith(f"-i {gpu} ") and "--query" not in c
        ]
        assert mine == ["-rgc", "-pl 700.00", *([knob] if knob else [])]
    proc, calls = _run(script, tmp_path, ROLE="decode", ACTION="restore", GPUS="1")
    assert proc.returncode == 0 and "-i 1 -rgc" in calls and not any("-lgc" in c for c in calls)
    proc, calls = _run(script, tmp_path, ROLE="decode", GPU_NAME="NVIDIA H100 80GB HBM3")
    assert proc.returncode == 2 and "calibrated on NVIDIA H200" in proc.stderr
    assert not any("-lgc" in c or "-rgc" in c for c in calls)
    proc, _ = _run(script, tmp_path, ROLE="router")
    assert proc.returncode == 2 and "unknown ROLE router" in proc.stderr


def test_a_layout_recommendation_is_not_a_power_script(
    rec_db: tuple[Path, dict], capsys: pytest.CaptureFixture[str]
) -> None:
    db, _ = rec_db
    with Store.open(db) as store:
        layout_id = store.query("SELECT recommendation_id FROM recommendations WHERE kind = 'layout'").iat[
            0, 0
        ]
    assert main(["export", layout_id, "--format", "nvidia-smi", "--db", str(db)]) == 2
    assert "of kind 'layout'; --format nvidia-smi exports power ones" in capsys.readouterr().err
