"""BlockManager: paged KV block accounting (torch-free)."""

from __future__ import annotations

import random

import pytest

from serving.block_manager import BlockManager, OutOfBlocksError
from serving.config import SamplingParams
from serving.sequence import Sequence


def _seq(rid: str = "r", n: int = 1) -> Sequence:
    return Sequence(rid, list(range(n)), n, SamplingParams(), 0.0)


def test_rejects_non_positive_sizes() -> None:
    with pytest.raises(ValueError, match="num_blocks and block_size"):
        BlockManager(0, 4)
    with pytest.raises(ValueError, match="num_blocks and block_size"):
        BlockManager(4, 0)


def test_blocks_for_rounds_up() -> None:
    bm = BlockManager(10, 4)
    assert [bm.blocks_for(n) for n in (0, 1, 3, 4, 5, 8, 9)] == [0, 1, 1, 1, 2, 2, 3]


def test_blocks_needed_counts_only_missing_blocks() -> None:
    bm = BlockManager(10, 4)
    s = _seq()
    assert bm.blocks_needed(s, 9) == 3
    bm.grow(s, 5)
    assert len(s.block_table) == 2
    assert bm.blocks_needed(s, 8) == 0
    assert bm.blocks_needed(s, 9) == 1
    assert bm.blocks_needed(s, 1) == 0  # never negative


def test_grow_is_incremental_and_idempotent() -> None:
    bm = BlockManager(10, 4)
    s = _seq()
    bm.grow(s, 4)
    first = list(s.block_table)
    bm.grow(s, 4)  # already covered: nothing new
    assert s.block_table == first
    bm.grow(s, 13)
    assert s.block_table[:1] == first  # existing blocks kept, in place
    assert len(s.block_table) == 4
    assert bm.num_free == 6


def test_usage_and_num_free() -> None:
    bm = BlockManager(8, 2)
    assert bm.usage == 0.0
    assert bm.num_free == 8
    s = _seq()
    bm.grow(s, 6)
    assert bm.num_free == 5
    assert bm.usage == pytest.approx(3 / 8)
    bm.grow(s, 16)
    assert bm.usage == 1.0
    bm.free(s)
    assert bm.usage == 0.0


def test_can_grow_with_reserve() -> None:
    bm = BlockManager(4, 4)
    s = _seq()
    assert bm.can_grow(s, 16)
    assert not bm.can_grow(s, 17)
    assert bm.can_grow(s, 12, reserve=1)
    assert not bm.can_grow(s, 12, reserve=2)


def test_grow_without_enough_blocks_raises_and_changes_nothing() -> None:
    bm = BlockManager(3, 4)
    a, b = _seq("a"), _seq("b")
    bm.grow(a, 8)
    with pytest.raises(OutOfBlocksError, match=r"b: needs 2 blocks, 1 free"):
        bm.grow(b, 5)
    assert b.block_table == []
    assert bm.num_free == 1
    assert issubclass(OutOfBlocksError, RuntimeError)


def test_free_returns_every_block_and_clears_table() -> None:
    bm = BlockManager(6, 4)
    a, b = _seq("a"), _seq("b")
    bm.grow(a, 10)
    bm.grow(b, 9)
    assert bm.num_free == 0
    bm.free(a)
    assert a.block_table == []
    assert bm.num_free == 3
    bm.free(a)  # freeing twice is harmless: the table is empty
    assert bm.num_free == 3
    bm.free(b)
    assert bm.num_free == 6
    # the freed blocks are exactly the original set and can all be handed out again
    c = _seq("c")
    bm.grow(c, 24)
    assert sorted(c.block_table) == list(range(6))


def test_no_block_is_ever_handed_out_twice_random() -> None:
    rng = random.Random(1234)
    num_blocks, block_size = 17, 3
    bm = BlockManager(num_blocks, block_size)
    live: list[tuple[Sequence, int]] = []
    for step in range(2000):
        if live and rng.random() < 0.3:
            seq, _ = live.pop(rng.randrange(len(live)))
            bm.free(seq)
        elif live and rng.random() < 0.5:
            i = rng.randrange(len(live))
            seq, n = live[i]
            target = n + rng.randint(0, 7)
            if bm.can_grow(seq, target):
                bm.grow(seq, target)
                live[i] = (seq, target)
            else:
                with pytest.raises(OutOfBlocksError):
                    bm.grow(seq, target)
        else:
            seq = _seq(f"s{step}")
            n = rng.randint(1, 12)
            if bm.can_grow(seq, n):
                bm.grow(seq, n)
                live.append((seq, n))
        held = [b for seq, _ in live for b in seq.block_table]
        assert len(held) == len(set(held)), "a block is held by two sequences"
        assert all(0 <= b < num_blocks for b in held)
        assert len(held) + bm.num_free == num_blocks
        for seq, n in live:
            assert len(seq.block_table) == bm.blocks_for(n)
    for seq, _ in live:
        bm.free(seq)
    assert bm.num_free == num_blocks
