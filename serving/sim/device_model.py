"""A device model fitted to a live run: iteration time as a linear function of the iteration's work.

The simulator times iterations with the GPU model (:func:`serving.devices.gpu_model.predict_iteration`)
unless it is given an ``iteration_model``. :class:`FittedDeviceModel` is one: a least-squares fit of
a live run's iteration wall times (``end_s - start_s`` of the ``iteration`` events of
``GET /v1/telemetry``, docs/TELEMETRY.md) on the work each iteration ran::

    time_s = a + b * prefill_tokens + c * decode_seqs + d * context_tokens + e * attention_pairs

fitted on relative residuals and robustly (Huber weights: the rare iterations another process
preempted do not drag the fit), plus the engine loop's time between back-to-back iterations (``between_s``: the median gap from one
iteration's end to the next one's start, when the engine went straight on; the worker sends the
tokens, reads its pipe and admits requests there). Iteration events carry no ``attention_pairs``, so
both the fit and the prediction use the same estimate from the counts: decode sequences attend
their context (``context_tokens - prefill_tokens`` in all), and the ``prefill_tokens`` of the
``batch_size - decode_seqs`` prompts are taken as equal prompts from an empty cache
(``n (n + 1) / 2`` pairs each).

It is how a ``cpu`` (or any measured) device is simulated: calibrate on one run, predict another
rate or layout (:class:`~serving.sim.simulator.Simulation` ``iteration_model=``). It says nothing about
GPU power: the estimates' power and activity fields are 0, and the simulated energy of such a run
means nothing.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from serving.devices.base import IterationWork
from serving.devices.gpu_model import IterationEstimate

FEATURES = ("intercept", "prefill_tokens", "decode_seqs", "context_tokens", "attention_pairs")
_MIN_ITERATIONS = 8
BACK_TO_BACK_S = 0.005  # a gap shorter than this between iterations: the engine went straight on


class DeviceModelError(ValueError):
    """A device model cannot be fitted (too few or malformed iterations); the message says which."""


def work_features(prefill_tokens: int, decode_seqs: int, context_tokens: int, batch_size: int) -> np.ndarray:
    """The fit's regressors for one iteration (see the module docstring for ``attention_pairs``)."""
    prompts = max(0, batch_size - decode_seqs)
    decode_context = max(0, context_tokens - prefill_tokens)
    prefill_pairs = 0.0
    if prompts and prefill_tokens:
        n = prefill_tokens / prompts
        prefill_pairs = prompts * n * (n + 1) / 2
    return np.array(
        [
            1.0,
            float(prefill_tokens),
            float(decode_seqs),
            float(context_tokens),
            decode_context + prefill_pairs,
        ]
    )


@dataclass(frozen=True, slots=True)
class FitQuality:
    """How well the fit explains the iterations it was fitted on."""

    iterations: int
    r2: float  # coefficient of determination of the iteration times
    rmse_s: float  # root-mean-square residual
    mean_time_s: float  # mean measured iteration time
    median_abs_rel_error: float  # median |predicted - measured| / measured


@dataclass(frozen=True, slots=True)
class FittedDeviceModel:
    """Iteration time = ``coefficients · work_features(...)`` (clamped to ≥ ``floor_s``) + ``between_s``.

    Build it with :meth:`fit`; call it as ``model(work, pool)`` (the simulator's ``iteration_model``
    hook) to get an :class:`~serving.devices.gpu_model.IterationEstimate` whose ``time_s`` is the
    iteration's period (compute and the loop time before the next iteration), ``busy_s`` the
    device's share of it and ``host_s`` the loop's; power, clock and activities are 0.
    """

    coefficients: tuple[float, ...]  # in FEATURES order, seconds per unit
    between_s: float  # engine loop time between back-to-back iterations
    floor_s: float  # the shortest iteration measured (a prediction never goes below it)
    quality: FitQuality
    device: str = "cpu"
    residuals_s: tuple[float, ...] = ()  # measured − fitted time of each calibration decode iteration
    prefill_residuals_s: tuple[float, ...] = ()  # ... of each iteration that computed prompt tokens

    @classmethod
    def fit(
        cls, iteration_events: Iterable[Mapping[str, Any]], *, back_to_back_s: float = BACK_TO_BACK_S
    ) -> FittedDeviceModel:
        """Fit on ``iteration`` events (one worker's, or several workers' of the same device kind).

        Raises :class:`DeviceModelError` when fewer than 8 iterations are given or an event lacks
        ``start_s``, ``end_s``, ``prefill_tokens``, ``decode_seqs``, ``context_tokens`` or
        ``batch_size``.
        """
        rows, times = [], []
        by_worker: dict[str, list[tuple[float, float]]] = {}
        device = None
        for ev in iteration_events:
            if ev.get("type", "iteration") != "iteration":
                continue
            try:
                start, end = float(ev["start_s"]), float(ev["end_s"])
                rows.append(
                    work_features(
                        int(ev["prefill_tokens"]),
                        int(ev["decode_seqs"]),
                        int(ev["context_tokens"]),
                        int(ev["batch_size"]),
                    )
                )
            except (KeyError, TypeError, ValueError) as e:
                raise DeviceModelError(
                    f"an iteration event lacks a usable {e}: each needs start_s, end_s, prefill_tokens, "
                    "decode_seqs, context_tokens and batch_size (docs/TELEMETRY.md)"
                ) from e
            times.append(end - start)
            by_worker.setdefault(str(ev.get("worker")), []).append((start, end))
            device = device or ev.get("device")
        if len(times) < _MIN_ITERATIONS:
            raise DeviceModelError(
                f"{len(times)} iteration event(s) given: a fit needs at least {_MIN_ITERATIONS}"
            )
        x, y = np.vstack(rows), np.asarray(times)
        coef = _fit_nonnegative(x, y)
        pred = x @ coef
        resid = y - pred
        ss_tot = float(np.sum((y - y.mean()) ** 2))
        r2 = 1.0 - float(np.sum(resid**2)) / ss_tot if ss_tot > 0 else 1.0
        gaps = back_to_back_gaps_s(by_worker.values(), back_to_back_s=back_to_back_s)
        quality = FitQuality(
            iterations=len(y),
            r2=r2,
            rmse_s=float(math.sqrt(np.mean(resid**2))),
            mean_time_s=float(y.mean()),
            median_abs_rel_error=float(np.median(np.abs(resid) / np.maximum(y, 1e-9))),
        )
        return cls(
            coefficients=tuple(float(c) for c in coef),
            between_s=float(np.median(gaps)) if gaps else 0.0,
            floor_s=float(y.min()),
            quality=quality,
            device=str(device or "cpu"),
            residuals_s=tuple(float(r) for r, p in zip(resid, x[:, 1], strict=True) if p == 0),
            prefill_residuals_s=tuple(float(r) for r, p in zip(resid, x[:, 1], strict=True) if p > 0),
        )

    def iteration_s(
        self, prefill_tokens: int, decode_seqs: int, context_tokens: int, batch_size: int
    ) -> float:
        """The fitted compute time of one iteration (without the loop time between iterations)."""
        t = float(
            np.dot(self.coefficients, work_features(prefill_tokens, decode_seqs, context_tokens, batch_size))
        )
        return max(self.floor_s, t)

    def __call__(self, work: IterationWork, pool: Any = None) -> IterationEstimate:
        """The simulator's ``iteration_model`` hook: the estimate of ``work`` (``pool`` is unused)."""
        busy = self.iteration_s(work.prefill_tokens, work.decode_seqs, work.context_tokens, work.batch_size)
        return self.estimate(busy)

    def estimate(self, busy_s: float) -> IterationEstimate:
        """The estimate of an iteration computing for ``busy_s``: the loop time added, no power."""
        busy = busy_s
        return IterationEstimate(
            time_s=busy + self.between_s,
            power_w=0.0,
            sm_clock_mhz=0,
            compute_s=busy,
            memory_s=0.0,
            sm_active=0.0,
            dram_active=0.0,
            bound="compute",
            host_s=self.between_s,
            busy_s=busy,
        )

    def jittered(self, seed: int = 0) -> JitteredDeviceModel:
        """This model with the calibration run's noise: each iteration's time gets one of the fit's
        residuals, drawn at random (seeded) from those of its kind (with prompt tokens, or decode
        only: a host's scatter differs between them). A shared host's iteration times scatter (OS
        scheduling, other processes, allocator), and that scatter — not the mean — makes the tail
        percentiles of ITL and of queueing; a deterministic fit predicts means well and p90s low."""
        return JitteredDeviceModel(self, seed)

    def describe(self) -> str:
        """One line: the coefficients (µs per unit) and the fit quality."""
        terms = ", ".join(
            f"{name}={c * 1e6:.3g}µs" for name, c in zip(FEATURES, self.coefficients, strict=True)
        )
        q = self.quality
        return (
            f"{self.device} device model: {terms}; between iterations {self.between_s * 1e3:.2f} ms; "
            f"fit on {q.iterations} iterations: R²={q.r2:.3f}, RMSE {q.rmse_s * 1e3:.2f} ms "
            f"(mean iteration {q.mean_time_s * 1e3:.2f} ms), median |error| {q.median_abs_rel_error:.1%}"
        )


def _fit_nonnegative(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Robust least squares with every work coefficient ≥ 0 (more work never takes less time): fit, drop
    the most negative term (collinear ones, e.g. context and attention pairs on short prompts) and
    refit until none is; terms that never vary are left out. The intercept is free."""
    used = [0] + [j for j in range(1, x.shape[1]) if np.ptp(x[:, j]) > 0]
    while True:
        sol = _huber_lstsq(x[:, used], y)
        worst = min(((c, j) for j, c in zip(used, sol, strict=True) if j), default=(0.0, 0))
        if worst[0] >= 0:
            break
        used.remove(worst[1])  # the most negative term first: dropping it may right the others
    coef = np.zeros(x.shape[1])
    coef[used] = sol
    return coef


def _huber_lstsq(x: np.ndarray, y: np.ndarray, *, rounds: int = 20) -> np.ndarray:
    """Least squares of the *relative* residuals, robust to outliers (Huber weights, iteratively
    reweighted). Relative, because iteration times span 1 ms decodes to 100 ms prefills and their
    scatter grows with them; robust, because a shared host's times have a heavy tail (an iteration
    preempted by another process) that would drag the fit above the typical iteration. The tail
    stays in the residuals instead (:meth:`FittedDeviceModel.jittered`)."""
    base = 1.0 / np.maximum(y, 1e-9)
    w = np.ones_like(y)
    sol = np.zeros(x.shape[1])
    for k in range(rounds):
        sw = base * np.sqrt(w)
        new, *_ = np.linalg.lstsq(x * sw[:, None], y * sw, rcond=None)
        if k and np.allclose(new, sol, rtol=1e-6, atol=1e-12):
            return new
        sol = new
        r = (y - x @ sol) * base
        scale = 1.4826 * float(np.median(np.abs(r - np.median(r))))
        if scale <= 0:
            return sol
        w = np.minimum(1.0, 1.345 * scale / np.maximum(np.abs(r), 1e-12))
    return sol


def back_to_back_gaps_s(
    spans_by_worker: Iterable[Iterable[tuple[float, float]]], *, back_to_back_s: float = BACK_TO_BACK_S
) -> list[float]:
    """Gaps from each iteration's end to its worker's next iteration start, when shorter than
    ``back_to_back_s`` (the engine went straight on: the gap is the loop's own time)."""
    gaps = []
    for spans in spans_by_worker:
        for (_, e0), (s1, _) in itertools.pairwise(sorted(spans)):
            if 0 <= s1 - e0 < back_to_back_s:
                gaps.append(s1 - e0)
    return gaps


def iteration_events(batches: Sequence[Mapping[str, Any]], worker: str | None = None) -> list[dict[str, Any]]:
    """The ``iteration`` events of telemetry batches, optionally of one worker, in start order."""
    out = [
        ev
        for b in batches
        for ev in b.get("events", [])
        if ev.get("type") == "iteration" and (worker is None or ev.get("worker") == worker)
    ]
    out.sort(key=lambda ev: ev["start_s"])
    return out


class JitteredDeviceModel:
    """A :class:`FittedDeviceModel` whose iteration times carry resampled fit residuals (see
    :meth:`FittedDeviceModel.jittered`); times never drop below the shortest measured iteration."""

    __slots__ = ("_prefill_residuals", "_residuals", "_rng", "model")

    def __init__(self, model: FittedDeviceModel, seed: int = 0) -> None:
        self.model = model
        either = model.residuals_s or model.prefill_residuals_s or (0.0,)
        self._residuals = np.asarray(model.residuals_s or either, dtype=np.float64)
        self._prefill_residuals = np.asarray(model.prefill_residuals_s or either, dtype=np.float64)
        self._rng = np.random.default_rng(seed)

    def __call__(self, work: IterationWork, pool: Any = None) -> IterationEstimate:
        """The simulator's ``iteration_model`` hook (``pool`` is unused)."""
        m = self.model
        mean = m.iteration_s(work.prefill_tokens, work.decode_seqs, work.context_tokens, work.batch_size)
        pool_s = self._prefill_residuals if work.prefill_tokens else self._residuals
        busy = max(m.floor_s, mean + float(pool_s[self._rng.integers(len(pool_s))]))
        return m.estimate(busy)


def dispatch_delays_s(
    request_events: Iterable[Mapping[str, Any]], iteration_events: Sequence[Mapping[str, Any]]
) -> list[float]:
    """``first_scheduled_s - arrival_s`` of each request that found its (prefill) worker idle — no
    iteration of it running between the arrival and the request's first scheduling (see
    :func:`measured_dispatch_delay_s`). Each request is one binary search over its worker's
    iterations (sorted by start, with the running maximum of their ends), so an hour of a live
    window's iterations stays cheap."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for ev in iteration_events:
        spans.setdefault(str(ev.get("worker")), []).append((float(ev["start_s"]), float(ev["end_s"])))
    index: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for worker, worker_spans in spans.items():
        worker_spans.sort()
        arr = np.asarray(worker_spans, dtype=float)
        index[worker] = (arr[:, 0], np.maximum.accumulate(arr[:, 1]))
    delays = []
    for ev in request_events:
        arrival, scheduled = ev.get("arrival_s"), ev.get("first_scheduled_s")
        worker = str(ev.get("prefill_worker"))
        if arrival is None or scheduled is None or worker not in index:
            continue
        starts, max_ends = index[worker]
        # the iterations that started before the request's own iteration; busy when one ended after the arrival
        k = int(np.searchsorted(starts, float(scheduled) - 1e-6, side="left"))
        if k == 0 or max_ends[k - 1] <= float(arrival):
            delays.append(float(scheduled) - float(arrival))
    return delays


def measured_dispatch_delay_s(
    request_events: Iterable[Mapping[str, Any]], iteration_events: Sequence[Mapping[str, Any]]
) -> float | None:
    """The live front end's dispatch delay: the median of ``first_scheduled_s - arrival_s`` over the
    requests that found their (prefill) worker idle — no iteration of it running between the
    arrival and the request's first scheduling — so the wait is the router's HTTP handling,
    tokenization and pipe to the worker, not queueing. ``None`` when no request arrived at an idle
    worker. Its use: :class:`~serving.sim.simulator.Simulation` ``dispatch_delay_s=``.
    """
    delays = dispatch_delays_s(request_events, iteration_events)
    return float(np.median(delays)) if delays else None
