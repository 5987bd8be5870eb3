"""What a load run measured: each request's result, the latency statistics and the run's
report (:class:`LoadReport`, built by :func:`build_report`, rendered by :func:`format_report`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

MAX_ERRORS_SHOWN = 5


class LoadGenError(RuntimeError):
    """The load run cannot start (e.g. the server is unreachable or lists no model)."""


@dataclass(slots=True)
class RequestResult:
    """What happened to one request. Times are seconds; ``*_s`` offsets are from the run start."""

    index: int
    arrival_s: float
    prompt_tokens_requested: int
    output_tokens_requested: int
    sent_s: float | None = None
    status: str = "pending"
    error: str | None = None
    http_status: int | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usage_reported: bool = False

    @property
    def ok(self) -> bool:
        """True when the request streamed to ``[DONE]`` without an error."""
        return self.status == "ok"


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Percentiles and mean of one latency, in milliseconds (NaN when there are no samples)."""

    n: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float


@dataclass(slots=True)
class LoadReport:
    """Per-request results and the run's summary (ok requests only count toward throughput)."""

    url: str
    model: str
    results: list[RequestResult]
    duration_s: float
    n_requests: int
    n_ok: int
    n_failed: int
    request_throughput_rps: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    prompt_tokens_total: int
    completion_tokens_total: int
    ttft: LatencyStats
    itl: LatencyStats
    e2e: LatencyStats
    clipped: int = 0
    max_concurrency: int | None = None
    errors: list[str] = field(default_factory=list)
    # Per emulated worker, what the run's iterations did on the modeled GPU (see emulation_during).
    emulation: list[dict[str, Any]] | None = None
    # Requests of the trace never sent because the run was stopped (SIGINT/SIGTERM): not failures.
    not_sent: int = 0

    def summary_dict(self) -> dict[str, Any]:
        """The summary (everything but the per-request results) as JSON-ready data."""
        d = self.to_dict()
        d.pop("results")
        return d

    def to_dict(self) -> dict[str, Any]:
        """The whole report as JSON-ready data (NaN becomes null)."""
        return _nan_to_none(asdict(self))


# --------------------------------------------------------------------------------------------- stats


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) with linear interpolation (numpy's default); NaN if empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q!r}")
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def latency_stats(values_s: Sequence[float]) -> LatencyStats:
    """p50/p90/p99/mean in ms of latencies given in seconds."""
    ms = [v * 1000.0 for v in values_s]
    mean = sum(ms) / len(ms) if ms else math.nan
    return LatencyStats(len(ms), percentile(ms, 50), percentile(ms, 90), percentile(ms, 99), mean)


def build_report(
    url: str,
    model: str,
    results: list[RequestResult],
    duration_s: float,
    *,
    clipped: int = 0,
    max_concurrency: int | None = None,
    not_sent: int = 0,
) -> LoadReport:
    """Summarise per-request results into a :class:`LoadReport` (``results``: the requests sent)."""
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    prompt_total = sum(r.prompt_tokens for r in ok)
    completion_total = sum(r.completion_tokens for r in ok)

    def per_s(x: float) -> float:
        return x / duration_s if duration_s > 0 else 0.0

    return LoadReport(
        url=url,
        model=model,
        results=results,
        duration_s=duration_s,
        n_requests=len(results),
        n_ok=len(ok),
        n_failed=len(failed),
        request_throughput_rps=per_s(len(ok)),
        output_tokens_per_s=per_s(completion_total),
        total_tokens_per_s=per_s(prompt_total + completion_total),
        prompt_tokens_total=prompt_total,
        completion_tokens_total=completion_total,
        ttft=latency_stats([r.ttft_s for r in ok if r.ttft_s is not None]),
        itl=latency_stats([x for r in ok for x in r.itl_s]),
        e2e=latency_stats([r.e2e_s for r in ok if r.e2e_s is not None]),
        clipped=clipped,
        max_concurrency=max_concurrency,
        errors=[f"#{r.index} {r.status}: {r.error}" for r in failed[:MAX_ERRORS_SHOWN]],
        not_sent=not_sent,
    )


def _nan_to_none(obj: Any) -> Any:
    """Replace NaN floats by None, recursively (JSON has no NaN)."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nan_to_none(v) for v in obj]
    return obj


def format_report(report: LoadReport) -> str:
    """The report as a readable plain-text table."""
    lines = [
        f"load run against {report.url} (model {report.model})",
        f"  requests    {report.n_requests} sent, {report.n_ok} ok, {report.n_failed} failed, "
        f"{report.clipped} clipped"
        + (f", max concurrency {report.max_concurrency}" if report.max_concurrency else "")
        + (f"; stopped early: {report.not_sent} not sent" if report.not_sent else ""),
        f"  duration    {report.duration_s:.2f} s",
        f"  throughput  {report.request_throughput_rps:.3f} req/s, "
        f"{report.output_tokens_per_s:.1f} output tok/s, {report.total_tokens_per_s:.1f} total tok/s",
        f"  tokens      {report.prompt_tokens_total} prompt, {report.completion_tokens_total} completion",
        "",
        f"  {'latency (ms)':<14}{'n':>8}{'p50':>10}{'p90':>10}{'p99':>10}{'mean':>10}",
    ]
    for name, s in (("TTFT", report.ttft), ("ITL", report.itl), ("end-to-end", report.e2e)):
        cells = "".join(f"{_fmt_ms(v):>10}" for v in (s.p50_ms, s.p90_ms, s.p99_ms, s.mean_ms))
        lines.append(f"  {name:<14}{s.n:>8}{cells}")
    if report.emulation:
        lines += [
            "",
            "  emulated GPUs (modeled, not measured): host-bound = iterations the host could not pace",
        ]
        for e in report.emulation:
            lines.append(
                f"    {e['worker']:<10} {e['device']} modeling {e['models_shape']}: {e['iterations']} iterations, "
                f"{e['lagged_iterations']} host-bound ({100 * e['host_bound_fraction']:.1f} %), "
                f"lag {e['lag_s']:.2f} s"
            )
    if report.errors:
        lines += ["", f"  errors (first {len(report.errors)} of {report.n_failed}):"]
        lines += [f"    {e}" for e in report.errors]
    return "\n".join(lines)


def _fmt_ms(v: float) -> str:
    """A latency cell: '-' for NaN."""
    return "-" if math.isnan(v) else f"{v:.1f}"
