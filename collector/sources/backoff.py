"""Exponential backoff with jitter, so an unreachable endpoint is retried with growing delay."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

#: The longest wait before a source retries a failed endpoint, unless its ``Backoff`` says otherwise
#: (``phaselens collect --max-backoff-s``): delays 1, 2, 4, 8, then 10 s (±10 % jitter, clipped to
#: the cap), so a peer that recovers is read again within about 10 s, not minutes later.
DEFAULT_MAX_BACKOFF_S = 10.0


@dataclass
class Backoff:
    """Delay before the next attempt after ``failures`` consecutive failures.

    The n-th consecutive failure waits ``min(max_s, base_s * factor**(n-1))``, spread by
    ``±jitter`` (a fraction of the delay, drawn from ``rng`` in [0, 1)) and clipped to ``max_s``.
    ``rng`` is injectable so tests get exact delays (``rng=lambda: 0.5`` means no jitter).
    """

    base_s: float = 1.0
    max_s: float = 300.0
    factor: float = 2.0
    jitter: float = 0.1
    rng: Callable[[], float] = field(default=random.random, repr=False)
    failures: int = 0

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.max_s < self.base_s or self.factor < 1 or not 0 <= self.jitter < 1:
            raise ValueError(
                f"invalid backoff: base_s={self.base_s} max_s={self.max_s} "
                f"factor={self.factor} jitter={self.jitter}"
            )

    def delay_s(self, failures: int | None = None) -> float:
        """The delay after ``failures`` consecutive failures (default: the current count); 0 if none."""
        n = self.failures if failures is None else failures
        if n <= 0:
            return 0.0
        # Cap the exponent so a long outage never overflows a float.
        raw = min(self.max_s, self.base_s * self.factor ** min(n - 1, 64))
        spread = raw * self.jitter * (2.0 * self.rng() - 1.0)
        return max(0.0, min(self.max_s, raw + spread))

    def failure(self) -> float:
        """Record one more failure; return the delay before the next attempt."""
        self.failures += 1
        return self.delay_s()

    def success(self) -> None:
        """Record a success: the next failure starts again from ``base_s``."""
        self.failures = 0
