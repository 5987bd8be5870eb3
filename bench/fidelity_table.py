"""Calibrate the GPU model's engine profiles on some published serving measurements and report the
error on the others (held out), as docs/FIDELITY.md shows.

The published figures and their conventions are serving/devices/published.py (each with its source
key, docs/FIDELITY.md, "Sources"; nothing is fetched); the fit is serving/devices/calibration.py.
``PROFILES`` in ``serving/devices/gpu_model.py`` ship the fitted values (rounded); this script refits,
prints both, and the table uses the shipped ones.

    python bench/fidelity_table.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from serving.config import ModelConfig
from serving.devices import DEFAULT_CONSTANTS, PROFILES, EngineProfile, IterationWork, predict_iteration
from serving.devices.calibration import FITS, fit_kernel_latency_cycles, fit_profile
from serving.devices.published import (
    LINK_OF,
    POINTS,
    SHAPES,
    SOURCES,
    decode_work,
    prefill_work,
    prompt_step_evidence,
)

GPU_LABEL = {"h100-sxm": "H100 SXM", "h200": "H200", "a100-sxm-80gb": "A100-SXM-80GB"}


# -- tables ----------------------------------------------------------------------------------------------


def comparisons(profiles: dict[str, EngineProfile] | None = None) -> list[dict[str, Any]]:
    """Every point beside the model (shipped PROFILES unless ``profiles`` overrides some)."""
    out = []
    for p in POINTS:
        prof = (profiles or {}).get(p.profile)
        modeled = p.modeled_ms(prof)
        out.append(
            {
                "source": p.source,
                "gpu": p.gpu,
                "shape": p.shape,
                "tp": p.tp,
                "metric": p.metric,
                "what": p.what,
                "profile": p.profile,
                "measured_ms": p.measured_ms,
                "modeled_ms": round(modeled, 2),
                "error_pct": round((modeled / p.measured_ms - 1.0) * 100.0, 1),
                "role": p.role,
                "note": p.note,
            }
        )
    return out


def held_out_summary(comps: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Max |error| % and count of the held-out rows per (source, metric)."""
    out: dict[str, dict[str, float]] = {}
    for c in comps:
        if c["role"] != "held-out":
            continue
        key = f"{c['source']} {c['metric']}"
        s = out.setdefault(key, {"n": 0, "max_abs_error_pct": 0.0, "within_15pct": 0})
        s["n"] += 1
        s["max_abs_error_pct"] = max(s["max_abs_error_pct"], abs(c["error_pct"]))
        s["within_15pct"] += abs(c["error_pct"]) <= 15.0
    return out


PREFILL_TOKENS = (128, 512, 1024, 2048, 4096, 8192)
DECODE_BATCHES = (1, 8, 32, 64, 128, 256)
DECODE_CONTEXT = 1024
GRID = (("llama-3.1-8b", 1), ("llama-3.1-70b", 4))


def model_grid(profile: str | None = None) -> list[dict[str, Any]]:
    """TTFT (one prompt of n tokens) and TPOT (decode step, batch B, context 1024), ms, per GPU and
    shape (70B at TP 4 over the GPU's NVLink), with ``profile`` (default: DEFAULT_PROFILE)."""
    rows = []
    for gpu in GPU_LABEL:
        for name, tp in GRID:
            shape = SHAPES[name]

            def ms(work: IterationWork, shape: ModelConfig = shape, tp: int = tp, gpu: str = gpu) -> float:
                return (
                    predict_iteration(gpu, shape, work, tp=tp, link=LINK_OF[gpu], profile=profile).time_s
                    * 1e3
                )

            rows.append(
                {
                    "gpu": gpu,
                    "shape": name,
                    "tp": tp,
                    "ttft_ms": {n: ms(prefill_work(n)) for n in PREFILL_TOKENS},
                    "tpot_ms": {b: ms(decode_work(b, DECODE_CONTEXT)) for b in DECODE_BATCHES},
                }
            )
    return rows


def grid_markdown(grid: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| GPU | shape | TP | "
        + " | ".join(f"TTFT {n}" for n in PREFILL_TOKENS)
        + " | "
        + " | ".join(f"TPOT b{b}" for b in DECODE_BATCHES)
        + " |",
        "|---|---|---|" + "---|" * (len(PREFILL_TOKENS) + len(DECODE_BATCHES)),
    ]
    for g in grid:
        cells = [_fmt(g["ttft_ms"][n]) for n in PREFILL_TOKENS] + [
            _fmt(g["tpot_ms"][b]) for b in DECODE_BATCHES
        ]
        lines.append(f"| {GPU_LABEL[g['gpu']]} | {g['shape']} | {g['tp']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(x: float) -> str:
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def markdown(comps: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| source | GPU | shape | TP | measurement | profile | measured ms | predicted ms | error | used for |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in comps:
        lines.append(
            f"| {c['source']} | {GPU_LABEL[c['gpu']]} | {c['shape']} | {c['tp']} | {c['what']} | "
            f"{c['profile']} | {c['measured_ms']:g} | {_fmt(c['modeled_ms'])} | {c['error_pct']:+.1f} % | "
            f"{c['role']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the fit, the comparisons and the sources here")
    ap.add_argument("--no-fit", action="store_true", help="only the table with the shipped profiles")
    args = ap.parse_args(argv)
    fitted: dict[str, Any] = {}
    if not args.no_fit:
        cycles = fit_kernel_latency_cycles()
        print(
            f"kernel_latency_cycles: fitted {cycles:.0f}, shipped {DEFAULT_CONSTANTS.kernel_latency_cycles:.0f}"
        )
        fitted["kernel_latency_cycles"] = cycles
        for name, spec in FITS.items():
            prof, consts = fit_profile(name)
            shipped = PROFILES[name]
            print(f"profile {name}:")
            for field, *_ in spec:
                if field == "gpu.gemm_a100":
                    got = consts.gemm_efficiency_for("a100-sxm-80gb")
                    have = DEFAULT_CONSTANTS.gemm_efficiency_for("a100-sxm-80gb")
                elif field.startswith("gemm_"):
                    key = {"gemm_h100": "h100-sxm", "gemm_a100": "a100-sxm-80gb"}[field]
                    got, have = prof.gemm_scale(key), shipped.gemm_scale(key)
                else:
                    got, have = getattr(prof, field), getattr(shipped, field)
                print(f"  {field}: fitted {got:.4g}, shipped {have:.4g}")
                fitted[f"{name}.{field}"] = got
        print()
    comps = comparisons()
    print(markdown(comps))
    print()
    grid = model_grid()
    print(grid_markdown(grid))
    print()
    print(
        "Splitwise H100 prompt time added per token (us) at 1-2k / 2-4k / 4-8k tokens per iteration, "
        "one prompt | 512-token prompts; attention = one 8192 prompt - 16 x 512 (measurements only):"
    )
    steps = prompt_step_evidence()
    for row in steps:
        cells = " | ".join(
            " / ".join(f"{row[k][x]:.0f}" for x in ("below_us", "across_us", "above_us"))
            for k in ("one_prompt", "prompts_of_512")
        )
        print(f"  {GPU_LABEL[row['gpu']]} TP {row['tp']}: {cells}; attention {row['attention_ms']:.0f} ms")
    print()
    for key, s in held_out_summary(comps).items():
        print(
            f"held-out {key}: {s['within_15pct']}/{s['n']} within 15 %, max |error| {s['max_abs_error_pct']:.1f} %"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "fit": fitted,
                    "comparisons": comps,
                    "grid": grid,
                    "prompt_steps": steps,
                    "sources": SOURCES,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
