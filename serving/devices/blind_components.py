"""Parts of the GPU model's iteration that published per-operator profiles measure on their own, for
the blind test of the GPU model (docs/FIDELITY.md, "Blind test"; serving/devices/blind_fidelity.py).

* :func:`layer_gpu_s` -- the model's GPU time of **one transformer layer's non-attention work** (the
  linear layers, norms, rotary, activation, residual add, and the KV write of the new tokens) for a
  prefill of ``tokens`` tokens on one tensor-parallel rank: no all-reduce, no host time, no per-iteration
  work (embedding, LM head, sampling, the fixed overhead). Read from the public
  :func:`~serving.devices.gpu_model.predict_iteration` only, so it follows whatever the model does.
* :func:`equivalent_gated_intermediate` -- the shape type (:class:`~serving.config.ModelConfig`) has a
  gated (SwiGLU) MLP of three ``hidden x intermediate`` matrices; a non-gated (GELU) MLP of width ``w``
  has two. The gated width with the same weights (so the same GEMM FLOPs and weight bytes) is
  ``2 w / 3``; the elementwise traffic of the activation is then that of the gated shape (an
  approximation, stated wherever it is used).
"""

from __future__ import annotations

import functools
from dataclasses import replace

from serving.config import ModelConfig
from serving.devices.base import IterationWork
from serving.devices.errors import DeviceValueError
from serving.devices.gpu_model import (
    DEFAULT_CONSTANTS,
    EmulationConstants,
    EngineProfile,
    predict_iteration,
    shard_shape,
)
from serving.devices.gpu_specs import GpuSpec

#: the layer counts the per-layer time is the slope between: large, so the per-iteration kernels'
#: latency cannot decide which side of the model's max(latency, traffic) of the small kernels wins
SLOPE_LAYERS = (1000, 2000)


def equivalent_gated_intermediate(mlp_width: int, multiple: int = 8) -> int:
    """The gated-MLP width with the weights of a non-gated MLP of ``mlp_width`` (``2 w / 3``), rounded
    to the nearest multiple of ``multiple`` (so a tensor-parallel shard of up to 8 ranks splits it
    evenly); the weights differ from ``2 x hidden x w`` by less than ``1.5 x multiple / w``."""
    if mlp_width <= 0 or multiple <= 0:
        raise DeviceValueError(
            f"equivalent_gated_intermediate: mlp_width and multiple must be > 0, got {mlp_width!r}, {multiple!r}"
        )
    return max(multiple, round(2 * mlp_width / 3 / multiple) * multiple)


def prefill_layer_work(tokens: int) -> IterationWork:
    """A prefill of ``tokens`` tokens with no attention pairs, no context read and no sampled row: the
    iteration whose per-layer GPU time is the layer's non-attention work."""
    if tokens <= 0:
        raise DeviceValueError(f"prefill_layer_work: tokens must be > 0, got {tokens!r}")
    return IterationWork(
        "prefill",
        prefill_tokens=tokens,
        decode_seqs=0,
        context_tokens=0,
        batch_size=1,
        attention_pairs=0,
        sampled_seqs=0,
    )


@functools.lru_cache(maxsize=256)
def _with_layers(shape: ModelConfig, layers: int) -> ModelConfig:
    # one object per (shape, layers): the model's own cache keys shapes by identity
    return replace(shape, num_layers=layers)


def layer_gpu_s(
    gpu: str | GpuSpec,
    shape: ModelConfig,
    tokens: int,
    *,
    tp: int = 1,
    profile: str | EngineProfile | None = None,
    constants: EmulationConstants = DEFAULT_CONSTANTS,
    power_limit_w: float | None = None,
) -> float:
    """Seconds of GPU time of one layer's non-attention work for a prefill of ``tokens`` tokens on one
    rank of a ``tp``-way shard of ``shape``, as the GPU model prices it.

    The iteration is :func:`prefill_layer_work` on the rank's shard (:func:`shard_shape`) run as one GPU
    (``tp=1``: no all-reduce is modeled at all), and the figure is its GPU-busy time (``busy_s``: no host
    time) per layer, taken as the slope between :data:`SLOPE_LAYERS` layers so the per-iteration parts
    (embedding-side kernels, the fixed overhead) drop out. It includes the layer's share of the model's
    small-kernel latency floor and, at an iteration big enough to bind, the clock the power limit leaves
    (the same at both layer counts: the work's mix is the same). The engine ``profile`` sets the small
    kernels per layer, any GEMM factor and any prefill floor (a floor makes this the floor's slope)."""
    shard = shard_shape(shape, tp)
    work = prefill_layer_work(tokens)
    low, high = SLOPE_LAYERS
    busy = []
    for layers in (low, high):
        est = predict_iteration(
            gpu,
            _with_layers(shard, layers),
            work,
            power_limit_w=power_limit_w,
            constants=constants,
            tp=1,
            profile=profile,
        )
        busy.append(est.busy_s - est.comm_s)
    return (busy[1] - busy[0]) / (high - low)
