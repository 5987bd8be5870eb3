"""What an emulated GPU says about itself: its label for banners and APIs, its fidelity, its UUID.

Pure functions of the GPU table (:mod:`serving.devices.gpu_specs`) and the model presets: the router
and the worker CLI label an ``emulated:<gpu>`` worker without opening a device, and
:class:`~serving.devices.emulated.EmulatedDevice` names itself with them.
"""

from __future__ import annotations

import socket
import uuid
from typing import Any

from serving.config import model_config_for
from serving.devices.gpu_specs import GpuSpec, check_dtype, fidelity, gpu_spec

__all__ = ["emulated_device_label", "emulated_uuid", "emulation_fidelity"]


def emulated_device_label(device: str, shape: str, dtype: str = "bf16") -> dict[str, Any] | None:
    """What a worker on ``device`` models, for banners and APIs; ``None`` unless ``emulated:<gpu>``.

    ``shape`` is the preset name or Hugging Face folder of the modeled shape (``--emulate-shape``,
    else the served model); ``dtype`` the modeled weights' and KV's (``--emulate-dtype``). Returns
    ``{"device", "emulated": True, "gpu", "models_shape", "dtype", "validated"}``, plus ``"fidelity"``
    (the "unvalidated: ..." note) on a GPU or dtype the GPU model was never checked on.
    """
    if not device.startswith("emulated:"):
        return None
    gpu = gpu_spec(device.split(":", 1)[1])
    validated, note = emulation_fidelity(gpu, dtype)
    label: dict[str, Any] = {
        "device": device,
        "emulated": True,
        "gpu": gpu.name,
        "models_shape": model_config_for(shape).name,
        "dtype": dtype,
        "validated": validated,
    }
    if note:
        label["fidelity"] = note
    return label


def emulation_fidelity(gpu: str | GpuSpec, dtype: str = "bf16") -> tuple[bool, str | None]:
    """:func:`~serving.devices.gpu_specs.fidelity` of an emulated GPU, after checking that the GPU runs
    ``dtype`` (FP8 needs FP8 tensor cores: an A100 emulates bf16 only); DeviceValueError names what is
    allowed otherwise."""
    spec = gpu_spec(gpu)
    spec.peak_flops_for(check_dtype(dtype))  # raises, naming the allowed dtypes, where the GPU has none
    return fidelity(spec, dtype)


def emulated_uuid(gpu_name: str, index: int | None) -> str:
    """The UUID of an emulated GPU: stable for the same GPU type and index on the same host (a restarted
    worker or a second demo run is the same GPU to the store, as a physical GPU would be), random when
    no index is given."""
    if index is None:
        return f"GPU-emulated-{uuid.uuid4()}"
    return f"GPU-emulated-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{socket.gethostname()}/{gpu_name}/{index}')}"
