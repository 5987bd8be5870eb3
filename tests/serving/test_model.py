"""The paged-KV-cache forward pass equals a full recompute (prefill, decode, mixed and chunked batches)."""

from __future__ import annotations

import pytest
import torch

from serving.config import ModelConfig, RopeScaling
from serving.model import AttentionBatch, KVCache, LlamaForCausalLM

BLOCK = 4
ATOL = 1e-4

CFG = ModelConfig(
    name="test-small",
    vocab_size=300,
    hidden_size=64,
    intermediate_size=160,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    max_position=256,
    rope_theta=10_000.0,
    rope_scaling=RopeScaling(factor=8.0, original_max_position=64),
)


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(CFG).init_random(seed=1, std=0.1)
    with torch.no_grad():  # non-unit norms, so that a norm weight bug would show
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model.eval()


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, CFG.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _step(
    model: LlamaForCausalLM,
    cache: KVCache,
    seqs: list[tuple[list[int], int, list[int]]],
) -> list[torch.Tensor]:
    """Run one iteration over (all ids so far, number of new ids at the end, block table) per sequence.

    Returns the logits of every new token, per sequence.
    """
    ids, pos, qlens, ctxs, tables = [], [], [], [], []
    for seq, q, table in seqs:
        ids += seq[-q:]
        pos += range(len(seq) - q, len(seq))
        qlens.append(q)
        ctxs.append(len(seq))
        tables.append(table)
    batch = AttentionBatch.build(qlens, ctxs, tables, BLOCK, "cpu")
    n = len(ids)
    logits = model.forward(torch.tensor(ids), torch.tensor(pos), batch, cache, torch.arange(n))
    return list(torch.split(logits, qlens))


def test_prefill_then_decode_matches_full_recompute() -> None:
    model = _model()
    cache = KVCache(CFG, num_blocks=8, block_size=BLOCK, device="cpu", dtype=torch.float32)
    table = [5, 2, 7, 0, 3]  # non-contiguous, 20 slots
    seq = _ids(7, seed=2)
    (prefill,) = _step(model, cache, [(seq, len(seq), table)])
    torch.testing.assert_close(prefill, model.full_logits(seq), atol=ATOL, rtol=0)
    for tok in _ids(12, seed=3):  # decode one token per step across block boundaries
        seq = [*seq, tok]
        (logits,) = _step(model, cache, [(seq, 1, table)])
        ref = model.full_logits(seq)[-1:]
        assert (logits - ref).abs().max().item() < ATOL


def test_greedy_decode_is_stable() -> None:
    """Greedy tokens from the cached path equal argmax of the full recompute at every step."""
    model = _model()
    cache = KVCache(CFG, num_blocks=6, block_size=BLOCK, device="cpu", dtype=torch.float32)
    table = [4, 1, 3, 5]
    seq = _ids(5, seed=4)
    (logits,) = _step(model, cache, [(seq, len(seq), table)])
    for _ in range(8):
        seq = [*seq, int(logits[-1].argmax())]
        (logits,) = _step(model, cache, [(seq, 1, table)])
        assert int(logits[-1].argmax()) == int(model.full_logits(seq)[-1].argmax())


def test_mixed_batch_decodes_and_chunked_prefill() -> None:
    """One step with two decodes of different lengths and a prefill chunk continuing a cached prefix."""
    model = _model()
    cache = KVCache(CFG, num_blocks=16, block_size=BLOCK, device="cpu", dtype=torch.float32)
    a, b, c = _ids(9, seed=5), _ids(14, seed=6), _ids(11, seed=7)
    ta, tb, tc = [9, 1, 12], [3, 14, 0, 6], [11, 2, 15]
    # Step 1: three prefills in one batch (a and b all but their last token, c its first 6 tokens).
    first = _step(model, cache, [(a[:8], 8, ta), (b[:13], 13, tb), (c[:6], 6, tc)])
    for got, seq in zip(first, (a[:8], b[:13], c[:6]), strict=True):
        torch.testing.assert_close(got, model.full_logits(seq), atol=ATOL, rtol=0)
    # Step 2: decode a, chunk of c (5 tokens after a 6-token cached prefix), decode b.
    la, lc, lb = _step(model, cache, [(a, 1, ta), (c, 5, tc), (b, 1, tb)])
    torch.testing.assert_close(la, model.full_logits(a)[-1:], atol=ATOL, rtol=0)
    torch.testing.assert_close(lc, model.full_logits(c)[-5:], atol=ATOL, rtol=0)
    torch.testing.assert_close(lb, model.full_logits(b)[-1:], atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("tables", "in_place"),
    [
        # Packed: the decoding sequences own 6 of the 7 blocks 0..6 (block 4 is a prefill's).
        ([[0, 1], [2, 3, 5, 6]], True),
        # Scattered thinly over 0..39: only their 6 blocks are copied out.
        ([[0, 39], [20, 7, 31, 12]], False),
    ],
)
def test_paged_decode_reads_a_packed_range_in_place_and_gathers_a_sparse_one(
    tables: list[list[int]], in_place: bool
) -> None:
    model = _model()
    cache = KVCache(CFG, num_blocks=40, block_size=BLOCK, device="cpu", dtype=torch.float32)
    a, b, c = _ids(7, seed=11), _ids(13, seed=12), _ids(3, seed=13)
    _step(model, cache, [(a[:6], 6, tables[0]), (b[:12], 12, tables[1])])
    batch = AttentionBatch.build([1, 1, 3], [7, 13, 3], [*tables, [4]], BLOCK, "cpu")
    assert batch.decode is not None and (batch.decode.blocks is None) == in_place
    la, lb, lc = _step(model, cache, [(a, 1, tables[0]), (b, 1, tables[1]), (c, 3, [4])])
    torch.testing.assert_close(la, model.full_logits(a)[-1:], atol=ATOL, rtol=0)
    torch.testing.assert_close(lb, model.full_logits(b)[-1:], atol=ATOL, rtol=0)
    torch.testing.assert_close(lc, model.full_logits(c), atol=ATOL, rtol=0)


def test_kv_export_import_continues_decode() -> None:
    """K/V exported from one cache and imported at other blocks of another cache decode the same."""
    model = _model()
    src = KVCache(CFG, num_blocks=8, block_size=BLOCK, device="cpu", dtype=torch.float32)
    dst = KVCache(CFG, num_blocks=8, block_size=BLOCK, device="cpu", dtype=torch.float32)
    seq = _ids(10, seed=8)
    _step(model, src, [(seq, len(seq), [6, 1, 4])])
    dst.import_([2, 7, 5], src.export([6, 1, 4], len(seq)))
    seq = [*seq, 17]
    (logits,) = _step(model, dst, [(seq, 1, [2, 7, 5])])
    torch.testing.assert_close(logits, model.full_logits(seq)[-1:], atol=ATOL, rtol=0)


def test_full_logits_is_causal() -> None:
    model = _model()
    seq = _ids(12, seed=9)
    changed = [*seq[:6], *_ids(6, seed=10)]
    torch.testing.assert_close(model.full_logits(seq)[:6], model.full_logits(changed)[:6], atol=1e-6, rtol=0)
