"""Paged KV-cache block accounting (torch-free)."""

from __future__ import annotations

from collections import deque

from serving.sequence import Sequence


class OutOfBlocksError(RuntimeError):
    """Raised when an allocation is attempted without enough free blocks (a scheduler bug)."""


class BlockManager:
    """Hands out fixed-size KV blocks to sequences; a block holds `block_size` tokens."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be > 0, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))

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
        return max(0, self.blocks_for(num_tokens) - len(seq.block_table))

    def can_grow(self, seq: Sequence, num_tokens: int, reserve: int = 0) -> bool:
        return self.blocks_needed(seq, num_tokens) + reserve <= len(self._free)

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Extend `seq`'s block table to cover `num_tokens` tokens."""
        need = self.blocks_needed(seq, num_tokens)
        if need > len(self._free):
            raise OutOfBlocksError(f"{seq.request_id}: needs {need} blocks, {len(self._free)} free")
        seq.block_table.extend(self._free.popleft() for _ in range(need))

    def free(self, seq: Sequence) -> None:
        """Return all of `seq`'s blocks."""
        self._free.extend(seq.block_table)
        seq.block_table = []
