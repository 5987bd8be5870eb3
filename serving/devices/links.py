"""Links, shards and KV capacity of the GPU model (serving/devices/gpu_model.py): GPU-to-GPU links
(:class:`LinkSpec`), tensor-parallel shards, the prefill -> decode KV hand-off time and the KV
capacity per GPU."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from serving.config import ConfigError, ModelConfig
from serving.devices.errors import DeviceValueError
from serving.devices.gpu_specs import DTYPES, GpuSpec, check_dtype, gpu_spec
from serving.devices.model_constants import (
    ALLOWED_TP,
    BF16_BYTES,
    CONTEXT_BYTES,
    DEFAULT_CONSTANTS,
    EmulationConstants,
)

# --- links ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A GPU-to-GPU link: bandwidth per GPU per direction, latency, and the source of the figures.

    ``latency_s`` is one message's latency: a KV hand-off pays it once, a ring all-reduce of ``N``
    ranks once per ring step (``2 (N - 1)`` steps, NCCL's ring latency model). ``efficiency`` is the
    achieved share of ``bandwidth_bytes_s`` for large transfers (all-reduce bus bandwidth, KV
    hand-off).
    """

    name: str
    bandwidth_bytes_s: float
    latency_s: float
    efficiency: float
    source: str


LINKS: dict[str, LinkSpec] = {
    "nvlink": LinkSpec(
        name="nvlink",
        bandwidth_bytes_s=450e9,
        latency_s=1.5e-6,
        efficiency=0.80,
        source="NVLink 4 (H100/H200 SXM): 900 GB/s total per GPU = 450 GB/s per direction (NVIDIA "
        "H100 datasheet); ~360 GB/s NCCL all-reduce bus bandwidth on 8xH100",
    ),
    "nvlink3": LinkSpec(
        name="nvlink3",
        bandwidth_bytes_s=300e9,
        latency_s=2.0e-6,
        efficiency=0.80,
        source="NVLink 3 (A100 SXM): 600 GB/s total per GPU = 300 GB/s per direction (NVIDIA A100 datasheet)",
    ),
    "infiniband": LinkSpec(
        name="infiniband",
        bandwidth_bytes_s=50e9,
        latency_s=5.0e-6,
        efficiency=0.85,
        source="NDR InfiniBand 400 Gb/s per NIC (ConnectX-7) = 50 GB/s per direction, one NIC per GPU",
    ),
    "pcie5": LinkSpec(
        name="pcie5",
        bandwidth_bytes_s=64e9,
        latency_s=3.0e-6,
        efficiency=0.80,
        source="PCIe 5.0 x16: 32 GT/s x 16 lanes ~ 64 GB/s per direction (PCI-SIG)",
    ),
}


def link_spec(link: str | LinkSpec) -> LinkSpec:
    """Resolve ``link`` (a name in :data:`LINKS` or a spec)."""
    if isinstance(link, LinkSpec):
        return link
    try:
        return LINKS[link]
    except KeyError:
        raise DeviceValueError(f"unknown link {link!r}; allowed: {', '.join(LINKS)}") from None


# --- tensor parallelism -----------------------------------------------------------------------------


@functools.lru_cache(maxsize=128)
def shard_shape(shape: ModelConfig, tp: int) -> ModelConfig:
    """The per-GPU shard of ``shape`` under Megatron-style tensor parallelism of degree ``tp``.

    Query heads, MLP width and vocabulary are split ``tp`` ways; KV heads too, unless there are
    fewer than ``tp`` of them: then each rank holds one (replicated, as vLLM does). Hidden size and
    layers are unchanged. ``tp`` must be 1, 2, 4 or 8 and divide the query heads.
    """
    if tp not in ALLOWED_TP or shape.num_heads % tp:
        raise DeviceValueError(
            f"{shape.name}: tensor-parallel degree {tp!r} is not allowed; allowed: one of "
            f"{', '.join(map(str, ALLOWED_TP))} that divides the {shape.num_heads} query heads"
        )
    if tp == 1:
        return shape
    kv = shape.num_kv_heads // tp if shape.num_kv_heads >= tp else 1
    try:
        return replace(
            shape,
            name=f"{shape.name}/tp{tp}",
            vocab_size=-(-shape.vocab_size // tp),
            intermediate_size=-(-shape.intermediate_size // tp),
            num_heads=shape.num_heads // tp,
            num_kv_heads=kv,
            head_dim_override=shape.head_dim,
        )
    except ConfigError as e:
        raise DeviceValueError(f"{shape.name} cannot be split {tp} ways: {e}") from e


def kv_transfer_s(
    shape: ModelConfig, num_tokens: int, link: str | LinkSpec = "nvlink", *, tp: int = 1
) -> float:
    """Seconds to hand ``num_tokens`` tokens of a prefilled sequence's KV cache (bf16, all layers)
    from a prefill GPU to a decode GPU over ``link``.

    Each of the ``tp`` ranks sends its own shard over its own link in parallel, so the time is one
    rank's: ``latency_s + shard KV bytes / (bandwidth_bytes_s * efficiency)``.
    """
    spec = link_spec(link)
    if num_tokens <= 0:
        return 0.0
    nbytes = shard_shape(shape, tp).kv_bytes_per_token(BF16_BYTES) * num_tokens
    return spec.latency_s + nbytes / (spec.bandwidth_bytes_s * spec.efficiency)


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"


def kv_capacity_tokens(
    gpu: str | GpuSpec,
    shape: ModelConfig,
    *,
    tp: int = 1,
    gpu_memory_utilization: float = 0.9,
    constants: EmulationConstants = DEFAULT_CONSTANTS,
    dtype: str = "bf16",
) -> int:
    """KV-cache tokens that fit on each GPU after the shard's weights and the reserves (``dtype``:
    the weights' and KV's, ``bf16`` or ``fp8``).

    Usable memory = ``memory_bytes * gpu_memory_utilization`` (as vLLM budgets it) minus the
    shard's weights, the CUDA context (512 MiB) and an activation reserve of
    ``activation_reserve_tokens`` tokens through one layer. Raises :class:`DeviceValueError` when
    the weights (or the reserves) do not fit, naming the smallest tensor-parallel degree that would.
    """
    spec = gpu_spec(gpu)
    weight_b, kv_b = DTYPES[check_dtype(dtype)]
    if not 0 < gpu_memory_utilization <= 1:
        raise DeviceValueError(f"gpu_memory_utilization {gpu_memory_utilization!r} is outside (0, 1]")
    shard = shard_shape(shape, tp)
    budget = spec.memory_bytes * gpu_memory_utilization
    free = budget - _reserve_bytes(shard, constants) - shard.param_count() * weight_b
    per_token = shard.kv_bytes_per_token(kv_b)
    if free < per_token:
        weights = shard.param_count() * weight_b
        hint = ""
        for t in ALLOWED_TP:
            if t <= tp or shape.num_heads % t:
                continue
            s = shard_shape(shape, t)
            if budget - _reserve_bytes(s, constants) - s.param_count() * weight_b >= per_token:
                hint = f"; use tp ≥ {t}"
                break
        else:
            hint = "; no tensor-parallel degree up to 8 fits"
        raise DeviceValueError(
            f"{shape.name} at TP {tp} needs {_gb(weights)} of {dtype} weights per GPU; an {spec.name} "
            f"holds {_gb(spec.memory_bytes)} ({_gb(budget)} at gpu_memory_utilization "
            f"{gpu_memory_utilization:g}, less {_gb(_reserve_bytes(shard, constants))} reserved){hint}"
        )
    return int(free // per_token)


def _reserve_bytes(shard: ModelConfig, c: EmulationConstants) -> float:
    act = c.activation_reserve_tokens * (4 * shard.hidden_size + 2 * shard.intermediate_size) * BF16_BYTES
    return CONTEXT_BYTES + act
