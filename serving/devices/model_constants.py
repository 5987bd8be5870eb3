"""The GPU model's constants (serving/devices/gpu_model.py): the calibrated EmulationConstants and
the fixed sizes every part of the model uses; their sources are in docs/EMULATION.md."""

from __future__ import annotations

from dataclasses import dataclass

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
    gemm_efficiency_by_gpu: tuple[tuple[str, float], ...] = (("a100-sxm-80gb", 0.71),)
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
    latency_power: float = 0.04  # SM power through kernel ramp/tail and latency waits (prefill floor)
    # SM power through a tensor-parallel collective: its kernels copy over NVLink, reduce and poll
    # flags on the SMs (a running kernel, not a wait); the collective's HBM traffic is priced by
    # hbm_power through comm_hbm_passes
    comm_power: float = 0.67
    comm_hbm_passes: float = 2.0  # HBM bytes per all-reduce message byte (read the input, write the result)
    hbm_power: float = 0.09  # HBM and controllers at peak bandwidth (memory clock, not SM clock)
    # (gpu key, hbm_power) where a GPU's memory system draws a different share of its own D at peak
    # bandwidth (see hbm_power_for); every other GPU uses hbm_power
    hbm_power_by_gpu: tuple[tuple[str, float], ...] = (("a100-sxm-80gb", 0.685),)
    busy_power: float = 0.08  # clock-independent power whenever a kernel runs
    # SM power ~ (f/f_max) * V(f)^2 with V(f)/V_max = max(voltage_floor, v0 + (1 - v0) * f/f_max)
    voltage_offset: float = 0.31  # v0
    voltage_floor: float = 0.68
    # activity counters (GPM-like), calibrated to the H200 readings of this engine
    # SM activity from the work (gpu_model.py, _sm_fills): a kernel class reads sm_active_resident x
    # the fraction of SMs its CTAs fill; kernel ramp/tail waits half of that, all-reduces their CTAs'
    sm_active_resident: float = 0.55  # reading with every SM holding work (H200 GPM, this engine's prefill)
    gemm_tile: int = 128  # CTA tile (tokens and output features) of the fill model's GEMMs
    gemm_split_k_min: int = 1024  # least K per split when a GEMM splits K to fill the SMs
    attention_query_tile: int = 128  # prefill attention: query tokens per CTA (per head)
    attention_kv_split: int = 512  # decode attention: context tokens per CTA (split-KV, per KV head)
    elementwise_block: int = 1024  # elements per CTA of the small kernels
    allreduce_ctas: int = 32  # CTAs an all-reduce runs on (NCCL channels / the custom kernel's blocks)
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
        prefill rows. Ampere (A100): 0.71 of its 312 TF/s peak, fitted (v3) with the ``splitwise-2023``
        profile on the Splitwise A100 calibration units (bench/fidelity_table.py, ``gpu.gemm_a100``;
        v2: 0.75 on the three TensorRT-LLM v0.5 rows). Ampere's ``mma.sync``
        GEMMs were mature in every 2023 library and reach a larger share of a 3.2x lower peak than
        Hopper's, whose dense peak needs ``wgmma`` kernels kept fed at the TDP.
        """
        for key, eff in self.gemm_efficiency_by_gpu:
            if key == gpu_key:
                return eff
        return self.gemm_efficiency

    def hbm_power_for(self, gpu_key: str) -> float:
        """Power of ``gpu_key``'s memory system at peak bandwidth, a fraction of its ``tdp_w - idle_w``
        (:attr:`hbm_power` unless :attr:`hbm_power_by_gpu` names the GPU)."""
        for key, value in self.hbm_power_by_gpu:
            if key == gpu_key:
                return value
        return self.hbm_power


DEFAULT_CONSTANTS = EmulationConstants()
