"""The exponential backoff helper."""

from __future__ import annotations

import pytest

from collector.sources.backoff import Backoff


def test_delay_doubles_then_caps_without_jitter() -> None:
    b = Backoff(base_s=1.0, max_s=10.0, jitter=0.0)
    assert b.delay_s() == 0.0
    assert [b.failure() for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    b.success()
    assert b.failures == 0
    assert b.failure() == 1.0


def test_jitter_is_bounded_and_injectable() -> None:
    lo = Backoff(base_s=2.0, max_s=100.0, jitter=0.25, rng=lambda: 0.0)
    hi = Backoff(base_s=2.0, max_s=100.0, jitter=0.25, rng=lambda: 0.999999)
    mid = Backoff(base_s=2.0, max_s=100.0, jitter=0.25, rng=lambda: 0.5)
    assert lo.failure() == pytest.approx(1.5)
    assert hi.failure() == pytest.approx(2.5, rel=1e-5)
    assert mid.failure() == pytest.approx(2.0)
    # Jitter never pushes past the cap.
    capped = Backoff(base_s=1.0, max_s=4.0, jitter=0.5, rng=lambda: 0.999999)
    assert max(capped.failure() for _ in range(10)) <= 4.0


def test_long_outage_does_not_overflow() -> None:
    b = Backoff(base_s=1.0, max_s=60.0, jitter=0.0, failures=10_000)
    assert b.delay_s() == 60.0


@pytest.mark.parametrize(
    "kw", [{"base_s": 0.0}, {"base_s": 5.0, "max_s": 1.0}, {"factor": 0.5}, {"jitter": 1.0}]
)
def test_invalid_settings_are_refused(kw: dict) -> None:
    with pytest.raises(ValueError):
        Backoff(**kw)
