"""How far to trust a recommendation: the simulator's replay of the window on the *current* layout
against what was measured on it.

:func:`measured_figures` reduces measured request events (the live stack's telemetry
``request`` events or the store's ``requests`` rows: ``arrival_s``, ``first_token_s``,
``finish_s``, ``output_tokens``, ``status``) to TTFT/TPOT percentiles and output tokens/s;
:func:`measure_live` replays a trace on a running stack (``serving.sim.live_compare.run_live``)
and does the same. :func:`confidence` compares them with the replay's METRICS:

* ``replay_error_pct`` per figure: (simulated − measured) / measured × 100, for the TTFT p90,
  the TPOT p90 and the output tokens/s;
* ``level``: ``high`` when every |error| ≤ :data:`HIGH_PCT` (10 %: the simulator's plumbing check
  against the emulated stack, docs/BENCHMARKS.md "sim vs live"), ``medium`` ≤ :data:`MEDIUM_PCT`
  (25 %), else ``low`` (a 30 % miss says so in ``text``); ``low`` too when nothing was measured,
  the text saying the error is unknown and that the GPU model's documented error against published
  serving measurements is ≤ :data:`UNMEASURED_PCT` (docs/FIDELITY.md);
* ``margin_pct``: the gain a change must beat to be recommended — the worst |error|, or
  :data:`UNMEASURED_PCT` when unmeasured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from serving.trace import TraceRequest

HIGH_PCT = 10.0
MEDIUM_PCT = 25.0
UNMEASURED_PCT = 15.0
FIGURES = (
    ("ttft_p90", "ttft_p90_s"),
    ("tpot_p90", "tpot_p90_s"),
    ("output_tokens_per_s", "output_tokens_per_s"),
)


def measured_figures(events: Sequence[dict[str, Any]]) -> dict[str, float]:
    """TTFT and TPOT p50/p90/p99 (s) and output tokens/s (first arrival → last finish) of the ok
    requests among ``events``; ``requests`` counts them. TPOT = (finish − first token) /
    (output tokens − 1), as the simulator's summary defines it."""
    ok = [e for e in events if e.get("status", "ok") == "ok" and e.get("first_token_s") is not None]
    if not ok:
        raise ValueError("no ok request with a first token among the measured events")
    ttft = np.asarray([e["first_token_s"] - e["arrival_s"] for e in ok], dtype=float)
    tpot = np.asarray(
        [
            (e["finish_s"] - e["first_token_s"]) / (e["output_tokens"] - 1)
            for e in ok
            if e.get("output_tokens", 0) > 1 and e.get("finish_s") is not None
        ],
        dtype=float,
    )
    span = max(e["finish_s"] for e in ok) - min(e["arrival_s"] for e in ok)
    out_tokens = sum(int(e.get("output_tokens") or 0) for e in ok)

    def pct(a: np.ndarray, q: float) -> float:
        return float(np.percentile(a, q)) if len(a) else float("nan")

    return {
        "ttft_p50_s": pct(ttft, 50),
        "ttft_p90_s": pct(ttft, 90),
        "ttft_p99_s": pct(ttft, 99),
        "tpot_p50_s": pct(tpot, 50),
        "tpot_p90_s": pct(tpot, 90),
        "tpot_p99_s": pct(tpot, 99),
        "output_tokens_per_s": out_tokens / span if span > 0 else float("nan"),
        "requests": float(len(ok)),
    }


def measure_live(url: str, trace: Sequence[TraceRequest]) -> tuple[dict[str, float], str]:
    """Replay ``trace`` on the stack at ``url`` (its current layout) and measure it: the figures
    and their trust label (``emulated`` when its GPUs are, else ``measured``)."""
    from serving.sim.live_compare import run_live

    run = run_live(url, trace)
    label = "emulated" if any(d.get("emulation") for d in run.after.values()) else "measured"
    return measured_figures(run.requests), label


def confidence(current_predicted: dict[str, Any], measured: dict[str, Any] | None) -> dict[str, Any]:
    """The confidence block of a recommendation (module docstring). ``current_predicted``: the
    replay's figures on the current layout (``ttft_p90_s``, ``tpot_p90_s``, ``output_tokens_per_s``
    — the total, not per GPU)."""
    if not measured:
        return {
            "level": "low",
            "replay_error_pct": {name: None for name, _ in FIGURES},
            "margin_pct": UNMEASURED_PCT,
            "text": (
                "not checked: nothing was measured on the current layout over this window, so the "
                "simulator's error here is unknown (the GPU model's documented error against published "
                f"serving measurements is within {UNMEASURED_PCT:g} %; a change must beat that)"
            ),
        }
    errors: dict[str, float | None] = {}
    for name, key in FIGURES:
        sim, real = current_predicted.get(key), measured.get(key)
        ok = all(isinstance(v, int | float) and math.isfinite(v) for v in (sim, real)) and real
        errors[name] = (sim - real) / real * 100.0 if ok else None
    known = {k: abs(v) for k, v in errors.items() if v is not None}
    if not known:
        return confidence(current_predicted, None)
    worst_name = max(known, key=lambda k: known[k])
    worst = known[worst_name]
    level = "high" if worst <= HIGH_PCT else "medium" if worst <= MEDIUM_PCT else "low"
    parts = ", ".join(f"{k} {v:+.1f} %" for k, v in errors.items() if v is not None)
    text = f"the replay of this window on the current layout is off by {parts} against the measurement"
    if level == "low":
        text += (
            f": the simulator misses today's measurements by {worst:.0f} % ({worst_name}); "
            "treat every prediction below as that uncertain"
        )
    return {
        "level": level,
        "replay_error_pct": errors,
        "margin_pct": max(worst, 0.0),
        "text": text,
    }


def measured_from_store(
    con: Any, start_s: float, end_s: float, node: str | None = None, *, window: Any = None
) -> dict[str, float]:
    """:func:`measured_figures` of the store's ``requests`` rows arriving in ``[start_s, end_s)``
    (one ``node``, or all; or the nodes of ``window``, an ``analytics.window.Window``: a live window
    leaves the simulated scenarios' rows out): what the current layout did over the window the
    trace was taken from."""
    where = "arrival_s >= ? AND arrival_s < ?" + (" AND node = ?" if node else "")
    params = [start_s, end_s, *([node] if node else [])]
    if window is not None:
        nodes, node_params = window.node_sql("node")
        where += f" AND {nodes}"
        params += node_params
    rows = con.execute(
        f"SELECT arrival_s, first_token_s, finish_s, output_tokens, status FROM requests WHERE {where}",
        params,
    ).fetchall()
    names = ("arrival_s", "first_token_s", "finish_s", "output_tokens", "status")
    return measured_figures([dict(zip(names, r, strict=True)) for r in rows])
