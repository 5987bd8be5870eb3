"""The arrival process of a window: the rate per interval, per UTC hour of day, and burstiness.

Burstiness is measured with the rate curve divided out (time rescaling): each arrival time ``t``
becomes ``Λ(t)``, the expected number of arrivals up to ``t`` under the piecewise-constant rate
curve, so a slow rise of load over the day is not mistaken for bursts. The gaps of ``Λ`` have mean 1;
their coefficient of variation is ``burstiness_cv`` (1 for Poisson arrivals, about 3 for Gamma gaps
of shape 1/9). A synthesized trace draws Gamma gaps of that CV in ``Λ`` and maps them back through
the curve (:mod:`analytics.workload.synthesize`), so it follows both.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from analytics.workload.model import RateCurve

#: Interval lengths the rate curve may use (s); the finest that keeps enough arrivals per interval.
CURVE_INTERVALS_S = (10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0)
#: at most this many intervals (a day at 1 min, 60 days at 1 h)
MAX_CURVE_INTERVALS = 1440
#: arrivals per interval a curve wants (first choice, then the fallback) before it is trusted
MIN_PER_INTERVAL = (100, 30)
#: expected arrivals per count of the dispersion index
DISPERSION_TARGET = 20.0


def curve_interval_s(duration_s: float, requests: int) -> float:
    """The rate curve's interval for ``requests`` arrivals over ``duration_s``: the finest of
    :data:`CURVE_INTERVALS_S` with at most 1,440 intervals and about 100 (else 30) arrivals in each;
    the whole window (a constant rate) when no interval has enough."""
    rate = requests / duration_s if duration_s > 0 else 0.0
    for need in MIN_PER_INTERVAL:
        for c in CURVE_INTERVALS_S:
            if c < duration_s and math.ceil(duration_s / c) <= MAX_CURVE_INTERVALS and rate * c >= need:
                return c
    return max(duration_s, 1e-9)


def rate_curve(times_s: np.ndarray, start_s: float, end_s: float, interval_s: float) -> RateCurve:
    """Arrivals per second in consecutive ``interval_s`` intervals of ``[start_s, end_s)``."""
    counts, lengths = _binned(times_s, np.ones(len(times_s)), start_s, end_s, interval_s)
    return RateCurve(
        start_s, interval_s, [float(c / s) if s > 0 else 0.0 for c, s in zip(counts, lengths, strict=True)]
    )


def curve_from_counts(
    at_s: np.ndarray, counts: np.ndarray, start_s: float, end_s: float, interval_s: float
) -> RateCurve:
    """A rate curve from counts observed at times ``at_s`` (a counter's increases per scrape)."""
    binned, lengths = _binned(at_s, counts, start_s, end_s, interval_s)
    return RateCurve(
        start_s, interval_s, [float(c / s) if s > 0 else 0.0 for c, s in zip(binned, lengths, strict=True)]
    )


def _binned(
    at_s: np.ndarray, weights: np.ndarray, start_s: float, end_s: float, interval_s: float
) -> tuple[np.ndarray, np.ndarray]:
    n = max(1, math.ceil((end_s - start_s) / interval_s - 1e-9))
    idx = np.clip(((at_s - start_s) // interval_s).astype(np.int64), 0, n - 1)
    counts = np.bincount(idx, weights=weights, minlength=n)[:n]
    starts = start_s + interval_s * np.arange(n)
    lengths = np.minimum(starts + interval_s, end_s) - starts
    return counts, lengths


def _breakpoints(curve: RateCurve, end_s: float) -> tuple[np.ndarray, np.ndarray]:
    """``(t, Λ(t))`` at the curve's interval edges (Λ: expected arrivals since its start)."""
    n = len(curve.rps)
    edges = np.minimum(curve.start_s + curve.interval_s * np.arange(n + 1), max(end_s, curve.start_s))
    edges[-1] = max(end_s, edges[-1])
    lam = np.concatenate(([0.0], np.cumsum(np.asarray(curve.rps) * np.diff(edges))))
    return edges, lam


def rescaled(times_s: np.ndarray, curve: RateCurve, end_s: float) -> np.ndarray:
    """``Λ(t)`` of each time: arrivals expected up to it under the curve."""
    edges, lam = _breakpoints(curve, end_s)
    return np.interp(times_s, edges, lam)


def cv_of(gaps: np.ndarray) -> float | None:
    """Coefficient of variation (std / mean) of gaps; None with fewer than 2 or a zero mean."""
    if len(gaps) < 2 or gaps.mean() <= 0:
        return None
    return float(gaps.std(ddof=1) / gaps.mean())


@dataclass(frozen=True, slots=True)
class Burstiness:
    """The burstiness figures of :class:`~analytics.workload.model.Workload`."""

    interarrival_cv: float | None
    burstiness_cv: float | None
    gamma_shape: float | None
    dispersion_index: float | None
    dispersion_interval_s: float | None


def burstiness(times_s: np.ndarray, curve: RateCurve, start_s: float, end_s: float) -> Burstiness:
    """The burstiness of arrivals at ``times_s`` (sorted) in ``[start_s, end_s)`` under ``curve``."""
    t = np.sort(times_s)
    raw = cv_of(np.diff(t))
    u = rescaled(t, curve, end_s)
    detrended = cv_of(np.diff(u))
    shape = 1.0 / detrended**2 if detrended else None
    total = len(t)
    idx, width = None, None
    if total >= 10:
        width = min(max(DISPERSION_TARGET * (end_s - start_s) / total, 1e-3), end_s - start_s)
        n = max(1, int((end_s - start_s) // width))
        if n >= 5:
            edges = start_s + width * np.arange(n + 1)
            counts = np.histogram(t, bins=edges)[0].astype(float)
            expected = np.diff(rescaled(edges, curve, end_s))
            idx = _index_of_dispersion(counts, expected)
    return Burstiness(raw, detrended, shape, idx, width if idx is not None else None)


def _index_of_dispersion(counts: np.ndarray, expected: np.ndarray) -> float | None:
    """Σ(count − expected)² / Σ expected over intervals with something expected (1 for Poisson)."""
    keep = expected > 0
    if keep.sum() < 5 or expected[keep].sum() <= 0:
        return None
    return float(((counts[keep] - expected[keep]) ** 2).sum() / expected[keep].sum())


def dispersion_of_increases(
    series: list[tuple[np.ndarray, np.ndarray, np.ndarray]], curve: RateCurve, end_s: float
) -> tuple[float | None, float | None]:
    """The index of dispersion of counter increases, per series ``(from_s, to_s, increase)`` (one
    scrape interval each), expected counts from the curve scaled to each series' share of the total;
    and the median scrape interval (s)."""
    num = den = 0.0
    spans: list[float] = []
    for a, b, inc in series:
        if len(inc) < 5:
            continue
        expected = rescaled(b, curve, end_s) - rescaled(a, curve, end_s)
        if expected.sum() <= 0:
            continue
        expected = expected * inc.sum() / expected.sum()
        keep = expected > 0
        num += float(((inc[keep] - expected[keep]) ** 2).sum())
        den += float(expected[keep].sum())
        spans += list(b - a)
    if den <= 0:
        return None, None
    return num / den, float(np.median(spans))


def hourly_rps(curve: RateCurve, end_s: float) -> list[float | None]:
    """The mean rate per UTC hour of day (0-23) over the window; None for hours it does not cover.
    Each curve interval counts for the hour of its middle."""
    arrivals, seconds = [0.0] * 24, [0.0] * 24
    edges, _ = _breakpoints(curve, end_s)
    for k, rps in enumerate(curve.rps):
        a, b = float(edges[k]), float(edges[k + 1])
        if b <= a:
            continue
        h = time.gmtime((a + b) / 2).tm_hour
        arrivals[h] += rps * (b - a)
        seconds[h] += b - a
    return [arrivals[h] / seconds[h] if seconds[h] > 0 else None for h in range(24)]
