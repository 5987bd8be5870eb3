"""The figures of a simulated run, and a table that compares several runs (layouts) side by side.

Every figure here is **simulated** (virtual time, the GPU model): the table says so in its title.
Latency: TTFT = first token − arrival; TPOT = (finish − first token) / (output tokens − 1), per
request; ITL = gaps between consecutive tokens. SLO attainment: the share of requests meeting both
the TTFT and the TPOT SLO (DistServe's definition of attainment). Energy: the GPUs' modeled energy
counters over the run (busy iterations plus the gaps between them), all GPUs of the layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from serving.sim.samples import energy_j
from serving.sim.simulator import SimResult


@dataclass(frozen=True, slots=True)
class SloSpec:
    ttft_s: float = 2.0
    tpot_s: float = 0.1


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
    slo_attainment: float  # 0..1, both SLOs
    slo_ttft_s: float
    slo_tpot_s: float
    energy_j: float
    avg_power_w_per_gpu: float
    j_per_output_token: float
    j_per_token: float  # per input + output token
    iterations: int
    wall_s: float
    trust: str = "simulated"

    def to_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


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
    tpot_all = np.zeros(len(out_a))
    tpot_all[multi] = tpot
    meets = (ttft <= slo.ttft_s) & (tpot_all <= slo.tpot_s)
    itl = np.frombuffer(st.itl_s, dtype=np.float64)
    energy = energy_j(result)
    gpus = result.layout.gpus
    duration = max(result.duration_s, 1e-9)
    out_tokens = int(out_a.sum())
    in_tokens = int(n_in.sum())
    return SimSummary(
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
        slo_attainment=float(meets.mean()) if len(meets) else float("nan"),
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
                cells.append(f"{s.slo_attainment:.1%}")
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
        "TPOT = (finish - first token) / (output tokens - 1)."
    )
    return "\n".join(lines)
