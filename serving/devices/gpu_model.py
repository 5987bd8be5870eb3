"""The GPU model (v2): one engine iteration's time, power, clock and activities on a modeled GPU.

One implementation shared by the live emulated GPU (:class:`~serving.devices.emulated.EmulatedDevice`)
and the discrete-event simulator (``serving.sim``). Everything here is pure and cheap:

* :func:`predict_iteration` -- an iteration of :class:`~serving.devices.base.IterationWork` for a
  model shape (bf16) on a GPU under a power limit / locked SM clocks, with tensor parallelism over a
  link and an engine's host time (:class:`EngineProfile`). Wall time ``time_s = host_s + busy_s``.
* :func:`shard_shape`, :func:`kv_capacity_tokens`, :func:`kv_transfer_s` -- tensor-parallel shards,
  KV capacity per GPU, prefill -> decode KV hand-off over a :class:`LinkSpec`.
* :func:`gap_power_w`, :func:`gap_energy_j`, :func:`gap_sm_clock_mhz` -- the GPU between iterations
  (boost clock and elevated power through short gaps, true idle only after a sustained one); they take
  floats or numpy arrays.

The equations, constants and their sources are in ``docs/EMULATION.md``; the calibration against
published serving measurements is ``bench/fidelity_table.py`` / ``docs/FIDELITY.md``.

Energy: ``IterationEstimate.power_w`` is the mean power while the GPU is busy, so the busy energy is
``power_w * busy_s`` (:attr:`IterationEstimate.busy_energy_j`). The host gap before the GPU work is
priced by the gap-power model: :attr:`IterationEstimate.host_energy_j` is
``gap_energy_j(gpu, host_s)`` (the gap right after the previous iteration's busy interval, i.e.
back-to-back iterations), and :attr:`IterationEstimate.energy_j` is their sum, the whole iteration.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from serving.config import ConfigError, ModelConfig
from serving.devices.base import IterationWork
from serving.devices.errors import DeviceValueError
from serving.devices.gpu_specs import GpuSpec, gpu_spec

Bound = Literal["compute", "memory", "overhead", "comm"]

BF16_BYTES = 2
ALLOWED_TP = (1, 2, 4, 8)
CONTEXT_BYTES = 512 * 2**20  # CUDA context and allocator slack per GPU


# --- constants ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EmulationConstants:
    """The GPU model's fitted constants (docs/EMULATION.md says where each comes from).

    Power figures are fractions of the GPU's dynamic range ``tdp_w - idle_w`` so one set serves
    every GPU in :data:`~serving.devices.gpu_specs.GPU_SPECS`. Engine-specific figures (host time,
    kernel counts) live in :class:`EngineProfile`, not here.
    """

    gemm_efficiency: float = 0.65  # achieved/peak tensor FLOP/s of compute-bound GEMMs and attention
    # (gpu key, efficiency) where a GPU generation's GEMMs reach a different share of its own peak
    # (see gemm_efficiency_for); every other GPU uses gemm_efficiency
    gemm_efficiency_by_gpu: tuple[tuple[str, float], ...] = (("a100-sxm-80gb", 0.75),)
    memory_efficiency: float = 0.85  # achieved/peak HBM bandwidth of memory-bound kernels
    gemm_tile_tokens: int = 16  # GEMM token dimension is padded to this (swap-AB 64x16 Hopper tiles)
    activation_passes: float = 7.5  # bf16 passes over (hidden + intermediate) per token per layer
    overhead_s: float = 2.0e-4  # GPU-side per iteration: sampling, synchronisation (clock-insensitive)
    # Per-kernel fixed GPU time (launch ramp, tail, inter-kernel bubble) in SM cycles: a kernel's
    # latency floor scales with 1/f, which is what makes small-batch decode slow with the SM clock.
    kernel_latency_cycles: float = 15000.0
    iteration_kernels: float = 12.0  # kernels per iteration outside the layers (embed, norm, head, sample)
    # power, as fractions of (tdp_w - idle_w), at the maximum SM clock
    compute_power: float = 0.95  # SM power through a compute-bound kernel
    stream_power: float = 0.09  # SM power through a memory-bound kernel (load issue, L2, NoC)
    latency_power: float = 0.04  # SM power through kernel ramp/tail and communication waits
    hbm_power: float = 0.09  # HBM and controllers at peak bandwidth (memory clock, not SM clock)
    busy_power: float = 0.08  # clock-independent power whenever a kernel runs
    # SM power ~ (f/f_max) * V(f)^2 with V(f)/V_max = max(voltage_floor, v0 + (1 - v0) * f/f_max)
    voltage_offset: float = 0.31  # v0
    voltage_floor: float = 0.68
    # activity counters (GPM-like), calibrated to the H200 readings of this engine
    sm_active_compute: float = 0.55  # SM-active fraction through compute-bound kernels
    sm_active_memory: float = 0.25  # ... through memory-bound kernels
    sm_occupancy_compute: float = 0.20
    sm_occupancy_memory: float = 0.40
    tensor_active_scale: float = 0.37  # tensor-active fraction per unit of tensor-pipe time
    # the GPU between iterations (see gap_power_w)
    gap_power: float = 0.10  # power above idle at the held (boost) clock, fraction of D at f_max
    gap_hold_s: float = 1.0  # the clock and power stay up this long after the last kernel
    gap_decay_s: float = 0.5  # then fall to idle with this time constant (power); the clock drops at hold
    # memory
    activation_reserve_tokens: int = 8192  # tokens of activations reserved (vLLM max_num_batched_tokens)

    def gemm_efficiency_for(self, gpu_key: str) -> float:
        """Achieved share of ``gpu_key``'s dense tensor peak in compute-bound GEMMs and attention.

        A GPU property (one per generation), so every engine on that GPU uses it; an engine whose
        GEMMs differ scales it (``EngineProfile.gemm_efficiency_by_gpu``). Hopper (H100/H200):
        :attr:`gemm_efficiency` (0.65 of the 989 TF/s dense peak), fitted on this project's H200
        prefill rows. Ampere (A100): 0.75 of its 312 TF/s peak, fitted on the TensorRT-LLM v0.5 A100
        calibration rows (bench/fidelity_table.py, ``gpu.gemm_a100``). Ampere's ``mma.sync``
        GEMMs were mature in every 2023 library and reach a larger share of a 3.2x lower peak than
        Hopper's, whose dense peak needs ``wgmma`` kernels kept fed at the TDP.
        """
        for key, eff in self.gemm_efficiency_by_gpu:
            if key == gpu_key:
                return eff
        return self.gemm_efficiency


DEFAULT_CONSTANTS = EmulationConstants()


# --- engine profiles --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """A serving engine's cost around the GPU work of one iteration.

    Host time (GPU idle, placed before the iteration's GPU work):
    ``step_s + per_seq_s * batch + per_prefill_seq_s * prefilling seqs + per_prefill_token_s *
    prefill tokens + per_tp_rank_s * (tp - 1) + per_layer_s * layers``. GPU-side engine costs: ``kernels_per_layer``
    kernels per layer (each with the GPU's clock-scaled kernel latency) and ``allreduce_overhead_s``
    per tensor-parallel all-reduce beyond the link's own latency (the engine's collective), and
    ``gemm_efficiency_by_gpu`` where the engine's GEMMs reach a different share of a GPU's peak
    than :meth:`EmulationConstants.gemm_efficiency_for` (e.g. a 2023 stack without Hopper kernels).

    ``allreduce_step_scale``: a ring all-reduce of ``N`` ranks takes ``2 (N - 1)`` steps, each paying
    a latency before its chunk moves (the alpha-beta model of a ring collective). NCCL's own tuning
    model (``src/graph/tuning.cc``, ``hwLat``) prices a ring step on NVLink at 0.6 us (LL protocol),
    1.9 us (LL128) or 3.4 us (Simple), plus a base latency per call. The engine's per-step latency is
    ``allreduce_step_scale * LinkSpec.latency_s``: the per-call cost grows linearly with the ranks,
    and a slower link (NVLink 3) pays more per step. It is why a small-batch decode step of the 2023
    stack stops shrinking with TP once the shard's weight streaming is small (Splitwise: 29.7 ms at
    TP 4 and 29.8 ms at TP 8 on H100). Its fitted value there (3.84: 5.8 us per step on NVLink 4) is
    above NCCL's Simple figure, so it also carries per-step costs of that stack not modeled apart.

    ``gqa_unaware_attention``: the engine's attention kernel runs one thread block per *query* head
    and streams that head's K/V from HBM itself, so under grouped-query attention each KV head is
    read once per query head of its group (``num_heads / num_kv_heads`` times; 8x for Llama-2-70B)
    instead of once. The 2023 decode kernels were written that way (vLLM's PagedAttention v1 and
    FasterTransformer's masked multi-head attention launch a grid over (heads, sequences)); a
    GQA-aware kernel (FlashInfer, FlashAttention-2 with GQA packing) reads each KV head once. It
    makes a large decode batch cost more at low TP, where each GPU holds more query heads.

    ``custom_allreduce_max_bytes``: the engine runs its own peer-to-peer all-reduce kernel for
    messages up to this size and NCCL's ring above it. The 2023 NVIDIA stacks allocate one
    peer-visible buffer for their custom all-reduce and use it only while the message fits:
    ``CUSTOM_AR_SIZE_THRESHOLD = 50331648`` bytes (48 MiB) in FasterTransformer
    (``src/fastertransformer/kernels/custom_ar_kernels.h``, ``utils/custom_ar_comm.cc``) and
    TensorRT-LLM (``cpp/tensorrt_llm/kernels/customAllReduceKernels.h``). Their "two-shot" kernel
    (messages above 192 KiB) has each rank load its ``1/N`` slice from all ``N`` ranks and reduce
    it, then load the ``N - 1`` reduced slices back: every rank loads the whole message twice,
    whatever ``N``, on a fixed grid (``MAX_ALL_REDUCE_BLOCKS = 24`` thread blocks). So the custom
    all-reduce moves ``S`` bytes in ``S / (link bandwidth x efficiency x allreduce_bandwidth_scale)``
    at every TP degree, where the ring moves ``2 (N - 1) / N x S`` per GPU; beyond the buffer the
    ring (NCCL) at ``fallback_allreduce_bandwidth_scale`` of the link. A prefill all-reduces
    ``tokens x hidden x 2`` bytes per call: for Llama-2-70B (hidden 8192) the switch is at 3072
    tokens per iteration, where Splitwise's prompt time per token jumps at TP 4 and 8, for one
    long prompt and for a batch of 512-token prompts alike (docs/FIDELITY.md). ``None`` (the
    default): the ring at ``allreduce_bandwidth_scale`` for every message. The per-call latency
    (``allreduce_step_scale``, ``allreduce_overhead_s``) is the same for both.

    ``prefill_floor_cycles_per_layer``: an iteration that computes prompt tokens keeps the GPU busy
    for at least ``layers x prefill_floor_cycles_per_layer`` SM cycles; its GPU work runs *under* that
    floor (the larger of the two counts, not their sum). Splitwise's prompt times at TP 4/8 barely grow
    from 128 to 256 tokens (H100 TP 4: 49.1 -> 51.0 ms) while one rank's GPU work grows by 4-15 ms:
    a fixed cost of the 2023 stack's prefill path that overlaps the GPU work (as an eager stack's
    kernel issue does). It is priced in SM cycles like the same stack's decode floor
    (``kernels_per_layer`` x the GPU's kernel latency), so it is 1.4x longer on an A100 (1410 vs
    1980 MHz) -- checked only by the A100 rows, which no fit sees; whether it is the host's issue
    or the GPU's own latency the data do not say. 0 (the default): no floor.
    """

    name: str
    step_s: float = 0.0  # host time per iteration
    per_seq_s: float = 0.0  # ... per sequence in the batch
    per_prefill_seq_s: float = 0.0  # ... per sequence prefilling in this iteration
    per_prefill_token_s: float = 0.0  # ... per prompt token computed
    per_tp_rank_s: float = 0.0  # ... per tensor-parallel rank beyond the first
    per_layer_s: float = 0.0  # ... per model layer (eager launches that do not overlap the GPU)
    kernels_per_layer: float = 1.0  # small (latency-bound) GPU kernels per layer
    allreduce_overhead_s: float = 0.0  # per all-reduce call, beyond the link's ring latency
    allreduce_bandwidth_scale: float = 1.0  # achieved share of the link's all-reduce bandwidth
    allreduce_step_scale: float = 1.0  # ring-step latency of the engine's collective / the link's latency
    custom_allreduce_max_bytes: float | None = None  # largest message of a custom all-reduce (see above)
    fallback_allreduce_bandwidth_scale: float = 1.0  # the ring's share of the link beyond that size
    prefill_floor_cycles_per_layer: float = 0.0  # least GPU-busy time of a prefill iteration (see above)
    gqa_unaware_attention: bool = False  # attention reads K/V once per query head (see above)
    # (gpu key, factor) pairs scaling the GPU's GEMM efficiency for this engine's kernels
    gemm_efficiency_by_gpu: tuple[tuple[str, float], ...] = ()
    description: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if self.custom_allreduce_max_bytes is not None and not self.custom_allreduce_max_bytes > 0:
            raise DeviceValueError(
                f"engine profile {self.name!r}: custom_allreduce_max_bytes must be > 0 bytes or None, "
                f"got {self.custom_allreduce_max_bytes!r}"
            )
        if not self.prefill_floor_cycles_per_layer >= 0:
            raise DeviceValueError(
                f"engine profile {self.name!r}: prefill_floor_cycles_per_layer must be >= 0 SM cycles, "
                f"got {self.prefill_floor_cycles_per_layer!r}"
            )
        for field in ("allreduce_bandwidth_scale", "fallback_allreduce_bandwidth_scale"):
            value = getattr(self, field)
            if not 0 < value <= 1:
                raise DeviceValueError(
                    f"engine profile {self.name!r}: {field} must be in (0, 1] (a share of the link's "
                    f"bandwidth), got {value!r}"
                )

    def gemm_scale(self, gpu_key: str) -> float:
        """The factor on the GPU model's GEMM efficiency for this engine on ``gpu_key``."""
        for key, factor in self.gemm_efficiency_by_gpu:
            if key == gpu_key:
                return factor
        return 1.0

    def host_s(self, work: IterationWork, tp: int = 1, layers: int = 0) -> float:
        """Host (GPU-idle) time of one iteration of ``work`` at tensor-parallel degree ``tp`` for a
        model of ``layers`` layers."""
        decode = max(0, work.decode_seqs)
        prefill_seqs = max(0, work.batch_size - decode)
        return (
            self.step_s
            + self.per_seq_s * max(0, work.batch_size)
            + self.per_prefill_seq_s * prefill_seqs
            + self.per_prefill_token_s * max(0, work.prefill_tokens)
            + self.per_tp_rank_s * (tp - 1)
            + self.per_layer_s * layers
        )


PROFILES: dict[str, EngineProfile] = {
    "lean": EngineProfile(
        name="lean",
        kernels_per_layer=1.0,
        description="no host time (v1's behaviour) and one small kernel per layer: the GPU's own time for "
        "a perfectly fed engine",
        source="none (the roofline of the GPU model)",
    ),
    "vllm": EngineProfile(
        name="vllm",
        step_s=9.77e-4,
        kernels_per_layer=5.0,
        allreduce_overhead_s=6.3e-6,
        description="vLLM (CUDA graphs for decode, custom all-reduce): host time per step fitted; the "
        "per-sequence and per-token host costs are not identifiable from the published runs (all batch 8) "
        "and are left at 0",
        source="fit on vLLM CI latency_llama8B_tp1 and latency_llama70B_tp4 (H100, build 9555); "
        "bench/fidelity_table.py",
    ),
    "phaselens-eager": EngineProfile(
        name="phaselens-eager",
        kernels_per_layer=46.0,
        description="this project's engine, eager PyTorch (no CUDA graphs): launch-bound decode",
        source="docs/gpu/2026-11-30-h200-decode-profile.txt: ~740 kernels per llama-3.2-1b (16-layer) "
        "decode step; its launches overlap the GPU work, so no serialized host time is modeled",
    ),
    "splitwise-2023": EngineProfile(
        name="splitwise-2023",
        per_seq_s=2.0e-4,
        per_prefill_seq_s=9.6e-3,
        kernels_per_layer=16.9,
        allreduce_bandwidth_scale=0.264,
        allreduce_step_scale=3.84,
        custom_allreduce_max_bytes=50_331_648.0,
        fallback_allreduce_bandwidth_scale=0.223,
        prefill_floor_cycles_per_layer=9.9e5,
        gqa_unaware_attention=True,
        description="the 2023 stack behind the Splitwise profiling data (no CUDA graphs; a custom all-reduce "
        "up to 48 MiB at ~26 % of NVLink bandwidth per message, NCCL's ring beyond at ~22 %; ~3.8 link "
        "latencies per ring step; decode attention reading K/V per query head; a prefill floor of "
        "~1M SM cycles per layer that the prompt's GPU work runs under)",
        source="fit on Splitwise perf_model.csv, H100 TP 2 prompt 128/2048 + token b1/b32, TP 8 prompt "
        "256/4096 + token b1; bench/fidelity_table.py; the 48 MiB limit is FasterTransformer's and "
        "TensorRT-LLM's CUSTOM_AR_SIZE_THRESHOLD",
    ),
    "trtllm-0.5": EngineProfile(
        name="trtllm-0.5",
        per_prefill_seq_s=6.3e-3,
        kernels_per_layer=5.0,
        allreduce_overhead_s=7.7e-5,
        description="TensorRT-LLM v0.5 (fused kernels; GEMMs at the GPU's own efficiency)",
        source="fit on TensorRT-LLM v0.5 A100 first-token latency: Llama-2-7B 128/2048, 70B TP 4 128 "
        "(with the A100 GEMM efficiency of EmulationConstants); bench/fidelity_table.py",
    ),
}
DEFAULT_PROFILE = "vllm"


def engine_profile(profile: str | EngineProfile | None) -> EngineProfile:
    """Resolve ``profile`` (a name in :data:`PROFILES`, a profile, or ``None`` = DEFAULT_PROFILE)."""
    if profile is None:
        return PROFILES[DEFAULT_PROFILE]
    if isinstance(profile, EngineProfile):
        return profile
    try:
        return PROFILES[profile]
    except KeyError:
        raise DeviceValueError(
            f"unknown engine profile {profile!r}; allowed: {', '.join(PROFILES)}"
        ) from None


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
) -> int:
    """KV-cache tokens that fit on each GPU after the shard's bf16 weights and the reserves.

    Usable memory = ``memory_bytes * gpu_memory_utilization`` (as vLLM budgets it) minus the
    shard's weights, the CUDA context (512 MiB) and an activation reserve of
    ``activation_reserve_tokens`` tokens through one layer. Raises :class:`DeviceValueError` when
    the weights (or the reserves) do not fit, naming the smallest tensor-parallel degree that would.
    """
    spec = gpu_spec(gpu)
    if not 0 < gpu_memory_utilization <= 1:
        raise DeviceValueError(f"gpu_memory_utilization {gpu_memory_utilization!r} is outside (0, 1]")
    shard = shard_shape(shape, tp)
    budget = spec.memory_bytes * gpu_memory_utilization
    free = budget - _reserve_bytes(shard, constants) - shard.param_count() * BF16_BYTES
    per_token = shard.kv_bytes_per_token(BF16_BYTES)
    if free < per_token:
        weights = shard.param_count() * BF16_BYTES
        hint = ""
        for t in ALLOWED_TP:
            if t <= tp or shape.num_heads % t:
                continue
            s = shard_shape(shape, t)
            if budget - _reserve_bytes(s, constants) - s.param_count() * BF16_BYTES >= per_token:
                hint = f"; use tp ≥ {t}"
                break
        else:
            hint = "; no tensor-parallel degree up to 8 fits"
        raise DeviceValueError(
            f"{shape.name} at TP {tp} needs {_gb(weights)} of bf16 weights per GPU; an {spec.name} "
            f"holds {_gb(spec.memory_bytes)} ({_gb(budget)} at gpu_memory_utilization "
            f"{gpu_memory_utilization:g}, less {_gb(_reserve_bytes(shard, constants))} reserved){hint}"
        )
    return int(free // per_token)


def _reserve_bytes(shard: ModelConfig, c: EmulationConstants) -> float:
    act = c.activation_reserve_tokens * (4 * shard.hidden_size + 2 * shard.intermediate_size) * BF16_BYTES
    return CONTEXT_BYTES + act


# --- the GPU between iterations ---------------------------------------------------------------------


def _voltage_factor(x: Any, c: EmulationConstants) -> Any:
    """``x V(x)^2``: the SM dynamic-power factor at clock fraction ``x`` (float or array)."""
    v = np.maximum(c.voltage_floor, c.voltage_offset + (1.0 - c.voltage_offset) * x)
    return x * v * v


def _gap_amp_scalar(spec: GpuSpec, c: EmulationConstants, x: float) -> float:
    v = max(c.voltage_floor, c.voltage_offset + (1.0 - c.voltage_offset) * x)
    return (spec.tdp_w - spec.idle_w) * c.gap_power * x * v * v


def _gap_power_scalar(spec: GpuSpec, s: float, c: EmulationConstants, x: float = 1.0) -> float:
    held = 1.0 if s < c.gap_hold_s else math.exp(-(s - c.gap_hold_s) / c.gap_decay_s)
    return spec.idle_w + _gap_amp_scalar(spec, c, x) * held


def _gap_energy_scalar(spec: GpuSpec, gap_s: float, c: EmulationConstants, x: float = 1.0) -> float:
    """The closed form of :func:`gap_energy_j` for one float (the per-iteration path)."""
    if gap_s <= 0.0:
        return 0.0
    held = min(gap_s, c.gap_hold_s)
    if gap_s > c.gap_hold_s:
        held += c.gap_decay_s * -math.expm1(-(gap_s - c.gap_hold_s) / c.gap_decay_s)
    return spec.idle_w * gap_s + _gap_amp_scalar(spec, c, x) * held


def _clock_x(spec: GpuSpec, sm_clock_mhz: Any) -> Any:
    if sm_clock_mhz is None:
        return 1.0
    if np.ndim(sm_clock_mhz) == 0:
        return float(sm_clock_mhz) / spec.max_sm_clock_mhz
    return np.asarray(sm_clock_mhz, dtype=float) / spec.max_sm_clock_mhz


def gap_power_w(
    gpu: str | GpuSpec,
    since_busy_s: Any,
    constants: EmulationConstants = DEFAULT_CONSTANTS,
    *,
    sm_clock_mhz: Any = None,
) -> Any:
    """Power of an idle GPU ``since_busy_s`` seconds after its last kernel (float or numpy array).

    ``P = idle_w + D * gap_power * x V(x)^2 * h(s)``, ``h = 1`` through the hold
    (``s < gap_hold_s``), then ``exp(-(s - hold) / gap_decay_s)``. ``sm_clock_mhz`` is the clock
    held in the gap (default: the maximum; a locked range's top under a lock).
    """
    spec, c = gpu_spec(gpu), constants
    x = _clock_x(spec, sm_clock_mhz)
    if np.ndim(since_busy_s) == 0 and np.ndim(x) == 0:
        return _gap_power_scalar(spec, float(since_busy_s), c, x)
    s = np.asarray(since_busy_s, dtype=float)
    amp = (spec.tdp_w - spec.idle_w) * c.gap_power * _voltage_factor(x, c)
    held = np.where(s < c.gap_hold_s, 1.0, np.exp(-np.maximum(0.0, s - c.gap_hold_s) / c.gap_decay_s))
    return spec.idle_w + amp * held


def gap_energy_j(
    gpu: str | GpuSpec,
    gap_s: Any,
    constants: EmulationConstants = DEFAULT_CONSTANTS,
    *,
    sm_clock_mhz: Any = None,
) -> Any:
    """Energy (J) of a whole idle gap of ``gap_s`` seconds right after a busy interval: the closed
    form of the integral of :func:`gap_power_w` from 0 to ``gap_s`` (float or numpy array)."""
    spec, c = gpu_spec(gpu), constants
    x = _clock_x(spec, sm_clock_mhz)
    if np.ndim(gap_s) == 0 and np.ndim(x) == 0:
        return _gap_energy_scalar(spec, float(gap_s), c, x)
    g = np.maximum(0.0, np.asarray(gap_s, dtype=float))
    amp = (spec.tdp_w - spec.idle_w) * c.gap_power * _voltage_factor(x, c)
    late = np.maximum(0.0, g - c.gap_hold_s)
    held = np.minimum(g, c.gap_hold_s) + c.gap_decay_s * -np.expm1(-late / c.gap_decay_s)
    return spec.idle_w * g + amp * held


def gap_sm_clock_mhz(
    gpu: str | GpuSpec,
    since_busy_s: Any,
    constants: EmulationConstants = DEFAULT_CONSTANTS,
    *,
    held_mhz: Any = None,
    idle_mhz: Any = None,
) -> Any:
    """SM clock of an idle GPU ``since_busy_s`` after its last kernel (float or numpy array): the
    held clock ``held_mhz`` (default the maximum) through the hold, then ``idle_mhz`` (default the
    lowest supported clock)."""
    spec = gpu_spec(gpu)
    held = float(spec.max_sm_clock_mhz) if held_mhz is None else held_mhz
    idle = float(spec.min_sm_clock_mhz) if idle_mhz is None else idle_mhz
    if np.ndim(since_busy_s) == 0 and np.ndim(held) == 0 and np.ndim(idle) == 0:
        return float(held if since_busy_s < constants.gap_hold_s else idle)
    s = np.asarray(since_busy_s, dtype=float)
    return np.where(s < constants.gap_hold_s, held, idle).astype(float)


# --- one iteration ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IterationEstimate:
    """The modeled execution of one iteration.

    ``time_s = host_s + busy_s`` is the iteration's wall duration: ``host_s`` of host time with the
    GPU idle, then ``busy_s`` of GPU work (kernels, fixed overhead and the tensor-parallel
    all-reduces, ``comm_s`` of it). ``compute_s`` and ``memory_s`` are the summed compute and memory
    roofline terms at the chosen clock. ``power_w`` is the mean power while busy; the activities
    (``sm_active``, ``dram_active``, ``tensor_active``, ``sm_occupancy``) are fractions (0-1) of
    ``busy_s``, and so is ``bound``'s meaning. Energy: :attr:`busy_energy_j` = ``power_w * busy_s``;
    :attr:`host_energy_j` = the gap model's energy of the host gap right after a busy interval;
    :attr:`energy_j` = both (back-to-back iterations).
    """

    time_s: float
    power_w: float
    sm_clock_mhz: int
    compute_s: float
    memory_s: float
    sm_active: float
    dram_active: float
    bound: Bound
    tensor_active: float = 0.0
    sm_occupancy: float = 0.0
    power_capped: bool = False  # the power limit held the SM clock below the allowed maximum
    flops: float = 0.0
    hbm_bytes: float = 0.0
    host_s: float = 0.0
    busy_s: float = 0.0
    comm_s: float = 0.0
    host_energy_j: float = 0.0
    tp: int = 1

    @property
    def busy_energy_j(self) -> float:
        """Energy of the GPU-busy part: ``power_w * busy_s``."""
        return self.power_w * self.busy_s

    @property
    def energy_j(self) -> float:
        """Energy of the whole iteration: busy energy plus the host gap's (gap-power model)."""
        return self.power_w * self.busy_s + self.host_energy_j

    @property
    def mean_power_w(self) -> float:
        """Mean power over the whole iteration (host gap included)."""
        return self.energy_j / self.time_s if self.time_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class _Coeffs:
    """Per (gpu, shape, tp, constants, profile, link) coefficients of :func:`_estimate`."""

    spec: GpuSpec
    c: EmulationConstants
    profile: EngineProfile
    tp: int
    body_params: int
    lm_head_params: int
    kv_bytes_per_token: int
    kv_read_bytes_per_token: int  # KV bytes attention reads per context token (per query head if unaware)
    attn_flops_per_pair: int
    act_bytes_per_token: float
    weight_bytes: int
    flops_per_s: float  # at f_max
    bytes_per_s: float
    bandwidth_bytes_s: float
    kernels: float  # per iteration (layers x kernels_per_layer + iteration kernels)
    latency_s: float  # all kernels' latency at f_max
    overhead_s: float
    comm_calls: int  # all-reduces per iteration
    comm_call_s: float  # latency per all-reduce
    comm_s_per_token: float  # transfer time per token (the custom all-reduce's if the engine has one)
    comm_fallback_tokens: float  # tokens above which the message outgrows the custom all-reduce (inf: never)
    comm_fallback_s_per_token: float  # the ring's transfer time per token beyond that
    prefill_floor_s: float  # least busy time of an iteration with prompt tokens, at f_max
    dynamic_w: float
    clocks: tuple[int, ...]
    f_max: float
    ceilings: dict[tuple[int, int] | None, tuple[tuple[int, ...], int]]  # per locked range, filled lazily


@functools.lru_cache(maxsize=256)
def _coeffs(
    spec: GpuSpec, shape: ModelConfig, tp: int, c: EmulationConstants, profile: EngineProfile, link: LinkSpec
) -> _Coeffs:
    shard = shard_shape(shape, tp)
    d = shard.hidden_size
    lm_head = shard.vocab_size * d
    embed = shard.vocab_size * d
    total = shard.param_count()
    body = total - embed - (0 if shard.tie_word_embeddings else lm_head)
    kernels = shard.num_layers * profile.kernels_per_layer + c.iteration_kernels
    comm_calls = 0 if tp == 1 else 2 * shard.num_layers
    ring = 2.0 * (tp - 1) / tp
    # bytes per token over all the iteration's all-reduces: a message of tokens x hidden x 2 per call;
    # the ring moves 2 (N - 1) / N of it per GPU, the custom all-reduce loads all of it (see EngineProfile)
    message_bytes_per_token = 0.0 if tp == 1 else comm_calls * d * BF16_BYTES
    link_bytes_s = link.bandwidth_bytes_s * link.efficiency
    max_bytes = profile.custom_allreduce_max_bytes
    ring_s_per_token = ring * message_bytes_per_token / (link_bytes_s * profile.allreduce_bandwidth_scale)
    return _Coeffs(
        spec=spec,
        c=c,
        profile=profile,
        tp=tp,
        body_params=body,
        lm_head_params=lm_head,
        kv_bytes_per_token=shard.kv_bytes_per_token(BF16_BYTES),
        kv_read_bytes_per_token=shard.kv_bytes_per_token(BF16_BYTES)
        * (shard.num_heads // shard.num_kv_heads if profile.gqa_unaware_attention else 1),
        attn_flops_per_pair=4 * shard.num_layers * shard.num_heads * shard.head_dim,
        act_bytes_per_token=c.activation_passes
        * (shard.hidden_size + shard.intermediate_size)
        * shard.num_layers
        * BF16_BYTES,
        weight_bytes=total * BF16_BYTES,
        flops_per_s=spec.peak_flops * c.gemm_efficiency_for(spec.key) * profile.gemm_scale(spec.key),
        bytes_per_s=spec.bandwidth_bytes_s * c.memory_efficiency,
        bandwidth_bytes_s=spec.bandwidth_bytes_s,
        kernels=kernels,
        latency_s=kernels * c.kernel_latency_cycles / (spec.max_sm_clock_mhz * 1e6),
        overhead_s=c.overhead_s,
        comm_calls=comm_calls,
        comm_call_s=link.latency_s * profile.allreduce_step_scale * 2 * (tp - 1)
        + profile.allreduce_overhead_s,
        comm_s_per_token=(
            ring_s_per_token
            if max_bytes is None
            else message_bytes_per_token / (link_bytes_s * profile.allreduce_bandwidth_scale)
        ),
        comm_fallback_tokens=math.inf if max_bytes is None else max_bytes / (d * BF16_BYTES),
        comm_fallback_s_per_token=(
            ring_s_per_token
            if max_bytes is None
            else ring * message_bytes_per_token / (link_bytes_s * profile.fallback_allreduce_bandwidth_scale)
        ),
        prefill_floor_s=shard.num_layers
        * profile.prefill_floor_cycles_per_layer
        / (spec.max_sm_clock_mhz * 1e6),
        dynamic_w=spec.tdp_w - spec.idle_w,
        clocks=spec.supported_sm_clocks_mhz(),
        f_max=float(spec.max_sm_clock_mhz),
        ceilings={},
    )


_Terms = tuple[
    tuple[tuple[float, float], ...], float, int, float
]  # ((flops, bytes) per kernel class), act bytes, tokens, least busy time at f_max (prefill floor)


def _terms(k: _Coeffs, work: IterationWork) -> _Terms:
    """The clock-independent work of an iteration: (FLOPs, bytes) of the GEMM/attention/LM-head
    classes, the small kernels' bytes, the tokens (for the all-reduces) and the prefill floor."""
    tokens = max(0, work.prefill_tokens) + max(0, work.decode_seqs)
    sampled = max(0, work.sampled_seqs)
    tile = k.c.gemm_tile_tokens
    terms: list[tuple[float, float]] = []
    act_b = 0.0
    if tokens:
        padded = -(-tokens // tile) * tile
        terms.append((2.0 * k.body_params * padded, 2.0 * k.body_params))
        terms.append(
            (
                float(k.attn_flops_per_pair * max(0, work.attention_pairs)),
                float(
                    k.kv_read_bytes_per_token * max(0, work.context_tokens) + k.kv_bytes_per_token * tokens
                ),
            )
        )
        act_b = k.act_bytes_per_token * tokens
    if sampled:
        padded_s = -(-sampled // tile) * tile
        terms.append((2.0 * k.lm_head_params * padded_s, 2.0 * k.lm_head_params))
    floor_s = k.prefill_floor_s if work.prefill_tokens > 0 else 0.0
    return tuple(terms), act_b, tokens, floor_s


def _comm_s(k: _Coeffs, tokens: int) -> float:
    """The all-reduces of an iteration of ``tokens`` tokens: each call's latency plus the transfer,
    by the engine's custom all-reduce while the message fits its buffer, by the ring beyond."""
    if not (k.comm_calls and tokens):
        return 0.0
    per_token = k.comm_fallback_s_per_token if tokens > k.comm_fallback_tokens else k.comm_s_per_token
    return k.comm_calls * k.comm_call_s + per_token * tokens


def _busy_power_w(k: _Coeffs, t: _Terms, sm_clock_mhz: int) -> float:
    """Only the busy power of :func:`_at_clock` (the power-cap search)."""
    c = k.c
    x = sm_clock_mhz / k.f_max
    fps, bps = k.flops_per_s * x, k.bytes_per_s
    ds = c.compute_power - c.stream_power
    kern_s = sm_w = bytes_total = 0.0
    terms, act_b, tokens, floor_s = t
    for f, b in terms:
        tc, tm = f / fps, b / bps
        tk = tc if tc > tm else tm
        if tk > 0.0:
            kern_s += tk
            sm_w += tk * c.stream_power + ds * tc
            bytes_total += b
    act_s = act_b / bps
    latency_s = k.latency_s / x
    wait_s = latency_s - act_s if latency_s > act_s else 0.0
    comm_s = _comm_s(k, tokens)
    busy_s = kern_s + act_s + wait_s + k.overhead_s + comm_s
    under_s = floor_s / x - busy_s if floor_s / x > busy_s else 0.0
    busy_s += under_s
    sm_w += act_s * c.stream_power + (wait_s + comm_s + under_s) * c.latency_power
    v = c.voltage_offset + (1.0 - c.voltage_offset) * x
    if v < c.voltage_floor:
        v = c.voltage_floor
    dram = (bytes_total + act_b) / (busy_s * k.bandwidth_bytes_s)
    return k.spec.idle_w + k.dynamic_w * (c.busy_power + c.hbm_power * dram + x * v * v * sm_w / busy_s)


def _at_clock(k: _Coeffs, t: _Terms, sm_clock_mhz: int, host_s: float, held_x: float) -> IterationEstimate:
    """The estimate of the iteration whose work is ``t`` with the SM clock at ``sm_clock_mhz``."""
    c = k.c
    x = sm_clock_mhz / k.f_max
    fps = k.flops_per_s * x
    bps = k.bytes_per_s
    compute_s = memory_s = kern_s = 0.0
    sm_w = act_w = occ_w = 0.0
    flops_total = bytes_total = 0.0
    ds = c.compute_power - c.stream_power
    da = c.sm_active_compute - c.sm_active_memory
    do = c.sm_occupancy_compute - c.sm_occupancy_memory
    terms, act_b, tokens, floor_s = t
    for f, b in terms:
        tc, tm = f / fps, b / bps
        tk = tc if tc > tm else tm
        if tk <= 0.0:
            continue
        u = tc / tk
        compute_s += tc
        memory_s += tm
        kern_s += tk
        sm_w += tk * (c.stream_power + ds * u)
        act_w += tk * (c.sm_active_memory + da * u)
        occ_w += tk * (c.sm_occupancy_memory + do * u)
        flops_total += f
        bytes_total += b
    # The small kernels (norms, rotary, activation, KV write, sampling): their traffic or their
    # clock-scaled latency floor, whichever is longer.
    act_s = act_b / bps
    latency_s = k.latency_s / x
    wait_s = latency_s - act_s if latency_s > act_s else 0.0  # latency-bound part of the small kernels
    memory_s += act_s
    bytes_total += act_b
    sm_w += act_s * c.stream_power
    act_w += act_s * c.sm_active_memory
    occ_w += act_s * c.sm_occupancy_memory
    comm_s = _comm_s(k, tokens)
    busy_s = kern_s + act_s + wait_s + k.overhead_s + comm_s
    # a prefill floor (EngineProfile.prefill_floor_cycles_per_layer) the work runs under: the rest waits
    under_s = floor_s / x - busy_s if floor_s / x > busy_s else 0.0
    busy_s += under_s
    wait_s += under_s
    fixed_s = wait_s + k.overhead_s
    sm_w += (wait_s + comm_s) * c.latency_power
    act_w += (wait_s + comm_s) * c.sm_active_memory * 0.5
    occ_w += (wait_s + comm_s) * c.sm_occupancy_memory * 0.5
    dram = bytes_total / (busy_s * k.bandwidth_bytes_s)
    v = c.voltage_offset + (1.0 - c.voltage_offset) * x
    if v < c.voltage_floor:
        v = c.voltage_floor
    power = k.spec.idle_w + k.dynamic_w * (c.busy_power + c.hbm_power * dram + x * v * v * sm_w / busy_s)
    if comm_s > max(compute_s, memory_s, fixed_s):
        bound: Bound = "comm"
    elif fixed_s >= max(compute_s, memory_s):
        bound = "overhead"
    else:
        bound = "compute" if compute_s >= memory_s else "memory"
    return IterationEstimate(
        time_s=host_s + busy_s,
        power_w=power,
        sm_clock_mhz=int(sm_clock_mhz),
        compute_s=compute_s,
        memory_s=memory_s,
        sm_active=act_w / busy_s,
        dram_active=dram,
        bound=bound,
        tensor_active=min(1.0, c.tensor_active_scale * compute_s / busy_s),
        sm_occupancy=occ_w / busy_s,
        flops=flops_total,
        hbm_bytes=bytes_total,
        host_s=host_s,
        busy_s=busy_s,
        comm_s=comm_s,
        host_energy_j=_gap_energy_scalar(k.spec, host_s, c, held_x) if host_s > 0 else 0.0,
        tp=k.tp,
    )


# Identity-keyed front of _coeffs: hashing the frozen dataclasses costs more than the model itself.
_FAST: dict[tuple[Any, ...], tuple[tuple[Any, ...], _Coeffs]] = {}


def _resolve(
    gpu: str | GpuSpec,
    shape: ModelConfig,
    constants: EmulationConstants,
    tp: int,
    link: str | LinkSpec,
    profile: str | EngineProfile | None,
) -> _Coeffs:
    # Names key by value; objects by identity, kept alive (and checked) in the entry so an id is
    # never reused for another object while its entry exists.
    key = (
        gpu if isinstance(gpu, str) else id(gpu),
        id(shape),
        id(constants),
        tp,
        link if isinstance(link, str) else id(link),
        profile if profile is None or isinstance(profile, str) else id(profile),
    )
    refs = (gpu, shape, constants, link, profile)
    hit = _FAST.get(key)
    if hit is not None:
        held = hit[0]
        if (
            held[1] is shape
            and held[2] is constants
            and (held[0] is gpu or isinstance(gpu, str))
            and (held[3] is link or isinstance(link, str))
            and (held[4] is profile or profile is None or isinstance(profile, str))
        ):
            return hit[1]
    k = _coeffs(gpu_spec(gpu), shape, tp, constants, engine_profile(profile), link_spec(link))
    if len(_FAST) > 1024:
        _FAST.clear()
    _FAST[key] = (refs, k)
    return k


def estimate_at_clock(
    gpu: str | GpuSpec,
    shape: ModelConfig,
    work: IterationWork,
    sm_clock_mhz: int,
    *,
    constants: EmulationConstants = DEFAULT_CONSTANTS,
    tp: int = 1,
    link: str | LinkSpec = "nvlink",
    profile: str | EngineProfile | None = None,
) -> IterationEstimate:
    """Model ``work`` on ``gpu`` with the SM clock fixed at ``sm_clock_mhz`` (no power limit applied).

    Each kernel class (the linear layers, the LM head for sampled rows, attention, the elementwise
    and activation traffic) takes ``max(FLOPs / (peak * eff * f/f_max), bytes / (bw * eff_m))``;
    the busy time adds the kernels' clock-scaled latency, a fixed overhead and the all-reduces.
    """
    k = _resolve(gpu, shape, constants, tp, link, profile)
    host_s = k.profile.host_s(work, tp, shape.num_layers)
    return _at_clock(k, _terms(k, work), sm_clock_mhz, host_s, sm_clock_mhz / k.f_max)


@functools.lru_cache(maxsize=256)
def _allowed_ceiling(spec: GpuSpec, sm_clock_range: tuple[int, int] | None) -> tuple[tuple[int, ...], int]:
    """The supported clocks and the index of the highest one the locked range allows."""
    clocks = spec.supported_sm_clocks_mhz()
    if sm_clock_range is None:
        return clocks, len(clocks) - 1
    low, high = sm_clock_range
    in_range = [i for i, f in enumerate(clocks) if low <= f <= high]
    if in_range:
        return clocks, in_range[-1]
    below = [i for i, f in enumerate(clocks) if f <= high]
    return clocks, below[-1] if below else 0


def predict_iteration(
    gpu: str | GpuSpec,
    shape: ModelConfig,
    work: IterationWork,
    *,
    power_limit_w: float | None = None,
    sm_clock_range: tuple[int, int] | None = None,
    constants: EmulationConstants = DEFAULT_CONSTANTS,
    tp: int = 1,
    link: str | LinkSpec = "nvlink",
    profile: str | EngineProfile | None = None,
) -> IterationEstimate:
    """Model one iteration of ``work`` for ``shape`` (bf16) on ``gpu`` under the given knobs.

    ``tp``: tensor-parallel degree; the estimate is one rank's (its shard, :func:`shard_shape`) plus
    two ring all-reduces per layer of ``tokens x hidden x 2`` bytes over ``link``. ``profile``: the
    engine (:data:`PROFILES` name or :class:`EngineProfile`; ``None`` = :data:`DEFAULT_PROFILE`),
    which sets the host time before the GPU work and the kernel count.

    The SM clock is the highest supported clock within ``sm_clock_range`` (all of them when
    ``None``) whose modeled busy power fits ``power_limit_w`` (default: the TDP). When even the
    lowest clock of the range does not fit, the power limit wins, as on real GPUs: the clock drops
    below the locked range, down to the minimum supported clock. ``power_capped`` says the limit
    bound. The clock search runs only when the limit binds at the top clock.
    """
    k = _resolve(gpu, shape, constants, tp, link, profile)
    host_s = k.profile.host_s(work, tp, shape.num_layers)
    limit = k.spec.tdp_w if power_limit_w is None else power_limit_w
    ceiling = k.ceilings.get(sm_clock_range)
    if ceiling is None:
        ceiling = k.ceilings[sm_clock_range] = _allowed_ceiling(k.spec, sm_clock_range)
    clocks, top = ceiling
    held_x = clocks[top] / k.f_max  # the host gap holds the allowed ceiling (a cap binds only when busy)
    t = _terms(k, work)
    best = _at_clock(k, t, clocks[top], host_s, held_x)
    if best.power_w <= limit:
        return best
    # Power rises monotonically with the clock: binary-search the highest clock that fits.
    lo, hi, fit = 0, top - 1, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if _busy_power_w(k, t, clocks[mid]) <= limit:
            fit, lo = mid, mid + 1
        else:
            hi = mid - 1
    return replace(_at_clock(k, t, clocks[fit], host_s, held_x), power_capped=True)


def weight_bytes(shape: ModelConfig, tp: int = 1) -> int:
    """bf16 weight bytes of one rank's shard of ``shape``."""
    return shard_shape(shape, tp).param_count() * BF16_BYTES
