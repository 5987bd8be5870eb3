"""Devices a serving worker runs on: one interface, one module per vendor.

``open_device("cuda:0" | "cpu" | "emulated:<gpu>")`` returns a :class:`Device`; its
:meth:`Device.snapshot` gives one :class:`DeviceSample` per sampling tick, with ``None`` for any
metric the device cannot measure. Errors are the few classes in :mod:`serving.devices.errors`.
"""

from serving.devices.base import (
    Device,
    DeviceKind,
    DeviceSample,
    EmulatedSample,
    IterationTiming,
    IterationWork,
    Phase,
    PowerLimitConstraints,
)
from serving.devices.cpu import CpuDevice
from serving.devices.emulated import EmulatedDevice, EmulationStats
from serving.devices.errors import (
    DeviceError,
    DeviceLostError,
    DeviceNotFoundError,
    DeviceNotSupportedError,
    DevicePermissionError,
    DeviceValueError,
)
from serving.devices.gpu_model import (
    DEFAULT_CONSTANTS,
    DEFAULT_PROFILE,
    LINKS,
    PROFILES,
    EmulationConstants,
    EngineProfile,
    IterationEstimate,
    LinkSpec,
    estimate_at_clock,
    gap_energy_j,
    gap_power_w,
    gap_sm_clock_mhz,
    kv_capacity_tokens,
    kv_transfer_s,
    predict_iteration,
    shard_shape,
)
from serving.devices.gpu_specs import GPU_SPECS, GpuSpec, gpu_spec
from serving.devices.nvml import NvmlDevice, nvml_available, nvml_device_count, nvml_status
from serving.devices.registry import (
    DEVICE_FACTORIES,
    EMULATED_GPUS,
    DeviceSpec,
    check_devices_available,
    cuda_device_count,
    open_device,
    parse_device_spec,
    register_device_factory,
)
from serving.devices.torch_cuda import TorchCudaDevice

__all__ = [
    "DEFAULT_CONSTANTS",
    "DEFAULT_PROFILE",
    "DEVICE_FACTORIES",
    "EMULATED_GPUS",
    "GPU_SPECS",
    "LINKS",
    "PROFILES",
    "CpuDevice",
    "Device",
    "DeviceError",
    "DeviceKind",
    "DeviceLostError",
    "DeviceNotFoundError",
    "DeviceNotSupportedError",
    "DevicePermissionError",
    "DeviceSample",
    "DeviceSpec",
    "DeviceValueError",
    "EmulatedDevice",
    "EmulatedSample",
    "EmulationConstants",
    "EmulationStats",
    "EngineProfile",
    "GpuSpec",
    "IterationEstimate",
    "IterationTiming",
    "IterationWork",
    "LinkSpec",
    "NvmlDevice",
    "Phase",
    "PowerLimitConstraints",
    "TorchCudaDevice",
    "check_devices_available",
    "cuda_device_count",
    "estimate_at_clock",
    "gap_energy_j",
    "gap_power_w",
    "gap_sm_clock_mhz",
    "gpu_spec",
    "kv_capacity_tokens",
    "kv_transfer_s",
    "nvml_available",
    "nvml_device_count",
    "nvml_status",
    "open_device",
    "parse_device_spec",
    "predict_iteration",
    "register_device_factory",
    "shard_shape",
]
