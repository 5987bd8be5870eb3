"""Device specs (``cpu``, ``cuda[:N]``, ``emulated:<gpu>``) and opening a Device from one.

Each kind has a factory in :data:`DEVICE_FACTORIES` (replaceable with :func:`register_device_factory`);
``emulated:<gpu>`` opens the roofline + DVFS model of :mod:`serving.devices.emulated`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from serving.devices.base import Device, DeviceKind
from serving.devices.cpu import CpuDevice
from serving.devices.emulated import EmulatedDevice
from serving.devices.errors import DeviceNotFoundError, DeviceValueError
from serving.devices.nvml import NvmlDevice, nvml_available, nvml_device_count
from serving.devices.torch_cuda import TorchCudaDevice, torch_cuda_device_count

EMULATED_GPUS: tuple[str, ...] = ("h100-sxm", "h200", "a100-sxm-80gb", "b200", "gb200")
_FORMS = f"'cpu', 'cuda', 'cuda:N' or 'emulated:<gpu>' with <gpu> one of {', '.join(EMULATED_GPUS)}"


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """A parsed device spec: ``index`` is set for cuda, ``gpu`` for emulated."""

    kind: DeviceKind
    index: int | None = None
    gpu: str | None = None

    def __str__(self) -> str:
        if self.kind == "cuda":
            return f"cuda:{self.index}"
        if self.kind == "emulated":
            return f"emulated:{self.gpu}"
        return "cpu"


def parse_device_spec(spec: str) -> DeviceSpec:
    """Parse ``cpu``, ``cuda`` (= ``cuda:0``), ``cuda:N`` or ``emulated:<gpu>``.

    Raises :class:`DeviceValueError` naming the accepted forms when ``spec`` is none of them.
    """
    text = spec.strip().lower() if isinstance(spec, str) else ""
    kind, _, arg = text.partition(":")
    if text == "cpu":
        return DeviceSpec("cpu")
    if text == "cuda":
        return DeviceSpec("cuda", index=0)
    if kind == "cuda" and arg.isdigit() and arg.isascii():
        return DeviceSpec("cuda", index=int(arg))
    if kind == "emulated" and arg in EMULATED_GPUS:
        return DeviceSpec("emulated", gpu=arg)
    raise DeviceValueError(f"bad device spec {spec!r}: expected {_FORMS}")


def cuda_device_count() -> int:
    """GPUs usable as ``cuda:N``: NVML's count, else torch's when NVML is unavailable."""
    return nvml_device_count() if nvml_available() else torch_cuda_device_count()


def _open_cpu(spec: DeviceSpec, **_: Any) -> Device:
    return CpuDevice()


def _open_cuda(spec: DeviceSpec, **_: Any) -> Device:
    assert spec.index is not None
    if nvml_available():
        count = nvml_device_count()
        if spec.index < count:
            return NvmlDevice(spec.index)
    else:
        count = torch_cuda_device_count()
        if spec.index < count:
            return TorchCudaDevice(spec.index)
    raise DeviceNotFoundError(f"{spec} not found: {_gpus_found(count)}")


def _open_emulated(spec: DeviceSpec, **options: Any) -> Device:
    """An emulated GPU; ``options`` go to :class:`EmulatedDevice` (``model_shape``, ``pace``, ...)."""
    assert spec.gpu is not None
    return EmulatedDevice(spec.gpu, **options)


DeviceFactory = Callable[..., Device]  # (DeviceSpec, **options) -> Device
DEVICE_FACTORIES: dict[str, DeviceFactory] = {
    "cpu": _open_cpu,
    "cuda": _open_cuda,
    "emulated": _open_emulated,
}


def register_device_factory(kind: DeviceKind, factory: DeviceFactory) -> None:
    """Install the factory that opens devices of ``kind`` (e.g. the emulated GPU)."""
    DEVICE_FACTORIES[kind] = factory


def open_device(spec: str, **options: Any) -> Device:
    """Open the device named by ``spec`` (see :func:`parse_device_spec`).

    ``options`` go to the kind's factory; ``cpu`` and ``cuda`` ignore them, an emulated GPU takes
    ``model_shape`` (the :class:`~serving.config.ModelConfig` whose work it models).
    """
    parsed = parse_device_spec(spec)
    return DEVICE_FACTORIES[parsed.kind](parsed, **options)


def check_devices_available(specs: list[str]) -> None:
    """Fail fast, in one line, when the workers' specs ask for GPUs this machine lacks.

    Raises :class:`DeviceValueError` for a malformed spec and :class:`DeviceNotFoundError`, e.g.
    ``3 workers asked for cuda:0..cuda:2 but only 1 GPU found``.
    """
    cuda = [p.index for p in map(parse_device_spec, specs) if p.kind == "cuda" and p.index is not None]
    if not cuda:
        return
    count = cuda_device_count()
    if max(cuda) < count:
        return
    workers = f"{len(cuda)} worker{'s' if len(cuda) != 1 else ''}"
    raise DeviceNotFoundError(f"{workers} asked for {_describe(cuda)} but {_gpus_found(count)}")


def _describe(indices: list[int]) -> str:
    wanted = sorted(set(indices))
    if len(wanted) > 2 and wanted == list(range(wanted[0], wanted[-1] + 1)):
        return f"cuda:{wanted[0]}..cuda:{wanted[-1]}"
    return ", ".join(f"cuda:{i}" for i in wanted)


def _gpus_found(count: int) -> str:
    if count == 0:
        return "no GPU was found (NVML and torch.cuda see none)"
    return f"only {count} GPU{'s' if count != 1 else ''} found"
