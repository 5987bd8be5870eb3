"""NvmlDevice over scripted fake NVML modules (no GPU needed)."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from serving.devices import (
    DeviceError,
    DeviceLostError,
    DeviceNotFoundError,
    DeviceNotSupportedError,
    DevicePermissionError,
    DeviceSample,
    DeviceValueError,
    NvmlDevice,
    PowerLimitConstraints,
    nvml_available,
    nvml_device_count,
)

from .fake_nvml import (
    ANY_TENSOR_UTIL,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_UNKNOWN,
    FakeGpu,
    FakeNvml,
    LegacyFakeNvml,
    NVMLError,
)

IDENTITY = {"ts_s", "device", "kind", "index", "name", "uuid", "emulated", "lost"}
METRICS = [f.name for f in fields(DeviceSample) if f.name not in IDENTITY]
GPM = ["sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_active_pct"]


def test_snapshot_reads_every_metric_in_project_units(h100_gpm: FakeNvml) -> None:
    with NvmlDevice(0, nvml=h100_gpm) as dev:
        s = dev.snapshot()
    assert (s.device, s.kind, s.index, s.emulated, s.lost) == ("cuda:0", "cuda", 0, False, False)
    assert s.name == "NVIDIA H100 80GB HBM3"
    assert s.uuid == "GPU-11111111-2222-3333-4444-555555555555"  # bytes decoded
    assert s.power_w == pytest.approx(412.345)  # 412_345 mW
    assert s.power_limit_w == pytest.approx(700.0)
    assert s.energy_mj == 9_000_000
    assert (s.gpu_util_pct, s.mem_util_pct) == (87, 41)
    assert (s.sm_clock_mhz, s.mem_clock_mhz, s.temperature_c) == (1980, 2619, 54)
    assert (s.mem_used_bytes, s.mem_total_bytes) == (61 * 2**30, 80 * 2**30)
    assert s.clock_event_reasons == 0x4
    assert dev.torch_device == "cuda:0" and not dev.is_emulated


def test_gpm_metrics_are_none_first_then_numeric_between_samples(h100_gpm: FakeNvml) -> None:
    dev = NvmlDevice(0, nvml=h100_gpm)
    first, second, third = dev.snapshot(), dev.snapshot(), dev.snapshot()
    assert all(getattr(first, name) is None for name in GPM)
    expected = {
        "sm_active_pct": 23.5,
        "sm_occupancy_pct": 11.25,
        "tensor_active_pct": 7.0,
        "dram_active_pct": 64.0,
    }
    # The fake rejects sample pairs out of order, so the third snapshot checks the buffer swap too.
    for s in (second, third):
        assert {name: getattr(s, name) for name in GPM} == expected
    assert h100_gpm.gpus[0].called("nvmlGpmQueryDeviceSupport") == 1  # cached per device
    dev.close()
    assert h100_gpm.live_gpm_samples == 0 and h100_gpm.init_refs == 0


def test_one_unsupported_gpm_metric_is_none_others_numeric(h100_gpm: FakeNvml) -> None:
    del h100_gpm.gpus[0].gpm_pct[ANY_TENSOR_UTIL]
    dev = NvmlDevice(0, nvml=h100_gpm)
    dev.snapshot()
    s = dev.snapshot()
    assert s.tensor_active_pct is None
    assert s.sm_active_pct == 23.5


def test_unsupported_metrics_are_none_not_errors(gpm_unsupported: FakeNvml) -> None:
    dev = NvmlDevice(0, nvml=gpm_unsupported)
    samples = [dev.snapshot(), dev.snapshot()]
    for s in samples:
        assert s.energy_mj is None and s.temperature_c is None
        assert all(getattr(s, name) is None for name in GPM)
        assert s.power_w == pytest.approx(412.345)
        assert not any(isinstance(getattr(s, name), str) for name in METRICS)
    gpu = gpm_unsupported.gpus[0]
    assert gpu.called("nvmlGpmSampleGet") == 0 and gpm_unsupported.live_gpm_samples == 0


def test_lost_gpu_gives_lost_samples_and_the_other_gpu_keeps_sampling(gpu_lost_mid_run: FakeNvml) -> None:
    healthy, failing = NvmlDevice(0, nvml=gpu_lost_mid_run), NvmlDevice(1, nvml=gpu_lost_mid_run)
    samples = [failing.snapshot() for _ in range(10)]
    assert not samples[0].lost and samples[0].power_w is not None
    lost = [s for s in samples if s.lost]
    assert lost, "GPU 1 should have been reported lost"
    assert all(getattr(s, name) is None for s in lost for name in METRICS)
    assert lost[0].uuid == "GPU-lost" and lost[0].device == "cuda:1"
    calls_when_lost = len(gpu_lost_mid_run.gpus[1].calls)
    assert failing.snapshot().lost and failing.lost
    assert len(gpu_lost_mid_run.gpus[1].calls) == calls_when_lost  # NVML not called again
    with pytest.raises(DeviceLostError, match="cuda:1"):
        failing.set_power_limit_w(300)
    ok = healthy.snapshot()
    assert not ok.lost and ok.power_w == pytest.approx(412.345)


def test_setting_knobs_without_root_is_a_clear_permission_error(no_permission: FakeNvml) -> None:
    dev = NvmlDevice(0, nvml=no_permission)
    with pytest.raises(DevicePermissionError, match=r"cuda:0.*needs root") as info:
        dev.set_power_limit_w(500)
    assert isinstance(info.value.__cause__, NVMLError)
    assert no_permission.gpus[0].limit_mw == 700_000
    with pytest.raises(DevicePermissionError, match="needs root"):
        dev.set_sm_clock_range_mhz(900, 1500)
    assert dev.sm_clock_range_mhz() is None  # a refused lock is not tracked


@pytest.mark.parametrize("limit_w", [900, 199.9, float("nan")])
def test_out_of_bounds_power_limit_names_the_range_and_never_calls_nvml(
    h100_gpm: FakeNvml, limit_w: float
) -> None:
    dev = NvmlDevice(0, nvml=h100_gpm)
    with pytest.raises(DeviceValueError, match=r"power limit .* W is outside \[200, 700\] W"):
        dev.set_power_limit_w(limit_w)
    assert h100_gpm.gpus[0].called("nvmlDeviceSetPowerManagementLimit") == 0


def test_power_limit_set_read_and_reset_in_watts(gpm_unsupported: FakeNvml) -> None:
    dev = NvmlDevice(0, nvml=gpm_unsupported)
    assert dev.power_limit_constraints_w() == PowerLimitConstraints(min_w=100.0, max_w=400.0, default_w=400.0)
    dev.set_power_limit_w(250.5)
    assert gpm_unsupported.gpus[0].limit_mw == 250_500  # W -> mW
    assert dev.power_limit_w() == pytest.approx(250.5)
    assert dev.snapshot().power_limit_w == pytest.approx(250.5)
    dev.reset_power_limit()
    assert gpm_unsupported.gpus[0].limit_mw == 400_000


def test_sm_clock_lock_is_validated_tracked_and_reset(h100_gpm: FakeNvml) -> None:
    dev, gpu = NvmlDevice(0, nvml=h100_gpm), h100_gpm.gpus[0]
    clocks = dev.supported_sm_clocks_mhz()
    assert clocks == sorted(clocks) and (clocks[0], clocks[-1]) == (345, 1980)
    with pytest.raises(DeviceValueError, match=r"SM clock 300 MHz is outside \[345, 1980\] MHz"):
        dev.set_sm_clock_range_mhz(300, 1500)
    with pytest.raises(DeviceValueError, match="min > max"):
        dev.set_sm_clock_range_mhz(1500, 900)
    assert gpu.called("nvmlDeviceSetGpuLockedClocks") == 0
    dev.set_sm_clock_range_mhz(900, 1500)
    assert gpu.locked_clocks_mhz == (900, 1500) and dev.sm_clock_range_mhz() == (900, 1500)
    s = dev.snapshot()
    assert (s.locked_sm_clock_min_mhz, s.locked_sm_clock_max_mhz) == (900, 1500)
    dev.reset_sm_clocks()
    assert gpu.locked_clocks_mhz is None and dev.sm_clock_range_mhz() is None


def test_knobs_is_json_and_unsupported_knobs_read_as_none(h100_gpm: FakeNvml) -> None:
    gpu = h100_gpm.gpus[0]
    knobs = NvmlDevice(0, nvml=h100_gpm).knobs()
    json.dumps(knobs)
    assert knobs["power_limit_min_w"] == 200.0 and knobs["supported_sm_clock_max_mhz"] == 1980
    assert knobs["driver_version"] == "570.133.20" and knobs["supported_sm_clocks_mhz"][-1] == 1980
    assert knobs["gpu_name"] == NvmlDevice(0, nvml=h100_gpm).snapshot().name
    gpu.unsupported |= {"nvmlDeviceGetPowerManagementLimitConstraints", "nvmlDeviceGetPowerManagementLimit"}
    knobs = NvmlDevice(0, nvml=h100_gpm).knobs()
    assert knobs["power_limit_w"] is None and knobs["power_limit_max_w"] is None
    with pytest.raises(DeviceNotSupportedError, match="cuda:0"):
        NvmlDevice(0, nvml=h100_gpm).set_power_limit_w(300)


def test_other_nvml_errors_become_device_error(h100_gpm: FakeNvml) -> None:
    h100_gpm.gpus[0].errors["nvmlDeviceGetPowerUsage"] = NVML_ERROR_UNKNOWN
    with pytest.raises(DeviceError, match="Unknown Error") as info:
        NvmlDevice(0, nvml=h100_gpm).snapshot()
    assert type(info.value) is DeviceError


def test_legacy_bindings_fall_back_to_throttle_reasons() -> None:
    fake = LegacyFakeNvml([FakeGpu(clock_event_reasons=0x20)])
    assert NvmlDevice(0, nvml=fake).snapshot().clock_event_reasons == 0x20
    assert fake.gpus[0].called("nvmlDeviceGetCurrentClocksThrottleReasons") == 1


def test_missing_index_is_not_found_and_releases_nvml(h100_gpm: FakeNvml) -> None:
    with pytest.raises(DeviceNotFoundError, match=r"cuda:3 not found: NVML sees 1 GPU"):
        NvmlDevice(3, nvml=h100_gpm)
    assert h100_gpm.init_refs == 0


def test_close_is_idempotent(h100_gpm: FakeNvml) -> None:
    dev = NvmlDevice(0, nvml=h100_gpm)
    dev.snapshot()
    dev.close()
    dev.close()
    assert h100_gpm.init_refs == 0 and h100_gpm.live_gpm_samples == 0


def test_availability_is_cached_and_never_raises(gpu_lost_mid_run: FakeNvml) -> None:
    assert nvml_available(gpu_lost_mid_run) and nvml_device_count(gpu_lost_mid_run) == 2
    assert gpu_lost_mid_run.inits == 1 and gpu_lost_mid_run.init_refs == 0
    no_driver = FakeNvml([], init_error=NVML_ERROR_DRIVER_NOT_LOADED)
    assert nvml_available(no_driver) is False and nvml_device_count(no_driver) == 0
    with pytest.raises(DeviceNotFoundError, match="no NVIDIA driver"):
        NvmlDevice(0, nvml=no_driver)


def test_real_pynvml_path_imports_without_a_gpu() -> None:
    pytest.importorskip("pynvml")
    available = nvml_available()
    assert isinstance(available, bool)
    if not available:
        with pytest.raises(DeviceError):  # translated, never a raw NVMLError
            NvmlDevice(0)
