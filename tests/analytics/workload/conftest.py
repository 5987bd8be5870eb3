"""Traces with known properties, simulated into a real store file by `phaselens simulate --trace`:
arrivals at 4 req/s for 300 s, Poisson (gap CV 1) or bursty (Gamma gaps of shape 1/9: CV 3), and
correlated prompt/output lengths (log-normal; the output grows with the prompt)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pytest

from analytics.workload import write_trace_csv
from phaselens.cli import main
from serving.trace import TraceRequest

RATE_RPS = 4.0
DURATION_S = 300.0
T0_S = 1_796_400_000.0  # 2026-12-04 21:20:00 UTC


def known_trace(cv: float, *, seed: int, prompt_scale: float = 1.0) -> list[TraceRequest]:
    """Gamma-gap arrivals of CV ``cv`` at :data:`RATE_RPS` over :data:`DURATION_S`; prompts
    log-normal around 600 tokens, outputs around 120 rising with the prompt (correlation ~0.6)."""
    rng = np.random.default_rng(seed)
    shape = 1.0 / cv**2
    gaps = rng.gamma(shape, 1.0 / (shape * RATE_RPS), int(RATE_RPS * DURATION_S * 1.5))
    times = np.cumsum(gaps)
    times = times[times < DURATION_S]
    z = rng.normal(size=(len(times), 2))
    prompt = np.exp(np.log(600 * prompt_scale) + 0.8 * z[:, 0])
    output = np.exp(np.log(120) + 0.6 * (0.8 * z[:, 0] + 0.6 * z[:, 1]))
    return [
        TraceRequest(float(t), max(1, int(p)), max(2, int(o)))
        for t, p, o in zip(times, prompt, output, strict=True)
    ]


@dataclass(frozen=True)
class Simulated:
    """A trace and the store file it was simulated into (its scenario id)."""

    trace: list[TraceRequest]
    db: Path
    scenario_id: str


def simulate_into(trace: list[TraceRequest], db: Path, csv: Path) -> str:
    """`phaselens simulate --trace` of ``trace`` (written as an Azure CSV) into ``db``; the scenario id."""
    write_trace_csv(trace, csv, start_s=T0_S)
    rc = main(
        [
            "simulate",
            "--no-progress",
            "--trace",
            str(csv),
            "--layout",
            "agg:1xh100-sxm",
            "--sample-period-s",
            "5",
            "--db",
            str(db),
        ]
    )
    assert rc == 0
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT scenario_id FROM scenarios ORDER BY created_s DESC LIMIT 1").fetchone()[0]
    finally:
        con.close()


@pytest.fixture(scope="session")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Simulated]]:
    """The Poisson and the bursty trace, each simulated into one store file."""
    root = tmp_path_factory.mktemp("workload")
    db = root / "workload.duckdb"
    out = {}
    for name, cv, seed in (("poisson", 1.0, 1), ("bursty", 3.0, 2)):
        trace = known_trace(cv, seed=seed)
        out[name] = Simulated(trace, db, simulate_into(trace, db, root / f"{name}.csv"))
    yield out
