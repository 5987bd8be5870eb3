"""Llama-architecture decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) over a paged KV cache.

Module and parameter names follow Hugging Face `LlamaForCausalLM`, so a checkpoint's state dict
loads as is (see serving.weights).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from serving.config import ModelConfig


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse RoPE frequencies, with Llama 3 scaling when the config asks for it."""
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rs = cfg.rope_scaling
    if rs is None:
        return inv
    low_wavelen = rs.original_max_position / rs.low_freq_factor
    high_wavelen = rs.original_max_position / rs.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / rs.factor, inv)
    smooth = (rs.original_max_position / wavelen - rs.low_freq_factor) / (
        rs.high_freq_factor - rs.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, with rotate_half's sign folded into `sin_signed` ([-sin, sin]
    halves): swapping x's halves is the rest of it."""
    half = x.shape[-1] // 2
    swapped = x.unflatten(-1, (2, half)).flip(-2).flatten(-2)
    return torch.addcmul(x * cos, swapped, sin_signed)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # As transformers' LlamaRMSNorm: normalise in fp32, cast back, then scale.
        return self.weight * F.rms_norm(x.float(), self.weight.shape, eps=self.eps).to(x.dtype)


@dataclass(slots=True)
class PagedDecode:
    """Single-token sequences of one pass, attending to their KV blocks.

    Attention runs over a list of cache blocks as one batch: each block is scored against the
    query of the sequence that owns it, then a per-sequence softmax combines the blocks. The
    list is the range ``lo..hi-1`` spanning every block of the decoding sequences, read in place
    (a view, no copy) when they fill most of it; when they are scattered thinly (``blocks`` set),
    just their blocks are copied out. Blocks that no decoding sequence owns are scored against a
    zero query into a discarded extra row, so only the unfilled tail of each sequence's last
    block needs masking.
    """

    tokens: torch.Tensor  # [B] flat index of each decoding sequence's token
    lo: int  # first cache block of the range
    hi: int  # one past the last
    blocks: torch.Tensor | None  # [N] blocks to gather instead of the range (None: the range in place)
    owner: torch.Tensor  # [N] decode row owning each block; B (the discarded row) for none
    tail_block: torch.Tensor  # [M] position in the list of a block slot past its sequence's last token
    tail_offset: torch.Tensor  # [M] that slot's offset in the block


# Read the range in place while the decoding sequences own at least this share of its blocks;
# below it, copying out just their blocks (read + write + read) moves fewer bytes.
MIN_RANGE_FILL = 1 / 3


@dataclass(slots=True)
class PrefillSeq:
    """A multi-token query: a whole prompt (``blocks`` None: K/V come from the pass itself) or a
    chunk continuing a cached prefix (``blocks``: the sequence's blocks covering ``ctx`` tokens)."""

    start: int  # flat index of its first new token
    qlen: int
    ctx: int
    blocks: torch.Tensor | None


NEG_SCORE = -1e30  # finite: a masked slot exps to exactly 0, never inf - inf = nan


@dataclass(slots=True)
class AttentionBatch:
    """Where one forward pass's tokens sit in the paged KV cache.

    Tokens of all sequences are flattened in sequence order. Indices are built once per pass
    (here) and reused by every layer.
    """

    write_block: torch.Tensor  # [T] cache block of each new token
    write_offset: torch.Tensor  # [T] its offset in the block
    decode: PagedDecode | None
    prefill: list[PrefillSeq]

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str,
    ) -> AttentionBatch:
        """Lay out sequences whose last `query_lens[i]` of `context_lens[i]` tokens are new.

        Index arithmetic runs on `device` (no host sync); only the small lists cross over.
        """
        write_pos: list[int] = []  # block * block_size + offset of each new token
        dec_rows: list[int] = []
        dec_tokens: list[int] = []
        prefill: list[PrefillSeq] = []
        start = 0
        for i, (q, ctx) in enumerate(zip(query_lens, context_lens, strict=True)):
            table = block_tables[i]
            write_pos.extend(
                table[p // block_size] * block_size + p % block_size for p in range(ctx - q, ctx)
            )
            if q == 1:
                dec_rows.append(i)
                dec_tokens.append(start)
            else:
                nb = -(-ctx // block_size)
                blocks = torch.tensor(table[:nb], device=device) if ctx > q else None
                prefill.append(PrefillSeq(start, q, ctx, blocks))
            start += q
        pos = torch.tensor(write_pos, dtype=torch.long, device=device)
        decode = None
        if dec_rows:
            decode = _paged_decode(dec_rows, dec_tokens, context_lens, block_tables, block_size, device)
        return cls(pos // block_size, pos % block_size, decode, prefill)

    def write_rows(self, num_kv_heads: int, block_size: int) -> torch.Tensor:
        """Rows of a layer's cache viewed as [blocks * kv_heads * block_size, head_dim] that the new
        tokens' K/V go to, token-major then head: [T * kv_heads] (an index_copy_ is ~10x faster
        than the equivalent two-index put)."""
        heads = torch.arange(num_kv_heads, device=self.write_block.device)
        rows = (self.write_block.unsqueeze(1) * num_kv_heads + heads) * block_size
        return (rows + self.write_offset.unsqueeze(1)).flatten()


def _paged_decode(
    rows: list[int],
    tokens: list[int],
    context_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device | str,
) -> PagedDecode:
    """Owner of each block the decoding sequences `rows` attend to, and the slots to mask."""
    blocks: list[int] = []
    owners: list[int] = []
    last: list[tuple[int, int]] = []  # (index in `blocks`, tokens in it) of each sequence's last block
    for r, i in enumerate(rows):
        ctx = context_lens[i]
        nb = -(-ctx // block_size)
        blocks.extend(block_tables[i][:nb])
        owners.extend([r] * nb)
        last.append((len(blocks) - 1, ctx - (nb - 1) * block_size))
    lo, hi = min(blocks), max(blocks) + 1
    gather = len(blocks) < MIN_RANGE_FILL * (hi - lo)
    if gather:
        owner = torch.tensor(owners, dtype=torch.long, device=device)
        position = [j for j, _ in last]
    else:  # blocks are addressed by their place in the range
        owner_list = [len(rows)] * (hi - lo)
        for block, r in zip(blocks, owners, strict=True):
            owner_list[block - lo] = r
        owner = torch.tensor(owner_list, dtype=torch.long, device=device)
        position = [blocks[j] - lo for j, _ in last]
    tail = [(pos, off) for pos, (_, n) in zip(position, last, strict=True) for off in range(n, block_size)]
    return PagedDecode(
        tokens=torch.tensor(tokens, dtype=torch.long, device=device),
        lo=lo,
        hi=hi,
        blocks=torch.tensor(blocks, dtype=torch.long, device=device) if gather else None,
        owner=owner,
        tail_block=torch.tensor([p for p, _ in tail], dtype=torch.long, device=device),
        tail_offset=torch.tensor([o for _, o in tail], dtype=torch.long, device=device),
    )


class KVCache:
    """Paged K and V storage: [layers, blocks, kv_heads, block_size, head_dim] each.

    Block-major (vLLM's layout), so any run of blocks is one contiguous view that paged decode
    attention reads in place, [blocks * kv_heads] matrices of [block_size, head_dim]. The
    hand-off format stays token-major (see export).
    """

    def __init__(
        self, cfg: ModelConfig, num_blocks: int, block_size: int, device: str, dtype: torch.dtype
    ) -> None:
        shape = (cfg.num_layers, num_blocks, cfg.num_kv_heads, block_size, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.block_size = block_size

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def export(self, block_table: list[int], num_tokens: int) -> torch.Tensor:
        """Copy one sequence's first `num_tokens` of K/V out: [2, layers, tokens, kv_heads, head_dim]."""
        nb = -(-num_tokens // self.block_size)
        idx = torch.tensor(block_table[:nb], device=self.k.device)
        return torch.stack(
            [self._token_major(c.index_select(1, idx))[:, :num_tokens] for c in (self.k, self.v)]
        )

    def import_(self, block_table: list[int], kv: torch.Tensor) -> None:
        """Write K/V exported by `export` (possibly from another worker) into this cache.

        Whole blocks are written; slots past the last token hold zeros until that sequence
        writes them.
        """
        layers, tokens, kvh, d = kv.shape[1:]
        nb = -(-tokens // self.block_size)
        idx = torch.tensor(block_table[:nb], device=self.k.device)
        padded = torch.zeros(
            (2, layers, nb * self.block_size, kvh, d), device=self.k.device, dtype=self.k.dtype
        )
        padded[:, :, :tokens] = kv.to(device=self.k.device, dtype=self.k.dtype)
        blocks = padded.view(2, layers, nb, self.block_size, kvh, d).transpose(3, 4)
        self.k[:, idx] = blocks[0]
        self.v[:, idx] = blocks[1]

    @staticmethod
    def _token_major(blocks: torch.Tensor) -> torch.Tensor:
        """[layers, nb, kv_heads, block_size, d] -> [layers, nb * block_size, kv_heads, d]."""
        layers, nb, kvh, bs, d = blocks.shape
        return blocks.transpose(2, 3).reshape(layers, nb * bs, kvh, d)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, hd
        self.q_proj = nn.Linear(d, cfg.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * hd, d, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: AttentionBatch,
        write_rows: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        q = _apply_rope(q, cos, sin)
        k = _apply_rope(k, cos, sin)
        k_cache.view(-1, self.head_dim).index_copy_(
            0, write_rows, k.reshape(-1, self.head_dim).to(k_cache.dtype)
        )
        v_cache.view(-1, self.head_dim).index_copy_(
            0, write_rows, v.reshape(-1, self.head_dim).to(v_cache.dtype)
        )
        out = torch.empty_like(q)
        if batch.decode is not None:
            dec = batch.decode
            out[dec.tokens] = self._paged_decode(q[dec.tokens], dec, k_cache, v_cache)
        for p in batch.prefill:
            qp = q[p.start : p.start + p.qlen].transpose(0, 1).unsqueeze(0)  # [1, H, L, D]
            if p.blocks is None:  # a whole prompt: its K/V are this pass's own
                kp = k[p.start : p.start + p.qlen].transpose(0, 1).unsqueeze(0)  # [1, KVH, L, D]
                vp = v[p.start : p.start + p.qlen].transpose(0, 1).unsqueeze(0)
                op = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=True)
            else:  # a chunk continuing a cached prefix: query i sees keys up to ctx - qlen + i
                kp = _blocks_head_major(k_cache, p.blocks, p.ctx).unsqueeze(0).to(q.dtype)
                vp = _blocks_head_major(v_cache, p.blocks, p.ctx).unsqueeze(0).to(q.dtype)
                rows = torch.arange(p.qlen, device=x.device).unsqueeze(1) + (p.ctx - p.qlen)
                mask = torch.arange(p.ctx, device=x.device).unsqueeze(0) <= rows
                op = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, enable_gqa=True)
            out[p.start : p.start + p.qlen] = op.squeeze(0).transpose(0, 1)
        return self.o_proj(out.reshape(t, -1))

    def _paged_decode(
        self, q: torch.Tensor, dec: PagedDecode, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """One query per sequence against its cached keys: [B, H, D] -> [B, H, D].

        Each block is one [G, D] x [D, block_size] matmul against the query heads of its owner
        (GQA without repeating K/V); the softmax is taken per sequence across its blocks (max and
        sum reduced by owner), and the blocks' weighted V sums are added up by owner. The op count
        does not grow with the batch, and a packed range is read in place, without a gather.
        """
        b, kvh, hd = q.shape[0], self.num_kv_heads, self.head_dim
        g = self.num_heads // kvh
        if dec.blocks is None:
            k, v = k_cache[dec.lo : dec.hi], v_cache[dec.lo : dec.hi]  # [N, KVH, bs, D] views
        else:
            k, v = k_cache.index_select(0, dec.blocks), v_cache.index_select(0, dec.blocks)
        n, bs = k.shape[0], k.shape[2]
        qg = (q * hd**-0.5).view(b, kvh, g, hd).to(k.dtype)
        qg = torch.cat((qg, qg.new_zeros(1, kvh, g, hd)))  # row b: blocks no decoding sequence owns
        qb = qg.index_select(0, dec.owner)  # [N, KVH, G, D]
        scores = torch.bmm(qb.view(-1, g, hd), k.reshape(-1, bs, hd).transpose(1, 2))
        scores = scores.view(n, kvh, g, bs).float()
        scores[dec.tail_block, :, :, dec.tail_offset] = NEG_SCORE
        owner3 = dec.owner.view(-1, 1, 1).expand(-1, kvh, g)
        peak = scores.new_full((b + 1, kvh, g), NEG_SCORE).scatter_reduce_(0, owner3, scores.amax(-1), "amax")
        probs = scores.sub_(peak.index_select(0, dec.owner).unsqueeze(-1)).exp_()
        denom = scores.new_zeros(b + 1, kvh, g).index_add_(0, dec.owner, probs.sum(-1))
        part = torch.bmm(probs.to(v.dtype).view(-1, g, bs), v.reshape(-1, bs, hd)).view(n, kvh, g, hd)
        acc = scores.new_zeros(b + 1, kvh, g, hd).index_add_(0, dec.owner, part.float())
        return (acc[:b] / denom[:b].unsqueeze(-1)).to(q.dtype).view(b, self.num_heads, hd)


def _blocks_head_major(cache: torch.Tensor, blocks: torch.Tensor, ctx: int) -> torch.Tensor:
    """The first `ctx` cached tokens in `blocks`, copied out head-major: [KVH, ctx, D]."""
    nb, kvh, bs, d = blocks.numel(), *cache.shape[1:]
    return cache.index_select(0, blocks).transpose(0, 1).reshape(kvh, nb * bs, d)[:, :ctx]


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, batch, write_rows, k_cache, v_cache) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, batch, write_rows, k_cache, v_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """The decoder plus its LM head; `forward` runs one engine iteration over the paged cache."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def init_random(self, seed: int = 0, std: float = 0.02) -> LlamaForCausalLM:
        """Deterministic random weights (normal(0, std); norms at 1) from `seed`.

        Drawn in fp32 on the CPU and copied, so every device and dtype gets the same model.
        """
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.is_meta:
                    continue
                if name.endswith("layernorm.weight") or name == "model.norm.weight":
                    p.fill_(1.0)
                else:
                    p.copy_(torch.empty(p.shape, dtype=torch.float32).normal_(0.0, std, generator=gen))
        return self

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin ([-sin, sin] halves) at `positions`, as `_apply_rope` takes them."""
        freqs = positions.float().unsqueeze(1) * self.inv_freq.unsqueeze(0)
        emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)  # [T, 1, D]
        sin = emb.sin()
        half = sin.shape[-1] // 2
        sin[..., :half].neg_()  # rotate_half's sign, see _apply_rope
        return emb.cos().to(dtype), sin.to(dtype)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        batch: AttentionBatch,
        cache: KVCache,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Run the flattened new tokens; return logits (float32) at `logits_indices`."""
        x = self.model.embed_tokens(input_ids)
        cos, sin = self._rope(positions, x.dtype)
        write_rows = batch.write_rows(self.config.num_kv_heads, cache.block_size)  # the same in every layer
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, batch, write_rows, cache.k[i], cache.v[i])
        x = self.model.norm(x[logits_indices])
        return self.lm_head(x).float()

    @torch.inference_mode()
    def full_logits(self, input_ids: list[int]) -> torch.Tensor:
        """Logits at every position of one sequence, recomputed from scratch (a reference path)."""
        n = len(input_ids)
        dev = self.lm_head.weight.device
        cache = KVCache(self.config, 1, n, str(dev), self.lm_head.weight.dtype)
        batch = AttentionBatch.build([n], [n], [[0]], n, dev)
        ids = torch.tensor(input_ids, device=dev)
        return self.forward(ids, torch.arange(n, device=dev), batch, cache, torch.arange(n, device=dev))
