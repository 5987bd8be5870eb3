"""The router's placement policy, shared by the live pool and the simulator (torch-free).

A request goes to a prefill+decode pair when the pool has both roles ready (disaggregated), else to
a mixed worker (aggregated); within a role the least-loaded worker wins. A worker's load is
``(requests in flight, KV-cache usage 0..1)``, compared in that order; ties go to the first listed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

W = TypeVar("W")

Load = tuple[int, float]


@dataclass(frozen=True, slots=True)
class Route(Generic[W]):
    """Where a request runs: ``prefill`` computes its prompt, ``decode`` generates the rest.

    The two are the same worker on the aggregated path (``disaggregated`` False).
    """

    prefill: W
    decode: W

    @property
    def disaggregated(self) -> bool:
        return self.prefill is not self.decode


def least_loaded(workers: Sequence[W], load: Callable[[W], Load]) -> W:
    """The worker with the smallest load (the first of equals); ``workers`` must not be empty."""
    return min(workers, key=load)


def choose_route(
    prefill: Sequence[W], decode: Sequence[W], mixed: Sequence[W], load: Callable[[W], Load]
) -> Route[W] | None:
    """Pick the workers of a new request among the ready ones of each role; None when none can serve."""
    if prefill and decode:
        return Route(least_loaded(prefill, load), least_loaded(decode, load))
    if mixed:
        w = least_loaded(mixed, load)
        return Route(w, w)
    return None
