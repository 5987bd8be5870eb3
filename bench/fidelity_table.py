"""The GPU model against published serving measurements, by the v3 protocol (docs/FIDELITY.md,
"Protocol"): calibration, validation and (only with ``--score-test``) the fixed test set, each with
per-set median / p90 / max |error| for TTFT and TPOT; leave-one-out errors per engine profile; the
fitted vs shipped constants; the anomalies excluded and why.

The published figures are serving/devices/published.py (vLLM CI, TRT-LLM v0.5, this project's H200),
published_splitwise.py (every llama2-70b unit of Splitwise's CSV) and published_lmdeploy.py; the sets are
serving/devices/fidelity_sets.py; the fit serving/devices/calibration.py. ``PROFILES`` ship the fitted
values (rounded); every figure of the tables uses the shipped ones, through the public
``predict_iteration`` only.

    python bench/fidelity_table.py [--no-fit] [--no-loo] [--units] [--json out.json]
    python bench/fidelity_table.py --score-test     # once, after the model is frozen
    python bench/fidelity_table.py --no-fit --no-loo --score-test --source gpt-fast --also-profile vllm --units
        # one source's sets only (a new source's TEST units, scored once), with a sensitivity profile
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from serving.config import ModelConfig
from serving.devices import DEFAULT_CONSTANTS, PROFILES, IterationWork, predict_iteration, published_gptfast
from serving.devices.calibration import (
    FITS,
    MIN_UNITS_PER_CONSTANT,
    SET_FROM_PUBLISHED,
    fit_kernel_latency_cycles,
    fit_profile,
    leave_one_out,
    units_per_constant,
)
from serving.devices.fidelity_sets import (
    ANOMALIES,
    POINTS,
    TARGET_MEDIAN,
    TARGET_P90,
    error_stats,
    unit_of,
)
from serving.devices.published import (
    LINK_OF,
    SHAPES,
    SOURCES,
    decode_work,
    prefill_work,
    prompt_step_evidence,
)

GPU_LABEL = {"h100-sxm": "H100 SXM", "h200": "H200", "a100-sxm-80gb": "A100-SXM-80GB"}
SETS = ("calibration", "validation", "test")


# -- comparisons -------------------------------------------------------------------------------------------


def comparisons(
    roles: Sequence[str] = ("calibration", "validation"),
    sources: Sequence[str] | None = None,
    also_profile: str | None = None,
) -> list[dict[str, Any]]:
    """Every point of the given roles (and ``sources``, default all) beside the shipped model; with
    ``also_profile``, each point also modeled with that engine profile (``alt_*`` keys)."""
    out = []
    for p in POINTS:
        if p.role not in roles or (sources is not None and p.source not in sources):
            continue
        modeled = p.modeled_ms()
        unit = unit_of(p)
        alt: dict[str, Any] = {}
        if also_profile is not None:
            alt_ms = p.modeled_ms(PROFILES[also_profile])
            alt = {
                "alt_profile": also_profile,
                "alt_modeled_ms": round(alt_ms, 2),
                "alt_error_pct": round((alt_ms / p.measured_ms - 1.0) * 100.0, 1),
            }
        out.append(
            {
                "source": p.source,
                "gpu": p.gpu,
                "capped": p.power_limit_w is not None,
                "power_limit_w": p.power_limit_w,
                "shape": p.shape,
                "tp": p.tp,
                "metric": p.metric,
                "what": p.what,
                "unit": list(unit) if unit else None,
                "profile": p.profile,
                "measured_ms": p.measured_ms,
                "modeled_ms": round(modeled, 2),
                "error_pct": round((modeled / p.measured_ms - 1.0) * 100.0, 1),
                "role": p.role,
                "note": p.note,
                **alt,
            }
        )
    return out


def set_summary(comps: Sequence[dict[str, Any]], key: str = "error_pct") -> list[dict[str, Any]]:
    """Per (set, metric, scope) the count and median / p90 / max |error| (%); scope ``all``, each source,
    and Splitwise split into ``uncapped`` and ``capped`` (the 490 W H100, whose timing rests on the power
    model)."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    for c in comps:
        metric = c["metric"]
        groups.setdefault((c["role"], metric, "all"), []).append(c[key] / 100)
        scope = c["source"]
        if c["source"] == "splitwise":
            scope = "splitwise capped" if c["capped"] else "splitwise uncapped"
        groups.setdefault((c["role"], metric, scope), []).append(c[key] / 100)
        if c["source"] == published_gptfast.SOURCE and [c["metric"], c["shape"], c["tp"]] != list(
            published_gptfast.SUSPECT_UNIT
        ):
            groups.setdefault((c["role"], metric, "gpt-fast without the suspect unit"), []).append(
                c[key] / 100
            )
    rows = []
    for (role, metric, scope), errs in sorted(
        groups.items(), key=lambda kv: (SETS.index(kv[0][0]), kv[0][1:])
    ):
        s = error_stats(errs)
        signed = sorted(errs)
        mid = len(signed) // 2
        s["signed_median"] = signed[mid] if len(signed) % 2 else (signed[mid - 1] + signed[mid]) / 2
        rows.append({"set": role, "metric": metric, "scope": scope, **s})
    return rows


def summary_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        "| set | figure | scope | n | median abs err | p90 abs err | max abs err | signed median |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['set']} | {r['metric'].upper()} | {r['scope']} | {r['n']} | {r['median']:.1%} | "
            f"{r['p90']:.1%} | {r['max']:.1%} | {r['signed_median']:+.1%} |"
        )
    return lines


def units_markdown(comps: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| set | source | GPU | TP | measurement | measured ms | predicted ms | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in comps:
        gpu = GPU_LABEL[c["gpu"]] + (f" {c['power_limit_w']:g} W" if c["capped"] else "")
        alt = ""
        if "alt_profile" in c:
            alt = f" ({c['alt_profile']}: {_fmt(c['alt_modeled_ms'])} ms, {c['alt_error_pct']:+.1f} %)"
        lines.append(
            f"| {c['role']} | {c['source']} | {gpu} | {c['tp']} | {c['what']} | {c['measured_ms']:.4g} | "
            f"{_fmt(c['modeled_ms'])} | {c['error_pct']:+.1f} %{alt} |"
        )
    return "\n".join(lines)


# -- the model grid ----------------------------------------------------------------------------------------

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
                est = predict_iteration(gpu, shape, work, tp=tp, link=LINK_OF[gpu], profile=profile)
                return est.time_s * 1e3

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
    head = (
        " | ".join(f"TTFT {n}" for n in PREFILL_TOKENS)
        + " | "
        + " | ".join(f"TPOT b{b}" for b in DECODE_BATCHES)
    )
    lines = [
        f"| GPU | shape | TP | {head} |",
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


# -- the fit and leave-one-out -----------------------------------------------------------------------------


def print_fit(fitted: dict[str, Any]) -> None:
    """Refit every profile; print fitted vs shipped, the calibration points per constant and the
    constants set from published figures."""
    cycles = fit_kernel_latency_cycles()
    print(
        f"kernel_latency_cycles: fitted {cycles:.0f}, shipped {DEFAULT_CONSTANTS.kernel_latency_cycles:.0f}"
    )
    fitted["kernel_latency_cycles"] = cycles
    per = units_per_constant()
    for name, spec in FITS.items():
        prof, consts = fit_profile(name)
        shipped = PROFILES[name]
        n, k = per[name]
        verdict = (
            "ok"
            if n >= MIN_UNITS_PER_CONSTANT * k
            else f"BELOW the protocol's {MIN_UNITS_PER_CONSTANT} per constant"
        )
        print(f"profile {name}: {k} fitted constants on {n} calibration points ({n / k:.1f} each: {verdict})")
        for field, *_ in spec:
            if field == "gpu.gemm_a100":
                got = consts.gemm_efficiency_for("a100-sxm-80gb")
                have = DEFAULT_CONSTANTS.gemm_efficiency_for("a100-sxm-80gb")
            else:
                got, have = getattr(prof, field), getattr(shipped, field)
            print(f"  {field}: fitted {got:.4g}, shipped {have:.4g}")
            fitted[f"{name}.{field}"] = got
    for name, field, value, figure in SET_FROM_PUBLISHED:
        print(f"profile {name}: {field} = {value} set from a published figure: {figure}")


def print_loo(out: dict[str, Any]) -> None:
    """Leave-one-out per fitted profile: refit without each calibration point, predict it."""
    print("Leave-one-out (refit without each calibration point, predict it):")
    for name in FITS:
        res = leave_one_out(name)
        s = error_stats(e for _, e in res)
        by_metric = {}
        for m in ("ttft", "tpot", "e2e"):
            sm = error_stats(e for p, e in res if p.metric == m)
            if sm["n"]:
                by_metric[m] = sm
        parts = "; ".join(
            f"{m.upper()} n {sm['n']} median {sm['median']:.1%} p90 {sm['p90']:.1%} max {sm['max']:.1%}"
            for m, sm in by_metric.items()
        )
        print(
            f"  {name}: n {s['n']}, median {s['median']:.1%}, p90 {s['p90']:.1%}, max {s['max']:.1%} ({parts})"
        )
        out[name] = {
            "all": s,
            **by_metric,
            "points": [[p.what, p.gpu, p.tp, round(e * 100, 1)] for p, e in res],
        }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the fit, the comparisons, the summaries and the sources here")
    ap.add_argument("--no-fit", action="store_true", help="skip the refit (fitted vs shipped constants)")
    ap.add_argument("--no-loo", action="store_true", help="skip the leave-one-out refits (a minute or two)")
    ap.add_argument("--units", action="store_true", help="print every scored unit, not only the summaries")
    ap.add_argument(
        "--source",
        action="append",
        choices=sorted(SOURCES),
        help="score only this source's points (repeatable; default every source)",
    )
    ap.add_argument(
        "--also-profile",
        choices=sorted(PROFILES),
        help="also model every scored point with this engine profile (a sensitivity line, not the score)",
    )
    ap.add_argument(
        "--score-test",
        action="store_true",
        help="also score the fixed TEST set (once, after the constants and mechanisms are frozen)",
    )
    args = ap.parse_args(argv)
    fitted: dict[str, Any] = {}
    loo: dict[str, Any] = {}
    if not args.no_fit:
        print_fit(fitted)
        print()
    roles = SETS if args.score_test else SETS[:2]
    comps = comparisons(roles, args.source, args.also_profile)
    if args.units:
        print(units_markdown(comps))
        print()
    print("Excluded units (data-based reasons):")
    by_reason: dict[str, list[str]] = {}
    for key, reason in ANOMALIES.items():
        by_reason.setdefault(reason, []).append(" ".join(str(x) for x in key))
    for reason, keys in by_reason.items():
        print(f"  {'; '.join(keys)}:\n    {reason}")
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
    if not args.no_loo:
        print_loo(loo)
        print()
    summary = set_summary(comps)
    print("\n".join(summary_lines(summary)))
    if args.also_profile:
        print(f"\nThe same points with engine profile {args.also_profile!r} (sensitivity, not the score):")
        print("\n".join(summary_lines(set_summary(comps, "alt_error_pct"))))
    if args.score_test:
        print()
        for r in summary:
            if r["set"] == "test" and r["metric"] in ("ttft", "tpot") and r["scope"] == "all":
                ok = r["median"] <= TARGET_MEDIAN and r["p90"] <= TARGET_P90
                print(
                    f"TEST {r['metric'].upper()}: median {r['median']:.1%} (target <= {TARGET_MEDIAN:.0%}), "
                    f"p90 {r['p90']:.1%} (target <= {TARGET_P90:.0%}): {'MET' if ok else 'NOT MET'}"
                )
    else:
        print("(test set not scored: --score-test, once, after the model is frozen)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "fit": fitted,
                    "loo": loo,
                    "summary": summary,
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
