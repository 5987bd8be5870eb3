"""A decode run: the next iterations of an engine when each is one decode step of the same running
sequences (:meth:`serving.engine_core.EngineCore.decode_run` makes one, ``commit_decode_run``
applies it), so a simulator takes them as one event instead of one per iteration."""

from __future__ import annotations

from array import array
from bisect import bisect_left
from typing import Any

from serving.scheduler import IterationTally
from serving.sequence import Sequence


class DecodeRun:
    """The next ``k`` iterations of an engine, each one decode step of the same running sequences
    (``seqs``, in running order) in which none is preempted and nothing joins, and none finishes
    but in the last (``last_finishes``: some reach their length limit there): what
    :meth:`EngineCore.step` would do ``k`` times over, for a timing executor (token 0; no model).
    ``works[j]`` is iteration ``j``'s tally, ``free[j]`` the free KV blocks once it is scheduled,
    ``grows[j]`` the sequences that take a new block then (in order). The executor fills ``ends``
    (each iteration's end on the engine's clock, the next one's start) and ``entries`` (its
    timing of each); :meth:`EngineCore.commit_decode_run` applies the first ones."""

    __slots__ = (
        "ends",
        "entries",
        "free",
        "grows",
        "k",
        "last_finishes",
        "num_blocks",
        "seqs",
        "start_s",
        "works",
    )

    def __init__(
        self,
        seqs: list[Sequence],
        works: list[IterationTally],
        free: list[int],
        grows: list[list[Sequence]],
        num_blocks: int,
        last_finishes: bool = False,
    ) -> None:
        self.seqs = seqs
        self.works = works
        self.free = free
        self.grows = grows
        self.num_blocks = num_blocks
        self.k = len(works)
        self.last_finishes = last_finishes
        self.start_s = 0.0
        self.ends: array = array("d")
        self.entries: list[Any] = []

    def ended_before(self, now_s: float) -> int:
        """The iterations that ended before ``now_s`` (the one after them is running at ``now_s``)."""
        return bisect_left(self.ends, now_s)

    def usage_at(self, now_s: float) -> float:
        """The KV cache's fraction in use at ``now_s`` (``BlockManager.usage`` then)."""
        return 1.0 - self.free[bisect_left(self.ends, now_s)] / self.num_blocks
