"""What a workload is: the :class:`Workload` of one observed (or synthesized) window, and its joint
prompt/output length distribution (:class:`JointLengths`), with the JSON form the store keeps.

A workload says how requests arrive (the mean rate, the rate per interval over the window and per UTC
hour of the day, burstiness) and what they ask for (the joint prompt/output token distribution, prefix
reuse where known). Every figure carries the workload's trust labels (analytics/trust.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analytics.jsonable import json_safe
from analytics.trust import Trust

#: Where a workload came from.
REQUESTS = "requests"  # the bundled stack's per-request rows (or a scenario's)
ENGINE_HISTOGRAMS = "engine_histograms"  # an external fleet's engine histograms and counters
TRACE = "trace"  # a list of TraceRequest (a synthesized trace, re-measured)
SOURCES = (REQUESTS, ENGINE_HISTOGRAMS, TRACE)

#: Log-binned length grid of the requests' joint histogram: 4 bins per doubling of tokens;
#: bin ``i`` >= 1 holds ``(2**((i-2)/4), 2**((i-1)/4)]`` tokens, bin 0 holds 0 tokens.
BINS_PER_DOUBLING = 4
PERCENTILES = (50, 90, 99)


def log_edges(n_bins: int) -> list[float]:
    """The upper edges of the first ``n_bins`` bins of the log grid, with the lower edge 0 first."""
    return [0.0] + [2.0 ** ((i - 1) / BINS_PER_DOUBLING) for i in range(1, n_bins)]


@dataclass(frozen=True, slots=True)
class LengthStats:
    """Mean and percentiles of a token count, in tokens."""

    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None

    @classmethod
    def of(cls, values: np.ndarray) -> LengthStats:
        if not len(values):
            return cls(None, None, None, None)
        q = np.percentile(values.astype(float), PERCENTILES)
        return cls(float(values.mean()), float(q[0]), float(q[1]), float(q[2]))

    def to_dict(self) -> dict[str, float | None]:
        return {"mean": self.mean, "p50": self.p50, "p90": self.p90, "p99": self.p99}


@dataclass(slots=True)
class JointLengths:
    """The joint prompt/output token distribution: a 2-D histogram over bins ``(edges[i], edges[i+1]]``
    of each axis (``cells``: ``(prompt bin, output bin, count)``, non-zero only), and where the rows
    were read one by one a retained sample of ``(prompt, output)`` pairs. ``joint`` is False when
    only the two marginals were observed (engine histograms) and the cells are their product
    (independence assumed, and said so in the trust notes)."""

    prompt_edges: list[float]
    output_edges: list[float]
    cells: list[tuple[int, int, float]]
    joint: bool = True
    pairs: list[tuple[int, int]] | None = None

    @property
    def total(self) -> float:
        return float(sum(c for _, _, c in self.cells))

    def marginal(self, axis: str) -> tuple[list[float], np.ndarray]:
        """``(edges, counts)`` of ``axis`` (``prompt`` or ``output``)."""
        edges = self.prompt_edges if axis == "prompt" else self.output_edges
        counts = np.zeros(max(len(edges) - 1, 0))
        k = 0 if axis == "prompt" else 1
        for cell in self.cells:
            counts[cell[k]] += cell[2]
        return edges, counts

    def percentile(self, axis: str, q: float) -> float | None:
        """The ``q``-th percentile (0-100) of ``axis`` from the histogram, interpolated log-linearly
        inside its bin (the last bin's lower edge when it is open, ``+Inf``)."""
        edges, counts = self.marginal(axis)
        total = counts.sum()
        if total <= 0:
            return None
        cum = np.cumsum(counts)
        i = int(np.searchsorted(cum, q / 100.0 * total, side="left"))
        i = min(i, len(counts) - 1)
        lo, hi = edges[i], edges[i + 1]
        before = cum[i - 1] if i else 0.0
        frac = (q / 100.0 * total - before) / counts[i] if counts[i] else 1.0
        if not math.isfinite(hi):
            return float(lo)
        lo_eff = lo if lo > 0 else hi / 2.0
        return float(lo_eff * (hi / lo_eff) ** min(max(frac, 0.0), 1.0))

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` (prompt, output) token pairs drawn from the distribution: from the retained pairs
        when there are (the joint exactly), else a cell by its count and log-uniform values in it."""
        if n <= 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        if self.pairs:
            arr = np.asarray(self.pairs, dtype=np.int64)
            pick = rng.integers(0, len(arr), n)
            return arr[pick, 0], arr[pick, 1]
        cells = np.asarray([(i, j) for i, j, _ in self.cells], dtype=np.int64)
        weights = np.asarray([c for _, _, c in self.cells], dtype=float)
        pick = rng.choice(len(cells), size=n, p=weights / weights.sum())
        return (
            _draw_in(rng, np.asarray(self.prompt_edges), cells[pick, 0]),
            _draw_in(rng, np.asarray(self.output_edges), cells[pick, 1]),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_edges": [e if math.isfinite(e) else "+Inf" for e in self.prompt_edges],
            "output_edges": [e if math.isfinite(e) else "+Inf" for e in self.output_edges],
            "cells": [[int(i), int(j), float(c)] for i, j, c in self.cells],
            "joint": self.joint,
            "pairs": [[int(p), int(o)] for p, o in self.pairs] if self.pairs is not None else None,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JointLengths:
        def edges(xs: list[Any]) -> list[float]:
            return [math.inf if x == "+Inf" else float(x) for x in xs]

        pairs = d.get("pairs")
        return cls(
            edges(d["prompt_edges"]),
            edges(d["output_edges"]),
            [(int(i), int(j), float(c)) for i, j, c in d["cells"]],
            bool(d.get("joint", True)),
            [(int(p), int(o)) for p, o in pairs] if pairs is not None else None,
        )


def _draw_in(rng: np.random.Generator, edges: np.ndarray, bins: np.ndarray) -> np.ndarray:
    """Whole token counts log-uniform in bins ``(edges[b], edges[b+1]]`` (an open last bin: up to twice
    its lower edge)."""
    lo, hi = edges[bins], edges[bins + 1]
    hi = np.where(np.isfinite(hi), hi, np.maximum(lo, 1.0) * 2.0)
    lo_eff = np.where(lo > 0, lo, hi / 2.0)
    v = np.ceil(np.exp(rng.uniform(np.log(lo_eff), np.log(hi))))
    return np.maximum(v, 1).astype(np.int64)


@dataclass(slots=True)
class RateCurve:
    """Requests per second in consecutive intervals of ``interval_s`` from ``start_s`` (the last
    interval may be cut short by the window's end: its rate is over its own length)."""

    start_s: float
    interval_s: float
    rps: list[float]

    def to_dict(self) -> dict[str, Any]:
        return {"start_s": self.start_s, "interval_s": self.interval_s, "rps": list(self.rps)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RateCurve:
        return cls(float(d["start_s"]), float(d["interval_s"]), [float(x) for x in d["rps"]])


@dataclass(slots=True)
class Workload:
    """The workload of one window.

    * ``source``: :data:`REQUESTS`, :data:`ENGINE_HISTOGRAMS` or :data:`TRACE`; ``window``: its
      ``dataset``, ``start_s``, ``end_s`` (UTC epoch s; a trace's relative to its start).
    * arrivals: ``request_count``, ``mean_rps``, ``peak_rps`` (the highest interval of ``rate_curve``),
      ``hourly_rps`` (mean rate per UTC hour of day 0-23, None for hours the window does not cover);
      burstiness: ``interarrival_cv`` (std/mean of the gaps between arrivals; 1 for Poisson),
      ``burstiness_cv`` (the same with the rate curve divided out: the gaps in units of the local
      mean gap; what a synthesized trace follows), ``gamma_shape`` (1 / burstiness_cv²: the shape of
      Gamma-distributed gaps with that CV; 1 is Poisson, below 1 bursty), ``dispersion_index``
      (variance / mean of the counts per ``dispersion_interval_s``, the rate curve divided out; 1 for
      Poisson).
    * lengths: ``lengths`` (joint), ``prompt_tokens`` / ``output_tokens`` (:class:`LengthStats`).
    * ``prefix_reuse_ratio``: the share of prompt tokens served from a prefix cache (0-1), None where
      not known; ``prefix_reuse_note`` says where it came from or why it is unknown.
    """

    source: str
    window: dict[str, Any]
    request_count: int
    mean_rps: float | None
    rate_curve: RateCurve
    hourly_rps: list[float | None]
    interarrival_cv: float | None
    burstiness_cv: float | None
    gamma_shape: float | None
    dispersion_index: float | None
    dispersion_interval_s: float | None
    lengths: JointLengths
    prompt_tokens: LengthStats
    output_tokens: LengthStats
    prefix_reuse_ratio: float | None
    prefix_reuse_note: str
    trust: Trust = field(default_factory=Trust)

    @property
    def start_s(self) -> float:
        return float(self.window["start_s"])

    @property
    def end_s(self) -> float:
        return float(self.window["end_s"])

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def peak_rps(self) -> float | None:
        return max(self.rate_curve.rps) if self.rate_curve.rps else None

    def summary(self) -> dict[str, Any]:
        """The headline figures, units in the names (the store's summary columns, the CLI's table)."""
        out: dict[str, Any] = {
            "source": self.source,
            "request_count": self.request_count,
            "mean_rps": self.mean_rps,
            "peak_rps": self.peak_rps,
            "interarrival_cv": self.interarrival_cv,
            "burstiness_cv": self.burstiness_cv,
            "gamma_shape": self.gamma_shape,
            "dispersion_index": self.dispersion_index,
            "prefix_reuse_ratio": self.prefix_reuse_ratio,
        }
        for name, stats in (("prompt_tokens", self.prompt_tokens), ("output_tokens", self.output_tokens)):
            for key, value in stats.to_dict().items():
                out[f"{name}_{key}"] = value
        return json_safe(out)

    def to_dict(self) -> dict[str, Any]:
        """The whole workload as JSON values (the API's answer, the store's ``details``)."""
        return json_safe(
            {
                "source": self.source,
                "window": self.window,
                "request_count": self.request_count,
                "mean_rps": self.mean_rps,
                "peak_rps": self.peak_rps,
                "rate_curve": self.rate_curve.to_dict(),
                "hourly_rps": self.hourly_rps,
                "interarrival_cv": self.interarrival_cv,
                "burstiness_cv": self.burstiness_cv,
                "gamma_shape": self.gamma_shape,
                "dispersion_index": self.dispersion_index,
                "dispersion_interval_s": self.dispersion_interval_s,
                "lengths": self.lengths.to_dict(),
                "prompt_tokens": self.prompt_tokens.to_dict(),
                "output_tokens": self.output_tokens.to_dict(),
                "prefix_reuse_ratio": self.prefix_reuse_ratio,
                "prefix_reuse_note": self.prefix_reuse_note,
                "trust": self.trust.to_dict(),
            }
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Workload:
        """The inverse of :meth:`to_dict` (a stored workload's ``details``)."""
        trust = Trust()
        for label in d.get("trust", {}).get("labels", []):
            trust.add(label)
        trust.notes = list(d.get("trust", {}).get("notes", []))
        return cls(
            source=d["source"],
            window=dict(d["window"]),
            request_count=int(d["request_count"]),
            mean_rps=d.get("mean_rps"),
            rate_curve=RateCurve.from_dict(d["rate_curve"]),
            hourly_rps=list(d.get("hourly_rps") or [None] * 24),
            interarrival_cv=d.get("interarrival_cv"),
            burstiness_cv=d.get("burstiness_cv"),
            gamma_shape=d.get("gamma_shape"),
            dispersion_index=d.get("dispersion_index"),
            dispersion_interval_s=d.get("dispersion_interval_s"),
            lengths=JointLengths.from_dict(d["lengths"]),
            prompt_tokens=LengthStats(**d["prompt_tokens"]),
            output_tokens=LengthStats(**d["output_tokens"]),
            prefix_reuse_ratio=d.get("prefix_reuse_ratio"),
            prefix_reuse_note=d.get("prefix_reuse_note", ""),
            trust=trust,
        )
