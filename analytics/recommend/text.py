"""A stored recommendation (its ``recommendations`` row, details included) as plain text: the
candidate table (Pareto, bottleneck, meets the SLOs), the chosen layout, its predicted impact and
the confidence, labelled simulated."""

from __future__ import annotations

from typing import Any


def _f(x: Any, scale: float = 1.0, digits: int = 1) -> str:
    if x is None:
        return "—"
    v = x * scale
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.{digits}f}"


_SHORT = (
    ("max_num_batched_tokens=", "mbt="),
    ("max_num_seqs=", "seqs="),
    ("chunked_prefill=off", "nochunk"),
    ("prefill.", "p."),
    ("decode.", "d."),
)


def short_layout(text: str) -> str:
    """A layout string with the engine settings' names shortened (the table's legend says how)."""
    for long, short in _SHORT:
        text = text.replace(long, short)
    return text


def _pct(x: Any) -> str:
    return "—" if x is None else f"{x:+.1f} %"


def format_recommendation(row: dict[str, Any], *, all_candidates: bool = False) -> str:
    """The row as the CLI prints it; ``all_candidates`` lists the pruned ones too."""
    d = row.get("details") or {}
    inputs = d.get("inputs", {})
    slo = inputs.get("slo", {})
    lines = [
        f"SIMULATED layout recommendation {row['recommendation_id']} ({row['target']}): every figure is the "
        "simulator's (virtual time, the GPU model), not a measurement",
        f"  workload: {inputs.get('trace', {}).get('desc', '')} — {inputs.get('trace', {}).get('requests', 0):,} requests; "
        f"model {inputs.get('model')}; SLOs TTFT ≤ {_f(slo.get('ttft_s'), 1e3, 0)} ms, TPOT ≤ "
        f"{_f(slo.get('tpot_s'), 1e3, 0)} ms for {slo.get('target', 0):.0%} of requests; budget "
        f"{inputs.get('gpu_budget')} × {', '.join(inputs.get('allowed_gpus', []))}",
        f"  search: {d.get('search', {}).get('simulations', 0)} simulations in {d.get('search', {}).get('wall_s', 0):.1f} s; "
        f"screened on {d.get('search', {}).get('slice', '')}",
        "",
    ]
    header = (
        f"{'':2}{'layout':<58} {'GPUs':>4} {'goodput':>8} {'tok/s':>7} {'tok/s':>6} {'TTFT p90':>8} {'TPOT p90':>8} "
        f"{'attain':>7} {'$/1M':>6} {'J/tok':>6} {'meets':>5} {'P':>1}  bottleneck (on)"
    )
    sub = (
        f"{'':2}{'':<58} {'':>4} {'rps/GPU':>8} {'/GPU':>7} {'/user':>6} {'ms':>8} {'ms':>8} {'':>7} {'tokens':>6} "
        f"{'':>6} {'SLO':>5} {'':>1}"
    )
    lines += [header, sub, "-" * len(header)]
    chosen = (row.get("proposed") or {}).get("layout")
    pruned: dict[str, int] = {}
    for c in d.get("candidates", []):
        if c.get("pruned") and not c.get("evaluated_on"):
            key = c["pruned"].split(":")[0]
            pruned[key] = pruned.get(key, 0) + 1
            if not all_candidates:
                continue
        mark = ("*" if c["layout"] == chosen else " ") + ("c" if c.get("current") else " ")
        meets = {True: "yes", False: "no", None: "—"}[c.get("meets_slo")]
        attain = c.get("slo_attainment")
        lines.append(
            f"{mark}{short_layout(c['layout'])[:58]:<58} {c['gpus']:>4} {_f(c.get('goodput_rps_per_gpu'), 1, 3):>8} "
            f"{_f(c.get('output_tokens_per_s_per_gpu')):>7} {_f(c.get('output_tokens_per_s_per_user')):>6} "
            f"{_f(c.get('ttft_p90_s'), 1e3, 0):>8} {_f(c.get('tpot_p90_s'), 1e3):>8} "
            f"{'—' if attain is None else f'{attain:.1%}':>7} {_f(c.get('usd_per_1m_tokens'), 1, 2):>6} "
            f"{_f(c.get('j_per_token'), 1, 2):>6} {meets:>5} {'P' if c.get('pareto') else ' ':>1}  "
            f"{c.get('bottleneck') or c.get('pruned') or '—'} ({c.get('evaluated_on') or 'bound'})"
        )
    lines.append(
        "  * chosen, c current, P on the Pareto front of tokens/s per GPU vs per user; goodput from the screening slice, "
        "the rest from the whole trace where 'on' says trace; mbt = max_num_batched_tokens (the chunk), seqs = "
        "max_num_seqs, p./d. = prefill/decode pool"
    )
    if pruned and not all_candidates:
        lines.append("  pruned before simulation: " + "; ".join(f"{n} {why}" for why, n in pruned.items()))
    conf = d.get("confidence", {})
    pred, cur = d.get("predicted", {}), d.get("current_predicted", {})
    lines += [
        "",
        ("STAY AS IS: " if d.get("stay") else "RECOMMENDED: ") + str(chosen),
        f"  why: {row.get('rationale')}",
        f"  best at the budget: {d.get('same_budget')}; least budget meeting the SLOs: {d.get('least_budget')}",
        f"  predicted vs current: goodput/GPU {_f(pred.get('goodput_rps_per_gpu'), 1, 3)} vs "
        f"{_f(cur.get('goodput_rps_per_gpu'), 1, 3)} req/s; attainment "
        f"{_f((pred.get('slo_attainment') or 0) * 100)} vs {_f((cur.get('slo_attainment') or 0) * 100)} %; "
        f"$/year {_f(pred.get('usd_per_year'), 1, 0)} vs {_f(cur.get('usd_per_year'), 1, 0)} (fleet of "
        f"{inputs.get('fleet_gpus')} GPUs)",
        f"  change: cost {_f(row.get('est_cost_change_usd_per_h'), 1, 2)} $/h, tokens per J "
        f"{_pct(row.get('est_tokens_per_j_change_pct'))}, TTFT p90 {_pct(row.get('est_latency_change_pct'))}",
        f"  confidence: {str(conf.get('level', '—')).upper()} — {conf.get('text', '')}",
        f"  trust: {d.get('trust', 'simulated')}",
    ]
    return "\n".join(lines)
