"""Device specs, open_device and the up-front GPU count check."""

from __future__ import annotations

import pytest

from serving.devices import (
    DEVICE_FACTORIES,
    CpuDevice,
    DeviceNotFoundError,
    DeviceSpec,
    DeviceValueError,
    NvmlDevice,
    check_devices_available,
    open_device,
    parse_device_spec,
    register_device_factory,
    registry,
)

from .fake_nvml import NVML_ERROR_LIBRARY_NOT_FOUND, FakeGpu, FakeNvml


@pytest.fixture
def gpus(use_default_nvml, monkeypatch: pytest.MonkeyPatch):
    """Pretend this machine has ``n`` NVML GPUs (0: no driver at all) and no torch-only CUDA."""
    monkeypatch.setattr(registry, "torch_cuda_device_count", lambda: 0)

    def install(n: int) -> FakeNvml:
        if n == 0:
            return use_default_nvml(FakeNvml([], init_error=NVML_ERROR_LIBRARY_NOT_FOUND))
        return use_default_nvml(FakeNvml([FakeGpu(uuid=f"GPU-{i}") for i in range(n)]))

    return install


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("cpu", DeviceSpec("cpu")),
        ("cuda", DeviceSpec("cuda", index=0)),
        ("cuda:3", DeviceSpec("cuda", index=3)),
        (" CUDA:1 ", DeviceSpec("cuda", index=1)),
        ("emulated:h200", DeviceSpec("emulated", gpu="h200")),
        ("emulated:a100-sxm-80gb", DeviceSpec("emulated", gpu="a100-sxm-80gb")),
    ],
)
def test_parse_valid_specs(spec: str, expected: DeviceSpec) -> None:
    parsed = parse_device_spec(spec)
    assert parsed == expected
    assert parse_device_spec(str(parsed)) == parsed


@pytest.mark.parametrize(
    "spec", ["", "gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1:2", "cpu:0", "emulated", "emulated:v100"]
)
def test_parse_bad_specs_name_the_allowed_forms(spec: str) -> None:
    with pytest.raises(DeviceValueError) as info:
        parse_device_spec(spec)
    message = str(info.value)
    assert repr(spec) in message
    assert all(form in message for form in ("'cpu'", "'cuda:N'", "'emulated:<gpu>'", "h100-sxm", "h200"))
    assert isinstance(info.value, ValueError)


def test_open_cpu() -> None:
    dev = open_device("cpu")
    assert isinstance(dev, CpuDevice) and dev.spec == "cpu"


def test_open_cuda_uses_nvml_when_available(gpus) -> None:
    fake = gpus(2)
    dev = open_device("cuda:1")
    assert isinstance(dev, NvmlDevice)
    assert dev.snapshot().uuid == "GPU-1"
    dev.close()
    assert fake.init_refs == 0


def test_open_cuda_beyond_the_gpu_count_is_not_found(gpus) -> None:
    gpus(1)
    with pytest.raises(DeviceNotFoundError, match=r"cuda:1 not found: only 1 GPU found"):
        open_device("cuda:1")


def test_open_cuda_without_any_gpu(gpus) -> None:
    gpus(0)
    with pytest.raises(DeviceNotFoundError, match="no GPU was found"):
        open_device("cuda")


def test_open_cuda_falls_back_to_torch_without_nvml(gpus, monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(0)
    opened: list[int] = []
    monkeypatch.setattr(registry, "torch_cuda_device_count", lambda: 1)
    monkeypatch.setattr(registry, "TorchCudaDevice", lambda index: opened.append(index) or "torch-device")
    assert open_device("cuda:0") == "torch-device" and opened == [0]


def test_emulated_is_a_pluggable_factory(monkeypatch: pytest.MonkeyPatch) -> None:
    assert open_device("emulated:h100-sxm").is_emulated
    monkeypatch.setitem(DEVICE_FACTORIES, "emulated", DEVICE_FACTORIES["emulated"])  # restored after
    seen: list[DeviceSpec] = []
    register_device_factory("emulated", lambda spec, **_: seen.append(spec) or CpuDevice())
    open_device("emulated:h200")
    assert seen == [DeviceSpec("emulated", gpu="h200")]


def test_too_many_cuda_workers_is_one_clear_line(gpus) -> None:
    gpus(1)
    with pytest.raises(DeviceNotFoundError) as info:
        check_devices_available(["cuda:0", "cuda:1", "cuda:2"])
    assert str(info.value) == "3 workers asked for cuda:0..cuda:2 but only 1 GPU found"
    with pytest.raises(
        DeviceNotFoundError, match=r"^2 workers asked for cuda:0, cuda:3 but only 1 GPU found$"
    ):
        check_devices_available(["cuda:0", "cuda:3"])


def test_enough_gpus_passes(gpus) -> None:
    gpus(2)
    check_devices_available(["cuda:0", "cuda:1", "cuda:1", "cpu"])


def test_cpu_and_emulated_need_no_gpu(gpus) -> None:
    gpus(0)
    check_devices_available(["cpu", "emulated:h100-sxm", "emulated:h200"])
    with pytest.raises(DeviceNotFoundError, match="1 worker asked for cuda:0 but no GPU was found"):
        check_devices_available(["cpu", "cuda"])


def test_check_rejects_bad_specs() -> None:
    with pytest.raises(DeviceValueError, match="'tpu:0'"):
        check_devices_available(["cpu", "tpu:0"])
