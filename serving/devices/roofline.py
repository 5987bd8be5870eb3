"""An iteration's work against the roofline: its FLOPs and HBM bytes, and what they make of its time.

One counting rule, used twice (issue 23 point 4):

* the GPU model (:func:`serving.devices.gpu_model.predict_iteration`) counts an emulated or simulated
  iteration's work from the model shape's tensor-parallel shard (:func:`rank_dims_of_shape`);
* the live torch engine counts its own iterations from the shapes of the tensors it really holds
  (``serving.engine.live_rank_dims``: weight matrices, KV cache element size), not from a config.

Both hand :func:`count_work` the same per-rank dimensions and the iteration's
:class:`~serving.devices.base.IterationWork`, so the same work gives the same count. The count is the
work the model needs, not what a given engine happens to execute: no GEMM tile padding, KV read once
per KV head (an engine that re-reads it per query head moves more bytes than the count), one rank's
shard. Per iteration and rank:

* FLOPs = ``2 · body_params · tokens`` (every linear layer, one multiply-add per weight per token)
  ``+ 4 · layers · heads · head_dim · attention_pairs`` (QK^T and PV over the attended pairs)
  ``+ 2 · lm_head_params · sampled_seqs`` (the LM head, rows that sample);
* HBM bytes = weights read once (``body_params``, plus the LM head when a row samples, at the weight
  dtype's bytes) ``+`` KV read (``context_tokens`` × KV bytes per token) and written (``tokens`` × KV
  bytes per token) ``+`` activations: each linear layer's input read and output written once per token
  (``4·hidden + 2·heads·head_dim + 2·kv_heads·head_dim + 3·intermediate`` per layer, bf16), and the LM
  head's input and logits per sampled row. Elementwise kernels (norms, rotary, residual adds) are not
  counted: a fused engine does not move them through HBM.

MFU = FLOPs / (busy_s · dense peak FLOP/s of the dtype); MBU = bytes / (busy_s · peak HBM bytes/s).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from serving.config import ModelConfig
from serving.devices.base import IterationWork
from serving.devices.gpu_specs import DTYPES, GpuSpec, check_dtype
from serving.devices.links import shard_shape

ACT_BYTES = 2  # activations stay bf16 under FP8 weights and KV


@dataclass(frozen=True, slots=True)
class RankDims:
    """What one tensor-parallel rank holds, for counting its work: parameter counts (the layers'
    linear weights and norms as ``body_params``, the LM head apart), the attention shape of its shard,
    and the bytes of one weight and of one KV element."""

    layers: int
    hidden: int
    intermediate: int  # this rank's MLP width
    heads: int  # this rank's query heads
    kv_heads: int  # this rank's KV heads
    head_dim: int
    vocab: int  # this rank's LM-head rows
    body_params: int  # every weight an iteration's tokens go through, the LM head and embedding excluded
    lm_head_params: int
    weight_bytes: int  # bytes per weight
    kv_bytes: int  # bytes per KV element
    # derived in __post_init__ (the per-iteration count reads them)
    kv_bytes_per_token: int = field(init=False, compare=False)  # K and V of a token, all layers
    act_bytes_per_token: int = field(init=False, compare=False)  # a token's linear-layer activations
    attn_flops_per_pair: int = field(init=False, compare=False)

    def __post_init__(self) -> None:
        per_layer = (
            4 * self.hidden
            + 2 * self.heads * self.head_dim
            + 2 * self.kv_heads * self.head_dim
            + 3 * self.intermediate
        )
        object.__setattr__(
            self, "kv_bytes_per_token", 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes
        )
        object.__setattr__(self, "act_bytes_per_token", self.layers * per_layer * ACT_BYTES)
        object.__setattr__(self, "attn_flops_per_pair", 4 * self.layers * self.heads * self.head_dim)


@dataclass(frozen=True, slots=True)
class WorkCount:
    """One iteration's work on one rank: FLOPs and HBM bytes."""

    flops: float
    hbm_bytes: float


def rank_dims_of_shape(shape: ModelConfig, tp: int = 1, dtype: str = "bf16") -> RankDims:
    """The per-rank dimensions of ``shape`` sharded ``tp`` ways (:func:`shard_shape`) in ``dtype``."""
    weight_b, kv_b = DTYPES[check_dtype(dtype)]
    shard = shard_shape(shape, tp)
    d = shard.hidden_size
    lm_head = shard.vocab_size * d
    embed = shard.vocab_size * d
    body = shard.param_count() - embed - (0 if shard.tie_word_embeddings else lm_head)
    return RankDims(
        layers=shard.num_layers,
        hidden=d,
        intermediate=shard.intermediate_size,
        heads=shard.num_heads,
        kv_heads=shard.num_kv_heads,
        head_dim=shard.head_dim,
        vocab=shard.vocab_size,
        body_params=body,
        lm_head_params=lm_head,
        weight_bytes=weight_b,
        kv_bytes=kv_b,
    )


def count_work(dims: RankDims, work: IterationWork) -> WorkCount:
    """The FLOPs and HBM bytes of ``work`` on a rank of ``dims`` (the rule in the module docstring)."""
    p, d, s = work.prefill_tokens, work.decode_seqs, work.sampled_seqs
    tokens = (p if p > 0 else 0) + (d if d > 0 else 0)
    sampled = s if s > 0 else 0
    flops = 0.0
    hbm = 0.0
    if tokens:
        pairs, ctx = work.attention_pairs, work.context_tokens
        flops = 2.0 * dims.body_params * tokens + float(
            dims.attn_flops_per_pair * (pairs if pairs > 0 else 0)
        )
        hbm = float(
            dims.body_params * dims.weight_bytes
            + dims.kv_bytes_per_token * ((ctx if ctx > 0 else 0) + tokens)
            + dims.act_bytes_per_token * tokens
        )
    if sampled:
        flops += 2.0 * dims.lm_head_params * sampled
        hbm += float(dims.lm_head_params * dims.weight_bytes)
        hbm += float(sampled * (dims.hidden + dims.vocab) * ACT_BYTES)
    return WorkCount(flops, hbm)


def mfu(flops: float, busy_s: float, spec: GpuSpec, dtype: str = "bf16") -> float | None:
    """Model FLOPs utilisation: ``flops / (busy_s · dense peak of dtype)``; None without busy time."""
    if busy_s <= 0:
        return None
    return flops / (busy_s * spec.peak_flops_for(dtype))


def mbu(hbm_bytes: float, busy_s: float, spec: GpuSpec) -> float | None:
    """Memory-bandwidth utilisation: ``bytes / (busy_s · peak HBM bytes/s)``; None without busy time."""
    if busy_s <= 0:
        return None
    return hbm_bytes / (busy_s * spec.bandwidth_bytes_s)


def _gemm_fill(m: int, n: int, k: int, sms: int, tile: int, split_min: int) -> float:
    """Fraction of ``sms`` SMs a ``m x n (x k)`` GEMM's CTAs fill: ``tile x tile`` output tiles, K split
    (as split-K / stream-K kernels do) while the tiles leave SMs idle and each split keeps ``split_min``."""
    tiles = -(-m // tile) * -(-n // tile)
    split = max(1, min(-(-sms // tiles), k // split_min))
    return min(1.0, tiles * split / sms)


def sm_fills(
    dims: RankDims, sms: int, c: Any, work: IterationWork, cache: dict[tuple[str, int], float] | None = None
) -> tuple[tuple[float, ...], float, float]:
    """The fraction of the GPU's ``sms`` SMs with resident work during each kernel class of ``work``:
    (the classes of the GPU model's terms, in its order: the linear layers and attention when the
    iteration has tokens, the LM head when it samples), the small elementwise kernels, an all-reduce.
    ``c``: the :class:`~serving.devices.model_constants.EmulationConstants` (tile sizes); ``cache``:
    the GEMM fills by row count, kept by the caller for one (dims, sms, c)."""
    p, d, s = work.prefill_tokens, work.decode_seqs, work.sampled_seqs
    tokens = (p if p > 0 else 0) + (d if d > 0 else 0)
    sampled = s if s > 0 else 0
    tile, split = c.gemm_tile, c.gemm_split_k_min
    fills: list[float] = []
    if tokens:
        linear = None if cache is None else cache.get(("linear", tokens))
        if linear is None:
            h, hd = dims.hidden, dims.head_dim
            gemms = (  # (N, K) of each linear layer of one decoder layer
                ((dims.heads + 2 * dims.kv_heads) * hd, h),
                (h, dims.heads * hd),
                (2 * dims.intermediate, h),
                (h, dims.intermediate),
            )
            weight = sum(n * k for n, k in gemms)
            linear = sum(n * k * _gemm_fill(tokens, n, k, sms, tile, split) for n, k in gemms) / weight
            if cache is not None and len(cache) < 65536:
                cache["linear", tokens] = linear
        fills.append(linear)
        units = 0
        if d > 0:
            ctx = work.context_tokens // (work.batch_size if work.batch_size > 0 else 1)
            units = d * dims.kv_heads * (-(-ctx // c.attention_kv_split) if ctx > 0 else 1)
        if p > 0:
            units += -(-p // c.attention_query_tile) * dims.heads
        fills.append(units / sms if units < sms else 1.0)
    if sampled:
        head = None if cache is None else cache.get(("head", sampled))
        if head is None:
            head = _gemm_fill(sampled, dims.vocab, dims.hidden, sms, tile, split)
            if cache is not None and len(cache) < 65536:
                cache["head", sampled] = head
        fills.append(head)
    small = min(1.0, tokens * dims.hidden / (sms * c.elementwise_block))
    comm = min(1.0, c.allreduce_ctas / sms)
    return tuple(fills), small, comm
