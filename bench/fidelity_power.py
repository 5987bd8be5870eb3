"""Busy power of the GPU model against published power figures (issue 23 point 3; docs/FIDELITY.md, "Power").

Sets (the protocol of docs/FIDELITY.md, fixed 2026-12-05 04:55 UTC): a power unit is (hardware, tp,
prompt_size, batch_size, token_size) of the Splitwise CSV's llama2-70b rows -> the medians of its
``peak_power`` and ``average_power`` (fractions of TDP). TEST = the 90 units of
``serving.devices.published_power.TEST_UNITS`` (scored only with ``--score-test``, once, after the
model is frozen). Of the other units, only those with power recorded (A100; every H100 and capped-H100
row has 0 in both columns) are scored: in the test rule's sha256 order, alternately CALIBRATION (the
first) and VALIDATION. Beside them: this project's H200 windows (docs/gpu), the published H200 decode
range (arXiv 2605.11999) and the capped-H100 behaviour (prompt and token time at 490 W).

    python bench/fidelity_power.py                 # calibration + validation, fit, leave-one-out, checks
    python bench/fidelity_power.py --score-test    # ... and the test set (once, after freezing)
    python bench/fidelity_power.py --csv PATH      # check published_power.py against the CSV
    python bench/fidelity_power.py --csv PATH --write   # regenerate published_power.py from it
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from serving.devices import DEFAULT_CONSTANTS
from serving.devices.power_fidelity import (
    CAP_BAND,
    FITTED,
    PROFILE,
    TARGET,
    cap_behaviour,
    fit,
    h100_prompt_power,
    h200_decode_range,
    h200_windows,
    leave_one_out,
    score,
    sets,
    summary,
    test_rule,
    v2_constants,
)
from serving.devices.published_power import (
    PCAP_LIMIT_W,
    PCAP_PROMPT_RATIO,
    PCAP_TOKEN_RATIO,
    SOURCE,
    TEST_UNITS,
    UNITS,
    Unit,
)

MODULE = Path(__file__).resolve().parent.parent / "serving" / "devices" / "published_power.py"


# -- the committed medians ------------------------------------------------------------------------------


def medians_from_csv(path: str) -> dict[str, Any]:
    """Per-unit medians of the CSV's llama2-70b rows (power units), and the capped-H100 evidence on the
    open pairs (the capped / uncapped ratios of the median prompt and token times)."""
    power: dict[Unit, list[tuple[float, float]]] = defaultdict(list)
    prompt_t: dict[tuple[str, int, int, int], list[float]] = defaultdict(list)
    token_t: dict[tuple[str, int, int, int, int], list[float]] = defaultdict(list)
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["model"] != "llama2-70b":
                continue  # the bloom-176b rows are a blind set: never read further
            hw, tp = r["hardware"], int(r["tensor_parallel"])
            p, b, t = int(r["prompt_size"]), int(r["batch_size"]), int(r["token_size"])
            power[(hw, tp, p, b, t)].append((float(r["peak_power"]), float(r["average_power"])))
            prompt_t[(hw, tp, p, b)].append(float(r["prompt_time"]))
            token_t[(hw, tp, p, b, t)].append(float(r["token_time"]))
    units = {
        u: (round(statistics.median(x for x, _ in v), 4), round(statistics.median(y for _, y in v), 4))
        for u, v in sorted(power.items())
    }
    test = test_rule(list(units))
    prompt_pairs, ratios = [], []
    for (hw, tp, p, b), times in sorted(prompt_t.items()):
        base = ("h100-80gb", tp, p, b)
        if hw != "h100-80gb-pcap" or not {("ttft", hw, tp, p, b), ("ttft", *base)}.isdisjoint(_timing_test()):
            continue
        prompt_pairs.append((tp, p, b))
        ratios.append(statistics.median(times) / statistics.median(prompt_t[base]))
    token_pairs, tratios = [], []
    for (hw, tp, p, b, t), times in sorted(token_t.items()):
        base5 = ("h100-80gb", tp, p, b, t)
        if hw != "h100-80gb-pcap" or not {("tpot", hw, tp, p, b, t), ("tpot", *base5)}.isdisjoint(
            _timing_test()
        ):
            continue
        token_pairs.append((tp, p, b, t))
        tratios.append(statistics.median(times) / statistics.median(token_t[base5]))
    return {
        "units": units,
        "test": sorted(test),
        "prompt_pairs": prompt_pairs,
        "prompt_ratio": (round(min(ratios), 4), round(max(ratios), 4)),
        "token_pairs": token_pairs,
        "token_ratio": (round(min(tratios), 4), round(max(tratios), 4)),
    }


def _timing_test() -> set[tuple[Any, ...]]:
    """The TTFT / TPOT test units of the fixed list (``fidelity_sets.TEST_UNITS``), keyed
    ``(figure, hardware, tp, ...)``; the capped pairs touching one are not read here."""
    from serving.devices.fidelity_sets import TEST_UNITS

    return {tuple(u) for u in TEST_UNITS if u[0] in ("ttft", "tpot")}


def module_text(m: dict[str, Any]) -> str:
    """The source of published_power.py for the medians ``m`` (:func:`medians_from_csv`), formatted as
    ``ruff format`` leaves it."""

    def key(u: Sequence[Any]) -> str:
        return "(" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in u) + ")"

    return _TEMPLATE.format(
        units="\n".join(f"    {key(u)}: ({v[0]!r}, {v[1]!r})," for u, v in m["units"].items()),
        test="\n".join(f"    {key(u)}," for u in m["test"]),
        prompt_pairs="\n".join(f"    {key(x)}," for x in m["prompt_pairs"]),
        token_pairs="\n".join(f"    {key(x)}," for x in m["token_pairs"]),
        prompt_lo=m["prompt_ratio"][0],
        prompt_hi=m["prompt_ratio"][1],
        token_lo=m["token_ratio"][0],
        token_hi=m["token_ratio"][1],
    )


_TEMPLATE = '''"""Published power figures the GPU model's busy power is scored against (bench/fidelity_power.py,
docs/FIDELITY.md "Power"). Generated by ``python bench/fidelity_power.py --csv PATH --write`` from the
Splitwise profiling CSV (the CSV itself is not committed); ``--csv PATH`` alone checks this file.

Source: Splitwise profiling data, github.com/Mutinifni/splitwise-sim ``data/perf_model.csv`` (commit
8f99e7d), rows ``llama2-70b``. A power unit (hardware, tensor_parallel, prompt_size, batch_size,
token_size) -> the medians over its repeated rows of ``peak_power`` and ``average_power``, fractions
of TDP (A100 400 W, H100 700 W; ``h100-80gb-pcap`` = an H100 under a power cap). (0.0, 0.0): the CSV
recorded no power for that unit (every H100 and capped-H100 row, some A100 ones).
"""

from __future__ import annotations

SOURCE = (
    "Splitwise profiling data, github.com/Mutinifni/splitwise-sim data/perf_model.csv @ 8f99e7d (llama2-70b)"
)

Unit = tuple[str, int, int, int, int]  # hardware, tp, prompt_size, batch_size, token_size

#: unit -> (median peak_power, median average_power), fractions of TDP
UNITS: dict[Unit, tuple[float, float]] = {{
{units}
}}

#: the power test units (protocol fixed 2026-12-05 04:55 UTC): per (hardware, tp), the units sorted by
#: sha256("power|" + "|".join(unit)), the first half rounded up; scored only by ``--score-test``
TEST_UNITS: tuple[Unit, ...] = (
{test}
)

#: the capped H100: cap 70 % of the 700 W TDP (Splitwise); pairs (capped, uncapped) of the same unit
#: where neither is a TTFT / TPOT test unit
PCAP_LIMIT_W = 490.0
PCAP_PROMPT_PAIRS: tuple[tuple[int, int, int], ...] = (  # (tp, prompt, batch)
{prompt_pairs}
)
PCAP_TOKEN_PAIRS: tuple[tuple[int, int, int, int], ...] = (  # (tp, prompt, batch, token)
{token_pairs}
)
#: capped / uncapped median prompt time on those pairs, min and max: every one is exactly this, and every
#: capped token time equals the uncapped one row for row -- derived rows, not a measurement
PCAP_PROMPT_RATIO = ({prompt_lo}, {prompt_hi})
PCAP_TOKEN_RATIO = ({token_lo}, {token_hi})
'''


# -- output ---------------------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def table(rows: Sequence[dict[str, Any]], role: str) -> list[str]:
    """Markdown rows for one set."""
    out = []
    for r in rows:
        hw, tp, p, b, t = r["unit"]
        out.append(
            f"| {role} | {hw} | {tp} | {b} x {p} | {t} | {r['peak']:.3f} | {r['peak_model']:.3f} | "
            f"{_pct(r['peak_error'])} | {r['avg']:.3f} | {r['avg_model']:.3f} | {_pct(r['avg_error'])} |"
        )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--score-test", action="store_true", help="also score the test set (once, after freezing)"
    )
    ap.add_argument("--no-fit", action="store_true", help="skip the refit and the leave-one-out errors")
    ap.add_argument("--csv", help="the Splitwise perf_model.csv: check published_power.py against it")
    ap.add_argument("--write", action="store_true", help="with --csv: regenerate published_power.py")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    if args.csv:
        text = module_text(medians_from_csv(args.csv))
        if args.write:
            MODULE.write_text(text)
            print(f"wrote {MODULE}")
            return
        same = MODULE.read_text() == text
        print(f"{MODULE.name} {'matches' if same else 'DIFFERS FROM'} {args.csv}")
        if not same:
            raise SystemExit(1)
        return
    print(f"source: {SOURCE}")
    s = sets()
    print(
        f"units: {len(UNITS)}; test {len(TEST_UNITS)} ({len(s['test'])} with power recorded); "
        f"calibration {len(s['calibration'])}, validation {len(s['validation'])}; "
        f"left out (no power recorded) {len(s['not recorded'])}"
    )
    result: dict[str, Any] = {}
    if not args.no_fit:
        values = fit(s["calibration"])
        names = [n for n, _ in FITTED]
        shipped = [DEFAULT_CONSTANTS.comm_power, DEFAULT_CONSTANTS.hbm_power_for("a100-sxm-80gb")]
        print(
            "fit: "
            + ", ".join(
                f"{n} {v:.3f} (shipped {w:.2f})" for n, v, w in zip(names, values, shipped, strict=True)
            )
        )
        loo = leave_one_out(s["calibration"])
        ls = summary(loo)
        print(
            f"leave-one-out ({PROFILE}, {len(loo)} calibration units): peak median {ls['peak_median']:.1%} "
            f"max {ls['peak_max']:.1%}; average median {ls['avg_median']:.1%} max {ls['avg_max']:.1%}"
        )
        result["fit"] = dict(zip(names, values, strict=True))
        result["leave_one_out"] = loo
    print()
    print("| set | hardware | TP | prompts | tokens | peak | model | error | average | model | error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    roles = ["calibration", "validation"] + (["test"] if args.score_test else [])
    scored = {role: score(s[role]) for role in roles}
    for role in roles:
        print("\n".join(table(scored[role], role)))
    print()
    for role in roles:
        m = summary(scored[role])
        print(
            f"{role}: {int(m['n'])} units; peak median |error| {m['peak_median']:.1%} (max {m['peak_max']:.1%}), "
            f"average median {m['avg_median']:.1%} (max {m['avg_max']:.1%}); both {m['median']:.1%} "
            f"(target <= {TARGET:.0%}: {'met' if m['median'] <= TARGET else 'NOT MET'})"
        )
    base = v2_constants()
    for role in ["calibration", "validation"]:
        m = summary(score(s[role], base))
        print(
            f"baseline v2 power, same run, {role}: peak median {m['peak_median']:.1%}, average median "
            f"{m['avg_median']:.1%}; both {m['median']:.1%}"
        )
    print()
    win = h200_windows()
    print("this project's H200 (llama-3.1-8b, phaselens-eager), windows busy >= 50 %:")
    for w in win:
        print(
            f"  {w['file']:6} {w['phase']:7} {w['size']:5} {w['knob']:12} util {w['util']:.0%}: measured "
            f"{w['measured_w']:.0f} W, modeled {w['modeled_w']:.0f} W ({_pct(w['error'])}; busy {w['busy_w']:.0f} W) "
            f"[{w['role']}]"
        )
    print(f"  median |error| {statistics.median(abs(w['error']) for w in win):.1%}")
    dec = h200_decode_range()
    print(
        "arXiv 2605.11999, H200 decode 137-300 W; model llama-3.1-8b decode (vllm) busy / iteration mean: "
        + ", ".join(f"b{d['batch']} {d['busy_w']:.0f} / {d['mean_w']:.0f} W" for d in dec)
    )
    pp = h100_prompt_power()
    print(
        "Splitwise, H100 prompt phase near TDP (700 W); model Llama-2-70B prompt busy power: "
        + ", ".join(f"TP {p['tp']} {p['tokens']}: {p['busy_w']:.0f} W" for p in pp)
    )
    cap = cap_behaviour()
    print(
        f"capped H100 at {PCAP_LIMIT_W:.0f} W on {len(cap['prompts'])} open prompt pairs: CSV ratio "
        f"{PCAP_PROMPT_RATIO[0]:.3f}-{PCAP_PROMPT_RATIO[1]:.3f}; model median {cap['prompt_ratio_median']:.3f} "
        f"(min {min(p['ratio'] for p in cap['prompts']):.3f}, max {max(p['ratio'] for p in cap['prompts']):.3f}), "
        f"{cap['prompt_in_band']}/{len(cap['prompts'])} in {CAP_BAND[0]}-{CAP_BAND[1]}x"
    )
    for p in cap["prompts"]:
        print(
            f"  TP {p['tp']} {p['batch']} x {p['prompt']}: {p['busy_w']:.0f} W at full clock -> "
            f"{p['capped_mhz']} MHz capped, x{p['ratio']:.3f}"
        )
    print(
        f"  token time on {len(cap['tokens'])} open pairs: CSV ratio {PCAP_TOKEN_RATIO[0]:.3f}-"
        f"{PCAP_TOKEN_RATIO[1]:.3f}; model max x{cap['token_ratio_max']:.3f} (decode busy "
        f"{min(t['busy_w'] for t in cap['tokens']):.0f}-{max(t['busy_w'] for t in cap['tokens']):.0f} W)"
    )
    if args.json:
        result.update(
            {
                "sets": {k: [list(u) for u in v] for k, v in s.items()},
                "scored": scored,
                "h200_windows": win,
                "h200_decode": dec,
                "h100_prompt": pp,
                "cap": cap,
            }
        )
        Path(args.json).write_text(json.dumps(result, indent=1, default=list))


if __name__ == "__main__":
    main()
