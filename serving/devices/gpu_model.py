"""The GPU model (v2): one engine iteration's time, power, clock and activities on a modeled GPU.

One implementation shared by the live emulated GPU (:class:`~serving.devices.emulated.EmulatedDevice`)
and the discrete-event simulator (``serving.sim``). Everything here is pure and cheap:

* :func:`predict_iteration` -- an iteration of :class:`~serving.devices.base.IterationWork` for a
  model shape (bf16, or fp8 weights and KV) on a GPU under a power limit / locked SM clocks, with tensor parallelism over a
  link and an engine's host time (:class:`EngineProfile`). Wall time ``time_s = host_s + busy_s``.
* :func:`shard_shape`, :func:`kv_capacity_tokens`, :func:`kv_transfer_s` -- tensor-parallel shards,
  KV capacity per GPU, prefill -> decode KV hand-off over a :class:`LinkSpec`.
* :func:`gap_power_w`, :func:`gap_energy_j`, :func:`gap_sm_clock_mhz` -- the GPU between iterations
  (boost clock and elevated power through short gaps, true idle only after a sustained one); they take
  floats or numpy arrays (:mod:`serving.devices.gap_model`).

Its parts live beside it and are re-exported here: :mod:`serving.devices.model_constants`,
:mod:`serving.devices.engine_profiles`, :mod:`serving.devices.links`. The equations, constants
and their sources are in ``docs/EMULATION.md``; the calibration against
published serving measurements is ``bench/fidelity_table.py`` / ``docs/FIDELITY.md``.

Energy: ``IterationEstimate.power_w`` is the mean power while the GPU is busy, so the busy energy is
``power_w * busy_s`` (:attr:`IterationEstimate.busy_energy_j`). The host gap before the GPU work is
priced by the gap-power model: :attr:`IterationEstimate.host_energy_j` is
``gap_energy_j(gpu, host_s)`` (the gap right after the previous iteration's busy interval, i.e.
back-to-back iterations), and :attr:`IterationEstimate.energy_j` is their sum, the whole iteration.

Its other parts: :mod:`serving.devices.roofline` (the work count, MFU/MBU and the SM fill the
activities follow from), :mod:`serving.devices.gap_model` (the GPU between iterations) and
:mod:`serving.devices.iteration_estimate` (what it returns).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from serving.config import ModelConfig
from serving.devices.base import IterationWork
from serving.devices.engine_profiles import DEFAULT_PROFILE, PROFILES, EngineProfile, engine_profile
from serving.devices.gap_model import (
    _gap_energy_scalar,
    gap_energy_j,
    gap_power_w,
    gap_sm_clock_mhz,
)
from serving.devices.gpu_specs import DTYPES, GpuSpec, check_dtype, fidelity, gpu_spec
from serving.devices.iteration_estimate import Bound, IterationEstimate
from serving.devices.links import LINKS, LinkSpec, kv_capacity_tokens, kv_transfer_s, link_spec, shard_shape
from serving.devices.model_constants import (
    ALLOWED_TP,
    BF16_BYTES,
    CONTEXT_BYTES,
    DEFAULT_CONSTANTS,
    EmulationConstants,
)
from serving.devices.roofline import RankDims, WorkCount, count_work, rank_dims_of_shape, sm_fills

#: the GPU model's public names: its own and those of its parts (engine profiles, links and
#: shards, constants), so callers import the model from one place
__all__ = [
    "ALLOWED_TP",
    "BF16_BYTES",
    "CONTEXT_BYTES",
    "DEFAULT_CONSTANTS",
    "DEFAULT_PROFILE",
    "LINKS",
    "PROFILES",
    "Bound",
    "EmulationConstants",
    "EngineProfile",
    "IterationEstimate",
    "LinkSpec",
    "engine_profile",
    "estimate_at_clock",
    "gap_energy_j",
    "gap_power_w",
    "gap_sm_clock_mhz",
    "iteration_predictor",
    "kv_capacity_tokens",
    "kv_transfer_s",
    "link_spec",
    "predict_iteration",
    "shard_shape",
    "weight_bytes",
]


# --- one iteration ----------------------------------------------------------------------------------


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
    dims: RankDims  # the rank's shard, for the roofline count and the SM fill
    weight_bytes_per_param: float  # the dtype's (bf16 2, fp8 1)
    dtype: str
    validated: bool
    peak_flops_s: float  # the dtype's dense tensor peak at f_max (MFU's yardstick)
    fill_cache: dict[tuple[str, int], float]  # SM fills of the GEMMs by rows (roofline.sm_fills)
    comm_bytes_per_token: float = 0.0  # all-reduce message bytes per token per iteration (power)
    hbm_power: float = 0.0  # EmulationConstants.hbm_power_for this GPU


@functools.lru_cache(maxsize=256)
def _coeffs(
    spec: GpuSpec,
    shape: ModelConfig,
    tp: int,
    c: EmulationConstants,
    profile: EngineProfile,
    link: LinkSpec,
    dtype: str = "bf16",
) -> _Coeffs:
    weight_b, kv_b = DTYPES[check_dtype(dtype)]
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
        kv_bytes_per_token=shard.kv_bytes_per_token(kv_b),
        kv_read_bytes_per_token=shard.kv_bytes_per_token(kv_b)
        * (shard.num_heads // shard.num_kv_heads if profile.gqa_unaware_attention else 1),
        attn_flops_per_pair=4 * shard.num_layers * shard.num_heads * shard.head_dim,
        act_bytes_per_token=c.activation_passes
        * (shard.hidden_size + shard.intermediate_size)
        * shard.num_layers
        * BF16_BYTES,
        weight_bytes=total * weight_b,
        flops_per_s=spec.peak_flops_for(dtype)
        * c.gemm_efficiency_for(spec.key)
        * profile.gemm_scale(spec.key),
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
        dims=rank_dims_of_shape(shape, tp, dtype),
        weight_bytes_per_param=float(weight_b),
        dtype=dtype,
        validated=fidelity(spec, dtype)[0],
        peak_flops_s=spec.peak_flops_for(dtype),
        fill_cache={},
        comm_bytes_per_token=message_bytes_per_token,
        hbm_power=c.hbm_power_for(spec.key),
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
        terms.append((2.0 * k.body_params * padded, k.weight_bytes_per_param * k.body_params))
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
        terms.append((2.0 * k.lm_head_params * padded_s, k.weight_bytes_per_param * k.lm_head_params))
    floor_s = k.prefill_floor_s if work.prefill_tokens > 0 else 0.0
    return tuple(terms), act_b, tokens, floor_s


def _comm_s(k: _Coeffs, tokens: int) -> float:
    """The all-reduces of an iteration of ``tokens`` tokens: each call's latency plus the transfer,
    by the engine's custom all-reduce while the message fits its buffer, by the ring beyond."""
    if not (k.comm_calls and tokens):
        return 0.0
    per_token = k.comm_fallback_s_per_token if tokens > k.comm_fallback_tokens else k.comm_s_per_token
    return k.comm_calls * k.comm_call_s + per_token * tokens


def _power_w(
    k: _Coeffs, x: float, sm_w: float, busy_s: float, hbm_bytes: float, comm_s: float, tokens: int
) -> float:
    """Busy power: ``sm_w`` (the kernels' and waits' SM power-seconds, fractions of D at f_max) plus
    the collective's, scaled by ``x V(x)^2``; the clock-independent busy power; the memory system's
    power in proportion to the HBM traffic, the kernels' ``hbm_bytes`` and the collective's own
    (``comm_hbm_passes`` x its message bytes) over ``busy_s``."""
    c = k.c
    comm_b = 0.0
    if comm_s > 0.0:
        # the per-call latency (ring steps, synchronisation) is a wait; the transfer moves and reduces data
        lat_s = k.comm_calls * k.comm_call_s
        lat_s = lat_s if lat_s < comm_s else comm_s
        sm_w += lat_s * c.latency_power + (comm_s - lat_s) * c.comm_power
        comm_b = c.comm_hbm_passes * k.comm_bytes_per_token * tokens
    v = c.voltage_offset + (1.0 - c.voltage_offset) * x
    if v < c.voltage_floor:
        v = c.voltage_floor
    hbm = (hbm_bytes + comm_b) / (busy_s * k.bandwidth_bytes_s)
    return k.spec.idle_w + k.dynamic_w * (c.busy_power + k.hbm_power * hbm + x * v * v * sm_w / busy_s)


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
    sm_w += act_s * c.stream_power + (wait_s + under_s) * c.latency_power
    return _power_w(k, x, sm_w, busy_s, bytes_total + act_b, comm_s, tokens)


_Roof = tuple[
    WorkCount, tuple[float, ...], float, float
]  # count, fill per term, small kernels', all-reduce's


def _roof(k: _Coeffs, work: IterationWork) -> _Roof:
    """The clock-independent roofline parts of an iteration: its work count and its SM fills."""
    fills, small, comm = sm_fills(k.dims, k.spec.num_sms, k.c, work, k.fill_cache)
    return count_work(k.dims, work), fills, small, comm


def _at_clock(
    k: _Coeffs, t: _Terms, sm_clock_mhz: int, host_s: float, held_x: float, roof: _Roof
) -> IterationEstimate:
    """The estimate of the iteration whose work is ``t`` with the SM clock at ``sm_clock_mhz``;
    ``roof`` (:func:`_roof`): its work count and the SM fills its activities follow from."""
    c = k.c
    x = sm_clock_mhz / k.f_max
    fps = k.flops_per_s * x
    bps = k.bytes_per_s
    compute_s = memory_s = kern_s = 0.0
    sm_w = act_w = occ_w = 0.0
    flops_total = bytes_total = 0.0
    ds = c.compute_power - c.stream_power
    do = c.sm_occupancy_compute - c.sm_occupancy_memory
    terms, act_b, tokens, floor_s = t
    count, fills, small_fill, comm_fill = roof
    for (f, b), fill in zip(terms, fills, strict=True):
        tc, tm = f / fps, b / bps
        tk = tc if tc > tm else tm
        if tk <= 0.0:
            continue
        u = tc / tk
        compute_s += tc
        memory_s += tm
        kern_s += tk
        flops_total += f
        sm_w += tk * (c.stream_power + ds * u)
        act_w += tk * fill
        occ_w += tk * (c.sm_occupancy_memory + do * u)
        bytes_total += b
    # The small kernels (norms, rotary, activation, KV write, sampling): their traffic or their
    # clock-scaled latency floor, whichever is longer.
    act_s = act_b / bps
    latency_s = k.latency_s / x
    wait_s = latency_s - act_s if latency_s > act_s else 0.0  # latency-bound part of the small kernels
    memory_s += act_s
    bytes_total += act_b
    sm_w += act_s * c.stream_power
    act_w += act_s * small_fill
    occ_w += act_s * c.sm_occupancy_memory
    comm_s = _comm_s(k, tokens)
    busy_s = kern_s + act_s + wait_s + k.overhead_s + comm_s
    # a prefill floor (EngineProfile.prefill_floor_cycles_per_layer) the work runs under: the rest waits
    under_s = floor_s / x - busy_s if floor_s / x > busy_s else 0.0
    busy_s += under_s
    wait_s += under_s
    fixed_s = wait_s + k.overhead_s
    sm_w += wait_s * c.latency_power
    act_w += wait_s * 0.5 * max(fills, default=small_fill) + comm_s * comm_fill  # ramp/tail: half filled
    occ_w += (wait_s + comm_s) * c.sm_occupancy_memory * 0.5
    dram = bytes_total / (busy_s * k.bandwidth_bytes_s)
    power = _power_w(k, x, sm_w, busy_s, bytes_total, comm_s, tokens)
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
        sm_active=c.sm_active_resident * act_w / busy_s,
        dram_active=dram,
        bound=bound,
        tensor_active=min(1.0, c.tensor_active_scale * compute_s / busy_s),
        sm_occupancy=occ_w / busy_s,
        flops=count.flops,
        hbm_bytes=count.hbm_bytes,
        host_s=host_s,
        busy_s=busy_s,
        comm_s=comm_s,
        host_energy_j=_gap_energy_scalar(k.spec, host_s, c, held_x) if host_s > 0 else 0.0,
        tp=k.tp,
        peak_flops_s=k.peak_flops_s,
        peak_bytes_s=k.bandwidth_bytes_s,
        dtype=k.dtype,
        validated=k.validated,
        executed_flops=flops_total,
        executed_bytes=bytes_total,
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
    dtype: str = "bf16",
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
        dtype,
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
    k = _coeffs(gpu_spec(gpu), shape, tp, constants, engine_profile(profile), link_spec(link), dtype)
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
    dtype: str = "bf16",
) -> IterationEstimate:
    """Model ``work`` on ``gpu`` with the SM clock fixed at ``sm_clock_mhz`` (no power limit applied).

    Each kernel class (the linear layers, the LM head for sampled rows, attention, the elementwise
    and activation traffic) takes ``max(FLOPs / (peak * eff * f/f_max), bytes / (bw * eff_m))``;
    the busy time adds the kernels' clock-scaled latency, a fixed overhead and the all-reduces.
    """
    k = _resolve(gpu, shape, constants, tp, link, profile, dtype)
    host_s = k.profile.host_s(work, tp, shape.num_layers)
    return _at_clock(k, _terms(k, work), sm_clock_mhz, host_s, sm_clock_mhz / k.f_max, _roof(k, work))


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
    dtype: str = "bf16",
) -> IterationEstimate:
    """Model one iteration of ``work`` for ``shape`` on ``gpu`` under the given knobs.

    ``dtype``: ``bf16`` (default) or ``fp8`` weights and KV (the dense FP8 peak, one byte per weight
    and KV element; activations and all-reduces stay bf16). On a GPU or dtype the model was not
    validated on (:func:`~serving.devices.gpu_specs.fidelity`) the estimate has ``validated=False``.

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
    k = _resolve(gpu, shape, constants, tp, link, profile, dtype)
    clocks, top = _ceiling(k, sm_clock_range)
    limit = k.spec.tdp_w if power_limit_w is None else power_limit_w
    return _predict(k, work, k.profile.host_s(work, tp, shape.num_layers), limit, clocks, top)


def iteration_predictor(
    gpu: str | GpuSpec,
    shape: ModelConfig,
    *,
    power_limit_w: float | None = None,
    sm_clock_range: tuple[int, int] | None = None,
    constants: EmulationConstants = DEFAULT_CONSTANTS,
    tp: int = 1,
    link: str | LinkSpec = "nvlink",
    profile: str | EngineProfile | None = None,
    dtype: str = "bf16",
) -> Callable[[IterationWork], IterationEstimate]:
    """:func:`predict_iteration` with its knobs bound, for a caller that predicts many iterations of
    one configuration (the simulator's executor): the same estimates, the configuration resolved
    once and the host time kept per (batch, decode, prefill) counts, all it depends on."""
    k = _resolve(gpu, shape, constants, tp, link, profile, dtype)
    clocks, top = _ceiling(k, sm_clock_range)
    limit = k.spec.tdp_w if power_limit_w is None else power_limit_w
    host_of, layers = k.profile.host_s, shape.num_layers
    hosts: dict[tuple[int, int, int], float] = {}

    def predict(work: IterationWork) -> IterationEstimate:
        key = (work.batch_size, work.decode_seqs, work.prefill_tokens)
        host_s = hosts.get(key)
        if host_s is None:
            host_s = hosts[key] = host_of(work, tp, layers)
        return _predict(k, work, host_s, limit, clocks, top)

    return predict


def _ceiling(k: _Coeffs, sm_clock_range: tuple[int, int] | None) -> tuple[tuple[int, ...], int]:
    ceiling = k.ceilings.get(sm_clock_range)
    if ceiling is None:
        ceiling = k.ceilings[sm_clock_range] = _allowed_ceiling(k.spec, sm_clock_range)
    return ceiling


def _predict(
    k: _Coeffs, work: IterationWork, host_s: float, limit: float, clocks: tuple[int, ...], top: int
) -> IterationEstimate:
    """:func:`predict_iteration`'s search for the clock, its knobs resolved."""
    held_x = clocks[top] / k.f_max  # the host gap holds the allowed ceiling (a cap binds only when busy)
    t = _terms(k, work)
    roof = _roof(k, work)
    best = _at_clock(k, t, clocks[top], host_s, held_x, roof)
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
    return replace(_at_clock(k, t, clocks[fit], host_s, held_x, roof), power_capped=True)


def weight_bytes(shape: ModelConfig, tp: int = 1, dtype: str = "bf16") -> int:
    """Weight bytes of one rank's shard of ``shape`` in ``dtype`` (bf16: 2 per parameter, fp8: 1)."""
    return shard_shape(shape, tp).param_count() * DTYPES[check_dtype(dtype)][0]
