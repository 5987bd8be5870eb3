"""`phaselens serve` and `phaselens load` from the command line (the demo: tests/phaselens/test_demo.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.serving.conftest import free_port

pytestmark = pytest.mark.slow


def test_load_against_a_dead_url_fails_cleanly() -> None:
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "serving.cli", "load", "--url", f"http://127.0.0.1:{port}", "--limit", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr


def test_serve_banner_says_devices_are_emulated_what_they_model_and_where_lag_is_counted() -> None:
    from serving.cli import emulation_banner
    from serving.settings import ServeSettings

    banner = emulation_banner(
        ServeSettings(
            mode="disaggregated", devices=["emulated:h100-sxm"], emulate_shape="llama-3.1-8b", port=8000
        )
    )
    assert banner is not None
    assert "EMULATED GPUs, modeled not measured" in banner
    assert "worker-0, worker-1 on emulated:h100-sxm (NVIDIA H100 80GB HBM3) modeling llama-3.1-8b" in banner
    for where in ("/v1/devices", "phaselens:emulation_lag_seconds_total", "lag_s"):
        assert where in banner
    assert emulation_banner(ServeSettings(devices=["cpu"])) is None


def test_serve_emulate_dtype_fp8_is_checked_up_front_and_the_banner_says_unvalidated() -> None:
    """``--emulate-dtype fp8``: the workers' emulated GPUs model fp8 (the spec carries it), the banner
    says the figures are unvalidated, and a device that cannot run it is refused before anything starts."""
    from serving.cli import emulation_banner
    from serving.settings import ConfigError, ServeSettings

    settings = ServeSettings(devices=["emulated:h200"], emulate_shape="llama-3.1-8b", emulate_dtype="fp8")
    settings.validate()
    assert [spec.emulate_dtype for _role, spec in settings.worker_specs()] == ["fp8"]
    banner = emulation_banner(settings)
    assert banner is not None and "modeling llama-3.1-8b (fp8, UNVALIDATED" in banner
    with pytest.raises(
        ConfigError, match=r"emulated:a100-sxm-80gb: .*no FP8 tensor cores; allowed dtype: bf16"
    ):
        ServeSettings(devices=["emulated:a100-sxm-80gb"], emulate_dtype="fp8").validate()
    with pytest.raises(ConfigError, match=r"--emulate-dtype fp8 needs emulated devices"):
        ServeSettings(devices=["cpu"], emulate_dtype="fp8").validate()
    assert "(bf16)" in emulation_banner(ServeSettings(devices=["emulated:h200"]))
