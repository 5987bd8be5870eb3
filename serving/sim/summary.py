"""The figures of a simulated run, and a table that compares several runs (layouts) side by side.

Every figure here is **simulated** (virtual time, the GPU model): the table says so in its title.
Latency: TTFT = first token − arrival; TPOT = (finish − first token) / (output tokens − 1), per
request; ITL = gaps between consecutive tokens. SLO attainment (:func:`slo_attainment`, DistServe's
definition): the share of *all* requests meeting both the TTFT and the TPOT SLO — a request that
failed, errored, was aborted or rejected is in the denominator and misses. Energy: the GPUs' modeled energy
counters over the run (busy iterations plus the gaps between them), all GPUs of the layout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from serving.devices.gpu_specs import fidelity
from serving.sim.samples import energy_j
from serving.sim.simulator import SimResult


@dataclass(frozen=True, slots=True)
class SloSpec:
    ttft_s: float = 2.0
    tpot_s: float = 0.1


def slo_ms_error(option: str, value: Any) -> str | None:
    """Why ``value`` of the millisecond SLO option ``option`` (``--slo-ttft-ms``, ``slo_tpot_ms``)
    is not usable, naming the option, its unit and what is allowed; None when it is. The one check
    of the ms options of every command and endpoint (``SloSpec`` itself holds seconds)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{option} must be a number of milliseconds > 0, got {value!r}"
    if not (math.isfinite(value) and value > 0):
        return f"{option} must be a finite number of milliseconds > 0, got {value:g}"
    return None


@dataclass(frozen=True, slots=True)
class SimSummary:
    """One run's headline figures (all simulated)."""

    layout: str
    mode: str
    gpu: str
    gpus: int
    requests: int
    failed: int
    duration_s: float
    input_tokens: int
    output_tokens: int
    output_tokens_per_s: float
    output_tokens_per_s_per_gpu: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    tpot_p99_s: float
    itl_p50_s: float
    itl_p99_s: float
    e2e_p50_s: float
    slo_attainment: float  # 0..1, both SLOs, over every request (a failed one misses)
    slo_met: int  # requests meeting both SLOs (of ``requests``)
    slo_ttft_s: float
    slo_tpot_s: float
    energy_j: float
    avg_power_w_per_gpu: float
    j_per_output_token: float
    j_per_token: float  # per input + output token
    iterations: int
    wall_s: float
    trust: str = "simulated"  # "simulated, unvalidated" on a GPU or dtype the model was not validated on

    def to_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def slo_meets(ttft_s: np.ndarray, tpot_s: np.ndarray, ok: np.ndarray, slo: SloSpec) -> np.ndarray:
    """Per request, whether it meets both SLOs: it finished ok, TTFT ≤ ``slo.ttft_s`` and TPOT ≤
    ``slo.tpot_s``; a NaN TPOT (one output token) meets that SLO, a NaN TTFT (no first token) misses."""
    ttft_s, tpot_s = np.asarray(ttft_s, dtype=float), np.asarray(tpot_s, dtype=float)
    return np.asarray(ok, dtype=bool) & (ttft_s <= slo.ttft_s) & (np.isnan(tpot_s) | (tpot_s <= slo.tpot_s))


def slo_attainment(met: int, requests: int) -> float:
    """SLO attainment: requests meeting both SLOs ÷ every request — failed, errored, aborted and
    rejected ones included (they miss); NaN with no request. The one definition of attainment of a
    run (the simulator's, ``phaselens goodput``'s, a load report's); ``analytics.latency`` computes
    the same over the store's ``requests`` rows (status other than ``ok``: a miss)."""
    if met < 0 or met > requests:
        raise ValueError(f"met ({met}) must be within 0..requests ({requests})")
    return met / requests if requests else float("nan")


def attainment_text(s: SimSummary) -> str:
    """``50.0% (5 of 10; 5 failed)``: the attainment with its denominator, every request."""
    share = "—" if s.slo_attainment != s.slo_attainment else f"{s.slo_attainment:.1%}"
    return f"{share} ({s.slo_met:,} of {s.requests:,}; {s.failed:,} failed)"


def summarize(result: SimResult, slo: SloSpec | None = None) -> SimSummary:
    """Compute :class:`SimSummary` from a run's request events and GPU counters."""
    slo = slo or SloSpec()
    st = result.stats
    arrival_a, first_a, finish_a = (
        np.frombuffer(a, dtype=np.float64) for a in (st.arrival_s, st.first_token_s, st.finish_s)
    )
    out_a = np.frombuffer(st.output_tokens, dtype=np.int64)
    n_in = np.frombuffer(st.prompt_tokens, dtype=np.int64)
    failed = result.failed
    ttft = first_a - arrival_a
    multi = out_a > 1
    tpot = (finish_a[multi] - first_a[multi]) / (out_a[multi] - 1)
    tpot_all = np.full(len(out_a), np.nan)
    tpot_all[multi] = tpot
    # the stats hold the requests that finished ok; the failed ones are only counted (and miss)
    met = int(slo_meets(ttft, tpot_all, np.ones(len(out_a), dtype=bool), slo).sum())
    itl = np.frombuffer(st.itl_s, dtype=np.float64)
    energy = energy_j(result)
    gpus = result.layout.gpus
    duration = max(result.duration_s, 1e-9)
    out_tokens = int(out_a.sum())
    in_tokens = int(n_in.sum())
    validated, _note = fidelity(result.layout.gpu, result.layout.dtype)
    return SimSummary(
        trust="simulated" if validated else "simulated, unvalidated",
        layout=result.layout.name,
        mode=result.layout.mode,
        gpu=result.gpu_name,
        gpus=gpus,
        requests=result.requests,
        failed=failed,
        duration_s=result.duration_s,
        input_tokens=in_tokens,
        output_tokens=out_tokens,
        output_tokens_per_s=out_tokens / duration,
        output_tokens_per_s_per_gpu=out_tokens / duration / gpus,
        ttft_p50_s=_pct(ttft, 50),
        ttft_p90_s=_pct(ttft, 90),
        ttft_p99_s=_pct(ttft, 99),
        tpot_p50_s=_pct(tpot, 50),
        tpot_p90_s=_pct(tpot, 90),
        tpot_p99_s=_pct(tpot, 99),
        itl_p50_s=_pct(itl, 50),
        itl_p99_s=_pct(itl, 99),
        e2e_p50_s=_pct(finish_a - arrival_a, 50),
        slo_attainment=slo_attainment(met, result.requests),
        slo_met=met,
        slo_ttft_s=slo.ttft_s,
        slo_tpot_s=slo.tpot_s,
        energy_j=energy,
        avg_power_w_per_gpu=energy / duration / gpus,
        j_per_output_token=energy / out_tokens if out_tokens else float("nan"),
        j_per_token=energy / (out_tokens + in_tokens) if out_tokens + in_tokens else float("nan"),
        iterations=result.iterations,
        wall_s=result.wall_s,
    )


def _ms(x: float) -> str:
    return "—" if x != x else f"{x * 1000:,.0f}" if x >= 0.1 else f"{x * 1000:,.1f}"


_ROWS: tuple[tuple[str, str], ...] = (
    ("GPUs", "gpus"),
    ("requests (failed)", "requests"),
    ("traffic simulated, s", "duration_s"),
    ("output tok/s per GPU", "output_tokens_per_s_per_gpu"),
    ("TTFT p50 / p90 / p99, ms", "ttft"),
    ("TPOT p50 / p90 / p99, ms", "tpot"),
    ("SLO attainment", "slo"),
    ("energy, kWh", "energy_j"),
    ("avg power per GPU, W", "avg_power_w_per_gpu"),
    ("J per output token", "j_per_output_token"),
    ("J per token (in + out)", "j_per_token"),
    ("iterations / wall s", "iterations"),
)


def format_table(summaries: Sequence[SimSummary]) -> str:
    """A plain-text table, one column per run, labelled simulated."""
    if not summaries:
        return "(no runs)"
    s0 = summaries[0]
    header = ["SIMULATED (virtual time, GPU model v2)", *[s.layout for s in summaries]]
    rows = [header]
    for label, key in _ROWS:
        cells = [
            label
            if key != "slo"
            else f"SLO attainment (TTFT ≤ {_ms(s0.slo_ttft_s)} ms, TPOT ≤ {_ms(s0.slo_tpot_s)} ms)"
        ]
        for s in summaries:
            if key == "gpus":
                cells.append(f"{s.gpus} × {s.gpu.removeprefix('NVIDIA ')} ({s.mode})")
            elif key == "requests":
                cells.append(f"{s.requests:,} ({s.failed:,})")
            elif key == "ttft":
                cells.append(f"{_ms(s.ttft_p50_s)} / {_ms(s.ttft_p90_s)} / {_ms(s.ttft_p99_s)}")
            elif key == "tpot":
                cells.append(f"{_ms(s.tpot_p50_s)} / {_ms(s.tpot_p90_s)} / {_ms(s.tpot_p99_s)}")
            elif key == "slo":
                cells.append(attainment_text(s))
            elif key == "energy_j":
                kwh = s.energy_j / 3.6e6
                cells.append(f"{kwh:,.2f}" if kwh >= 10 else f"{kwh:.3g}")
            elif key == "iterations":
                cells.append(f"{s.iterations:,} / {s.wall_s:,.1f}")
            else:
                value = getattr(s, key)
                cells.append(
                    "—"
                    if value != value
                    else f"{value:,.0f}"
                    if value >= 100
                    else f"{value:.1f}"
                    if value >= 10
                    else f"{value:.2f}"
                )
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for i, r in enumerate(rows):
        lines.append(
            "  ".join(
                c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append(
        "Every figure is simulated: virtual time and the GPU model, not a measurement. "
        "TPOT = (finish - first token) / (output tokens - 1). SLO attainment is over every request: "
        "a failed one misses."
    )
    unvalidated = [s.layout for s in summaries if "unvalidated" in s.trust]
    if unvalidated:
        lines.append(
            f"UNVALIDATED: {', '.join(unvalidated)} run on a GPU or dtype (B200, GB200, FP8) the GPU model "
            "was never checked against measurements on: their figures are the model's extrapolation."
        )
    return "\n".join(lines)
