"""Serving engines' host cost around the GPU work of an iteration (:class:`EngineProfile`), one
profile per engine in :data:`PROFILES`; part of the GPU model (serving/devices/gpu_model.py)."""

from __future__ import annotations

from dataclasses import dataclass

from serving.devices.base import IterationWork
from serving.devices.errors import DeviceValueError

# --- engine profiles --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """A serving engine's cost around the GPU work of one iteration.

    Host time (GPU idle, placed before the iteration's GPU work):
    ``step_s + per_seq_s * batch + per_prefill_seq_s * prefilling seqs + per_prefill_step_s (once if
    the iteration computes prompt tokens) + per_prefill_token_s * prefill tokens + per_tp_rank_s *
    (tp - 1) + per_layer_s * layers``. GPU-side engine costs: ``kernels_per_layer``
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
    TP 4 and 29.8 ms at TP 8 on H100). Its fitted value there (v3: 4.33, 6.5 us per step on NVLink 4) is
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
    per_prefill_step_s: float = 0.0  # ... once per iteration that computes prompt tokens
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
            + (self.per_prefill_step_s if work.prefill_tokens > 0 else 0.0)
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
        step_s=1.22e-3,
        kernels_per_layer=5.0,
        allreduce_overhead_s=9.4e-6,
        description="vLLM (CUDA graphs for decode, custom all-reduce): host time per step fitted; the "
        "per-sequence and per-token host costs are not identifiable from the published runs (all batch 8) "
        "and are left at 0",
        source="fit on vLLM CI latency_llama8B_tp1 and latency_llama70B_tp4 (H100 build 9555, H200 9513, "
        "A100 9523: 6 rows, 2 constants); bench/fidelity_table.py",
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
        per_seq_s=1.9e-4,
        kernels_per_layer=16.1,
        allreduce_bandwidth_scale=0.26,
        allreduce_step_scale=4.33,
        custom_allreduce_max_bytes=50_331_648.0,
        fallback_allreduce_bandwidth_scale=0.218,
        prefill_floor_cycles_per_layer=1.335e6,
        gqa_unaware_attention=True,
        description="the 2023 stack behind the Splitwise profiling data (no CUDA graphs; a custom all-reduce "
        "up to 48 MiB at ~26 % of NVLink bandwidth per message, NCCL's ring beyond at ~22 %; ~4.3 link "
        "latencies per ring step; decode attention reading K/V per query head; a prefill floor of "
        "~1.3M SM cycles per layer that the prompt's GPU work runs under; no per-prompt host cost: the "
        "batches of prompts on H100 cost what one prompt of their tokens does)",
        source="fit (v3) on the 66 calibration units of Splitwise perf_model.csv (serving/devices/"
        "fidelity_sets.py), with the A100 GEMM efficiency; bench/fidelity_table.py; the 48 MiB limit is "
        "FasterTransformer's and TensorRT-LLM's CUSTOM_AR_SIZE_THRESHOLD",
    ),
    "trtllm-0.5": EngineProfile(
        name="trtllm-0.5",
        per_prefill_seq_s=6.2e-3,
        kernels_per_layer=5.0,
        allreduce_overhead_s=7.7e-5,
        description="TensorRT-LLM v0.5 (fused kernels; GEMMs at the GPU's own efficiency)",
        source="fit on TensorRT-LLM v0.5 A100 first-token latency: Llama-2-7B 128/2048, 70B TP 4 128 "
        "(2 constants on 3 rows: below the protocol's 3 per constant, no more fp16 rows published; the A100 "
        "GEMM efficiency is the GPU model's, fitted on Splitwise's A100 units); bench/fidelity_table.py",
    ),
    "turbomind-0.1": EngineProfile(
        name="turbomind-0.1",
        per_prefill_seq_s=4.4e-3,
        kernels_per_layer=3.0,
        allreduce_overhead_s=5.9e-5,
        description="LMDeploy v0.1 TurboMind (C++ engine derived from FasterTransformer, persistent batch, "
        "fused kernels; NCCL ring all-reduce)",
        source="fit on the calibration units of LMDeploy's A100 static inference benchmark "
        "(serving/devices/published_lmdeploy.py); bench/fidelity_table.py",
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
