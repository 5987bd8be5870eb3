"""The statistics of the bimodality analysis (analytics/bimodal.py), on plain arrays and sums: the
dip test's verdict with the two modes of the smoothed histogram (:func:`dip_and_modes`), and the
moments and Sarle's coefficient from power sums. Formulas and sources: docs/analytics/attribution.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import diptest
import numpy as np

#: Sarle's coefficient above this (the value of a uniform distribution) suggests bimodality
#: (supporting evidence only: heavy skew, e.g. a pile with a tail, raises it without two modes).
SARLE_THRESHOLD = 5.0 / 9.0
#: dip-test p-value below which the dip test rejects one mode (half of :data:`BIMODAL_RULE`).
DIP_ALPHA = 0.05
#: The one bimodality rule, as :func:`bimodal_verdict` applies it; the summary's ``bimodal`` part
#: carries it as ``rule``, and ``phaselens analyze``, the dashboard and the report state it from there.
BIMODAL_RULE = (
    f"bimodal when Hartigan's dip test rejects one mode (p < {DIP_ALPHA:g}) and the smoothed histogram "
    f"has two modes; Sarle's b (> {SARLE_THRESHOLD:.3f} suggests two modes) is supporting evidence, "
    "not part of the verdict"
)
MIN_POINTS = 4  # Sarle's coefficient needs n > 3; the dip test and the modes need a few points
#: SM activity with a smaller standard deviation (points of %) has no spread to hold two modes (it
#: is less than the histogram's smoothing, ``MODE_SMOOTH_PCT``), and Sarle's b only measures the
#: skew of a few spikes off a constant.
NO_SPREAD_STD_PCT = 0.5


# -- the two modes: peaks of the smoothed histogram --------------------------------------------------

#: Bin width of the histogram the modes are found on (points of activity %).
MODE_BIN_PCT = 0.25
#: The least standard deviation of the Gaussian kernel that smooths the histogram (points of
#: activity %; wider where the values are few and spread: Silverman's rule): values this close are
#: one pile, not two modes.
MODE_SMOOTH_PCT = 1.0
#: A second peak is a mode where at least this share of the values lies on its side of the valley
#: between it and the highest peak ...
MODE_MIN_WEIGHT = 0.02
#: ... and the valley falls at least this share of the second peak's height below it.
MODE_MIN_DEPTH = 0.25
#: ... by at least this many standard deviations of the counts' noise (Poisson, smoothed), so that
#: few values spread out make no modes of chance bumps.
MODE_SIGNIFICANCE = 3.0
_MAX_MODE_BINS = 20_000  # a wider span (values far outside 0-100 %) gets coarser bins
_MAX_KERNEL_SIGMA_BINS = 64  # a wider kernel (few values, widely spread) too


@dataclass(frozen=True, slots=True)
class Modes:
    """The two modes of a distribution: the highest peak of its smoothed histogram and the most
    prominent other one, ``low`` the one at the smaller value, split at the lowest point between
    them (``valley_pct``): ``weight_*`` is the share of the values on each side, ``std_*`` their
    spread. Where the values have one peak, it is ``low_pct`` (weight 1) and the ``high`` fields
    and ``valley_pct`` are None."""

    low_pct: float
    high_pct: float | None
    weight_low: float
    weight_high: float
    std_low: float
    std_high: float | None
    valley_pct: float | None


def histogram_modes(
    x: np.ndarray,
    *,
    bin_pct: float = MODE_BIN_PCT,
    smooth_pct: float = MODE_SMOOTH_PCT,
    min_weight: float = MODE_MIN_WEIGHT,
    min_depth: float = MODE_MIN_DEPTH,
    significance: float = MODE_SIGNIFICANCE,
) -> Modes:
    """The modes of ``x`` (activity %): peaks of its histogram (``bin_pct`` bins) smoothed by a
    Gaussian kernel of ``smooth_pct`` or Silverman's bandwidth, the wider. The second mode is the
    most prominent other peak (over the valley between it and the highest) with at least
    ``min_weight`` of the values on its side and a valley below it by ``min_depth`` of its height
    and by ``significance`` standard deviations of the smoothed counts' Poisson noise (seeded
    normal, uniform, exponential and gamma samples of 20 to 5,000 values get one mode; two normals
    30 points apart with 8-point spreads, 70/30, get two from about 1,000 values). A mode's value
    is the mean of the values within ``smooth_pct`` of its peak (a pile of equal values reads as its
    value). Raises ValueError when ``x`` has no finite value.

    Unlike a two-Gaussian mixture's centres, peaks are where the time is: SM activity piled at
    23.8 % with 10 % of the time idle at 0 % and a tail of prefill to 50 % has its modes at 0 % and
    23.8 %, where the mixture's maximum likelihood put a narrow component on the pile (23.8 %) and a
    broad one over everything else (mean 22 %, std 20)."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if not len(x):
        raise ValueError("modes need at least one finite value")
    q25, q75 = np.percentile(x, [25, 75])
    spread = min(float(x.std()), float(q75 - q25) / 1.34)
    smooth_pct = max(smooth_pct, 0.9 * spread * len(x) ** -0.2)
    bin_pct = max(bin_pct, smooth_pct / _MAX_KERNEL_SIGMA_BINS, float(np.ptp(x)) / _MAX_MODE_BINS)
    sigma = smooth_pct / bin_pct
    half = math.ceil(4 * sigma)
    bins = np.floor(x / bin_pct).astype(np.int64)
    first = int(bins.min()) - half - 1
    counts = np.bincount(bins - first, minlength=int(bins.max()) - first + half + 2)
    cum = np.concatenate(([0], np.cumsum(counts)))  # values in bins < i: cum[i]
    offsets = np.arange(-half, half + 1)
    kernel = np.exp(-0.5 * (offsets / sigma) ** 2)
    density = np.convolve(counts, kernel, mode="same")
    noise = float((kernel**2).sum() / kernel.sum())  # a smoothed Poisson count's variance per unit
    peaks = np.flatnonzero((density[1:-1] > density[:-2]) & (density[1:-1] >= density[2:])) + 1
    top = int(peaks[np.argmax(density[peaks])])
    second, valley, best = None, None, -math.inf
    for p in map(int, peaks):
        a, b = sorted((p, top))
        at = a + int(np.argmin(density[a : b + 1]))
        prominence = density[p] - density[at]
        weight = (cum[at] if p < top else len(x) - cum[at]) / len(x)
        significant = prominence >= significance * math.sqrt(noise * (density[p] + density[at]))
        deep = prominence >= min_depth * density[p]
        if p != top and significant and deep and weight >= min_weight and prominence > best:
            second, valley, best = p, at, prominence

    def centre(peak: int) -> float:
        at = (peak + first + 0.5) * bin_pct
        near = x[np.abs(x - at) <= smooth_pct]
        return float(near.mean()) if len(near) else at

    if second is None:
        return Modes(centre(top), None, 1.0, 0.0, float(x.std()), None, None)
    split = (valley + first) * bin_pct  # the valley bin's lower edge: values below it are the low mode's
    below, above = x[x < split], x[x >= split]
    low_peak, high_peak = sorted((top, second))
    return Modes(
        centre(low_peak),
        centre(high_peak),
        len(below) / len(x),
        len(above) / len(x),
        float(below.std()) if len(below) else 0.0,
        float(above.std()) if len(above) else 0.0,
        float(split),
    )


def _p_text(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"= {p:.3f}" if p < 0.1 else f"= {p:.2f}"


def bimodal_verdict(
    dip_p_value: float | None, mode_high_pct: float | None, *, no_spread: bool = False
) -> tuple[bool | None, str]:
    """The verdict of :data:`BIMODAL_RULE` from the evidence, and the verdict in words:
    ``(True, "bimodal (dip p < 0.001, two modes)")`` only where the dip test rejects one mode
    (``dip_p_value`` < :data:`DIP_ALPHA`) and :func:`histogram_modes` found a second mode
    (``mode_high_pct`` not None); ``(False, "not bimodal (dip p < 0.001 but one mode)")``,
    ``(False, "not bimodal (two peaks but dip p = 0.42)")``, ``(False, "not bimodal (dip p = 0.42,
    one mode)")``; ``(None, why)`` where the test did not run (too few or constant values) or the
    values have no spread."""
    if no_spread:
        return None, "not defined: constant / no spread"
    if dip_p_value is None or not math.isfinite(dip_p_value):
        return None, "not tested: too few or constant values"
    p = _p_text(float(dip_p_value))
    rejects = dip_p_value < DIP_ALPHA
    two = mode_high_pct is not None and math.isfinite(mode_high_pct)
    if rejects and two:
        return True, f"bimodal (dip p {p}, two modes)"
    if rejects:
        return False, f"not bimodal (dip p {p} but one mode)"
    if two:
        return False, f"not bimodal (two peaks but dip p {p})"
    return False, f"not bimodal (dip p {p}, one mode)"


@dataclass(frozen=True, slots=True)
class Moments:
    """Sample moments: ``std`` with n − 1; ``skewness`` the adjusted Fisher–Pearson G1 and
    ``excess_kurtosis`` the bias-corrected G2 (what DuckDB's ``skewness``/``kurtosis`` return)."""

    n: int
    mean: float | None
    std: float | None
    skewness: float | None
    excess_kurtosis: float | None


def moments_from_sums(n: float, s1: float, s2: float, s3: float, s4: float, *, shift: float = 0.0) -> Moments:
    """Moments from the count and the power sums ``s_p = Σ (x − shift)^p`` (p = 1..4), so that
    they combine over any grouping of rows by addition (Joanes & Gill 1998 for G1 and G2)."""
    n_i = round(n)
    if n_i == 0:
        return Moments(0, None, None, None, None)
    m = s1 / n
    mean = m + shift
    c2 = max(0.0, s2 / n - m * m)
    c3 = s3 / n - 3 * m * s2 / n + 2 * m**3
    c4 = s4 / n - 4 * m * s3 / n + 6 * m * m * s2 / n - 3 * m**4
    std = math.sqrt(c2 * n / (n - 1)) if n_i > 1 else None
    if n_i < 4 or c2 <= 1e-12 * max(1.0, mean * mean):
        return Moments(n_i, mean, std if c2 > 0 or std is None else 0.0, None, None)
    g1 = c3 / c2**1.5
    g2 = c4 / (c2 * c2) - 3.0
    skew = g1 * math.sqrt(n * (n - 1)) / (n - 2)
    kurt = ((n + 1) * g2 + 6.0) * (n - 1) / ((n - 2) * (n - 3))
    return Moments(n_i, mean, std, skew, kurt)


def sarle_coefficient(skewness: float, excess_kurtosis: float, n: int) -> float | None:
    """Sarle's bimodality coefficient ``(g² + 1) / (κ + 3(n−1)² / ((n−2)(n−3)))`` from the sample
    skewness ``g`` and sample excess kurtosis ``κ`` (both bias-corrected, as DuckDB's
    ``skewness``/``kurtosis`` give them); None for n ≤ 3 or undefined moments."""
    if n <= 3 or skewness is None or excess_kurtosis is None:
        return None
    if not (math.isfinite(skewness) and math.isfinite(excess_kurtosis)):
        return None
    denom = excess_kurtosis + 3.0 * (n - 1) ** 2 / ((n - 2) * (n - 3))
    return (skewness**2 + 1.0) / denom if denom > 0 else None


DIP_KEYS = (
    "dip",
    "dip_p_value",
    "bimodal",
    "verdict",
    "mode_low_pct",
    "mode_high_pct",
    "std_low_pct",
    "std_high_pct",
    "weight_low",
    "weight_high",
    "valley_pct",
)


def dip_and_modes(x: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(DIP_KEYS)
    if len(x) < MIN_POINTS or float(np.ptp(x)) == 0.0:
        out["bimodal"], out["verdict"] = bimodal_verdict(None, None)
        return out
    dip, p = diptest.diptest(np.sort(x))
    m = histogram_modes(x)
    bimodal, verdict = bimodal_verdict(float(p), m.high_pct)
    out.update(
        dip=float(dip),
        dip_p_value=float(p),
        bimodal=bimodal,
        verdict=verdict,
        mode_low_pct=m.low_pct,
        mode_high_pct=m.high_pct,
        std_low_pct=m.std_low,
        std_high_pct=m.std_high,
        weight_low=m.weight_low,
        weight_high=m.weight_high,
        valley_pct=m.valley_pct,
    )
    return out
