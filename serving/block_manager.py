"""Paged KV-cache block accounting (torch-free)."""

from __future__ import annotations

import heapq

from serving.sequence import Sequence


class OutOfBlocksError(RuntimeError):
    """Raised when an allocation is attempted without enough free blocks (a scheduler bug)."""


class BlockManager:
    """Hands out fixed-size KV blocks to sequences; a block holds `block_size` tokens.

    The lowest free block goes first, so the blocks in use stay packed at the bottom of the
    cache: paged decode attention reads the range spanning a step's blocks, unused ones included.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be > 0, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: list[int] = list(range(num_blocks))  # a heap

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0..1."""
        return 1.0 - len(self._free) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks `seq` needs so that its table covers `num_tokens` tokens."""
        return max(0, -(-num_tokens // self.block_size) - len(seq.block_table))

    def can_grow(self, seq: Sequence, num_tokens: int, reserve: int = 0) -> bool:
        need = -(-num_tokens // self.block_size) - len(seq.block_table)
        return (need if need > 0 else 0) + reserve <= len(self._free)

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Extend `seq`'s block table to cover `num_tokens` tokens."""
        need = -(-num_tokens // self.block_size) - len(seq.block_table)
        if need <= 0:  # the common decode step: the last block still has room
            return
        if need > len(self._free):
            raise OutOfBlocksError(f"{seq.request_id}: needs {need} blocks, {len(self._free)} free")
        if need == 1:  # a decode crossing into a new block
            seq.block_table.append(heapq.heappop(self._free))
        else:
            seq.block_table.extend([heapq.heappop(self._free) for _ in range(need)])

    def free(self, seq: Sequence) -> None:
        """Return all of `seq`'s blocks."""
        for block in seq.block_table:
            heapq.heappush(self._free, block)
        seq.block_table = []
