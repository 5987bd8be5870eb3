"""The BLIND test of the GPU model v3 (issue 23 point 2; docs/FIDELITY.md, "Blind test"): the model
beside two measurement sets no part of it was designed, calibrated or validated on.

(a) the ``bloom-176b`` rows of Splitwise's profiling CSV (TTFT, TPOT, peak and average power per unit,
    engine profile ``splitwise-2023``): serving/devices/blind_fidelity.py;
(b) Microsoft Vidur's per-operator profiles (one layer's linear and elementwise operators per
    num_tokens and TP on A100 / H100, engine profile ``vllm``): serving/devices/blind_vidur.py.

Run ONCE, by the lead, after the model is frozen; the data are read from the paths given (not in the
repository). Prints per set and figure the median / p90 / max |error| (error = (model - measured) /
measured), the signed median, the count within 15 %, per-group stats and the worst units; every unit
not scored is counted and, in the JSON, listed with its reason.

    python bench/fidelity_blind.py --csv PATH/perf_model.csv --vidur-repo PATH/vidur [--json out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

from serving.devices import blind_fidelity as bf
from serving.devices import blind_vidur as bv
from serving.devices.errors import DeviceValueError

ROOT = Path(__file__).resolve().parents[1]
TRUST = "measured (published) beside the GPU model's estimate"


def splitwise_report(path: Path, worst: int) -> dict[str, Any]:
    """Set (a): the scored units, the stats per figure (and per hardware / TP) and the units not scored."""
    units = bf.load_splitwise_units(path)
    scored = bf.score_splitwise(units)
    figures = {
        figure: bf.summarize(rows, group=lambda r: f"{r['unit'][0]} tp{r['unit'][1]}", worst=worst)
        for figure, rows in scored["rows"].items()
    }
    return {
        "source": f"{path} (sha256 {_sha256(path)}), model {bf.SPLITWISE_MODEL!r}, {units.rows} rows",
        "profile": bf.PROFILE,
        "figures": figures,
        "rows": scored["rows"],
        "not_scored": scored["not_scored"],
        "rejected_values": list(units.rejected),
    }


def vidur_report(repo: Path, profile: str, worst: int) -> dict[str, Any]:
    """Set (b): the scored units, the stats (all, gated-MLP shapes only, per GPU/model, per TP, per token
    band), the worst units, the files and units not scored."""
    files, skipped_files = bv.mlp_files(repo)
    scored = bv.score_vidur(files, profile=profile)
    rows = scored["rows"]
    gated = [r for r in rows if r["gated"]]
    figures = {
        "layer_ms": bv_summary(rows, worst),
        "layer_ms (gated-MLP shapes only)": bv_summary(gated, worst),
    }
    return {
        "source": f"{repo} at {bv.revision(repo) or 'working tree'}: "
        + ", ".join(sorted({f"{f.gpu}/{f.model}" for f in files})),
        "profile": profile,
        "figures": figures,
        "rows": rows,
        "not_scored": scored["not_scored"],
        "files_skipped": skipped_files,
    }


def bv_summary(rows: list[dict[str, Any]], worst: int) -> dict[str, Any]:
    out = bf.summarize(rows, group=lambda r: f"{r['unit'][0]} {r['unit'][1]}", worst=worst)
    out["by_tp"] = bf.summarize(rows, group=lambda r: f"tp{r['unit'][2]}", worst=0)["by_group"]
    bands = bf.summarize(rows, group=lambda r: bv.token_band(r["unit"][3]), worst=0)["by_group"]
    out["by_tokens"] = {b: bands[b] for b in bv.TOKEN_BANDS if b in bands}
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _model_commit() -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return done.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x * 100:.1f} %"


def _stats_line(name: str, s: dict[str, Any]) -> str:
    invalid = f", {s['n_invalid']} with measured 0" if s.get("n_invalid") else ""
    return (
        f"  {name}: n {s['n']}, median |err| {_pct(s['median'])}, p90 {_pct(s['p90'])}, max "
        f"{_pct(s['max'])}, signed median {_pct(s['signed_median'])}, within 15 % {s['within_15pct']}/{s['n']}"
        f"{invalid}"
    )


def print_report(name: str, rep: dict[str, Any]) -> None:
    print(f"== {name}")
    print(f"source: {rep['source']}; engine profile {rep['profile']}; {TRUST}")
    for figure, fs in rep["figures"].items():
        print(_stats_line(figure, fs["all"]))
        for key in ("by_group", "by_tp", "by_tokens"):
            for g, s in fs.get(key, {}).items():
                print("  " + _stats_line(g, s))
        for r in fs["worst"]:
            print(
                f"    worst: {tuple(r['unit'])}: measured {r['measured']:.4g}, model {r['modeled']:.4g}, "
                f"error {r['error'] * 100:+.1f} %"
            )
    if rep["not_scored"]:
        reasons: dict[str, int] = {}
        for s in rep["not_scored"]:
            reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
        for reason, n in sorted(reasons.items()):
            print(f"  not scored: {n} unit(s): {reason}")
    rejected = rep.get("rejected_values", [])
    if rejected:
        print(f"  rejected values (left out of their units): {len(rejected)}")
        for why in rejected[:10]:
            print(f"    {why}")
    for f in rep.get("files_skipped", []):
        print(f"  file skipped: {f['path']}: {f['reason']}")
    print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", type=Path, help="Splitwise's data/perf_model.csv (set a: its bloom-176b rows)")
    ap.add_argument(
        "--vidur-repo", type=Path, help="a Vidur checkout or git mirror (set b: data/profiling/compute)"
    )
    ap.add_argument(
        "--vidur-profile", default=bv.PROFILE, help="engine profile of the Vidur set (default %(default)s)"
    )
    ap.add_argument(
        "--worst", type=int, default=5, help="worst units printed per figure (default %(default)s)"
    )
    ap.add_argument(
        "--json", type=Path, help="also write every scored unit, the stats and the provenance here"
    )
    args = ap.parse_args(argv)
    if args.csv is None and args.vidur_repo is None:
        ap.error("give --csv PATH and/or --vidur-repo PATH (the two blind sets)")
    if args.csv is not None and not args.csv.is_file():
        ap.error(f"--csv {args.csv}: no such file (Splitwise's data/perf_model.csv)")
    if args.vidur_repo is not None and not args.vidur_repo.exists():
        ap.error(f"--vidur-repo {args.vidur_repo}: no such directory (a Vidur checkout or git mirror)")
    out: dict[str, Any] = {"model_commit": _model_commit()}
    print(f"BLIND TEST of the GPU model at {out['model_commit']} (run once, after the model is frozen)\n")
    try:
        if args.csv is not None:
            out["splitwise_bloom"] = splitwise_report(args.csv, args.worst)
            print_report("(a) Splitwise bloom-176b", out["splitwise_bloom"])
        if args.vidur_repo is not None:
            out["vidur"] = vidur_report(args.vidur_repo, args.vidur_profile, args.worst)
            print_report("(b) Vidur per-layer linear + elementwise operators", out["vidur"])
    except DeviceValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
