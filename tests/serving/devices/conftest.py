"""Named NVML scenarios (fake ``pynvml`` modules) for the device tests."""

from __future__ import annotations

import pytest

from serving.devices import nvml as nvml_module

from .fake_nvml import NVML_ERROR_NO_PERMISSION, FakeGpu, FakeNvml

LOST_AFTER_CALLS = 30  # GPU 1 of gpu_lost_mid_run falls off the bus after this many NVML calls


@pytest.fixture
def h100_gpm() -> FakeNvml:
    """One H100: GPM supported, every metric and knob works."""
    return FakeNvml([FakeGpu()])


@pytest.fixture
def gpm_unsupported() -> FakeNvml:
    """One A100-like GPU: no GPM, and the energy counter and temperature are NotSupported."""
    gpu = FakeGpu(
        name="NVIDIA A100-SXM4-80GB",
        gpm_supported=False,
        unsupported={"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTemperature"},
        min_limit_mw=100_000,
        max_limit_mw=400_000,
        default_limit_mw=400_000,
        limit_mw=400_000,
    )
    return FakeNvml([gpu])


@pytest.fixture
def gpu_lost_mid_run() -> FakeNvml:
    """Two H100s; GPU 1 raises GPU_IS_LOST after LOST_AFTER_CALLS calls."""
    return FakeNvml([FakeGpu(), FakeGpu(uuid="GPU-lost", lost_after_calls=LOST_AFTER_CALLS)])


@pytest.fixture
def no_permission() -> FakeNvml:
    """One H100 whose setters are refused (not running as root)."""
    setters = (
        "nvmlDeviceSetPowerManagementLimit",
        "nvmlDeviceSetGpuLockedClocks",
        "nvmlDeviceResetGpuLockedClocks",
    )
    return FakeNvml([FakeGpu(errors=dict.fromkeys(setters, NVML_ERROR_NO_PERMISSION))])


@pytest.fixture
def use_default_nvml(monkeypatch: pytest.MonkeyPatch):
    """Make ``fake`` the module that ``serving.devices.nvml`` imports as pynvml."""

    def install(fake: FakeNvml) -> FakeNvml:
        monkeypatch.setattr(nvml_module, "_import_pynvml", lambda: fake)
        return fake

    return install
