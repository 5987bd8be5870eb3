"""``phaselens calibrate``: sweep power limits and SM-clock windows per role (phase) of the live
stack (dry run unless ``--execute``: the plan is printed and nothing changes) or of a layout in the
simulator (``--simulate LAYOUT``); find each phase's cliff and its setting in the PERF, BAL and EFF
modes; with ``--db``, store the calibrations (``power_calibrations``), the sweep's audit row
(``actions``) and a ``power`` recommendation that ``phaselens apply`` applies. ``--recommend`` makes
the recommendation from the stored calibrations that still match the running stack (stale ones are
marked and left out) without sweeping. docs/POWER.md."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import Any

MODES = ("perf", "bal", "eff")


def _csv(kind: type) -> Any:
    def parse(text: str) -> list[Any]:
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of numbers") from e

    return parse


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: N or MIN:MAX tokens") from e
    if not 1 <= a <= b:
        raise argparse.ArgumentTypeError(f"{text!r}: need 1 <= MIN <= MAX")
    return a, b


def add_calibrate_command(sub: Any) -> None:
    """Register ``phaselens calibrate``."""
    p = sub.add_parser(
        "calibrate",
        help="sweep power limits and SM-clock windows per phase; choose and recommend a setting per phase",
        description=__doc__,
    )
    where = p.add_argument_group("where")
    where.add_argument(
        "--url",
        default=os.environ.get("PHASELENS_SERVING_URL") or "http://127.0.0.1:8000",
        help="the bundled stack's router (default $PHASELENS_SERVING_URL or http://127.0.0.1:8000)",
    )
    where.add_argument(
        "--token", default=None, help="the stack's control token (default $PHASELENS_CONTROL_TOKEN)"
    )
    where.add_argument(
        "--simulate", default=None, metavar="LAYOUT", help="sweep this layout in the simulator instead"
    )
    where.add_argument(
        "--model", default="llama-3.1-70b", help="with --simulate: the model shape (llama-3.1-70b)"
    )
    where.add_argument(
        "--db", default=None, help="store calibrations, the audit row and the recommendation here"
    )
    sweep = p.add_argument_group("sweep")
    sweep.add_argument("--roles", type=_csv(str), default=None, help="roles to sweep (default: every role)")
    sweep.add_argument(
        "--knobs", type=_csv(str), default=["power_limit", "sm_clock"], help="power_limit,sm_clock"
    )
    sweep.add_argument("--points", type=int, default=4, help="settings per knob below the default (4)")
    sweep.add_argument(
        "--power-limits", type=_csv(float), default=None, metavar="W,W", help="exact power limits"
    )
    sweep.add_argument(
        "--sm-clocks", type=_csv(int), default=None, metavar="MHZ,MHZ", help="exact clock-window tops"
    )
    sweep.add_argument(
        "--clock-floor-mhz", type=int, default=None, help="lowest clock-window top (default: the lowest)"
    )
    sweep.add_argument(
        "--refine",
        type=int,
        default=0,
        help="up to N finer settings per knob near each knee, within the bounds (0)",
    )
    sweep.add_argument("--point-s", type=float, default=20.0, help="seconds of load per point (20)")
    sweep.add_argument("--settle-s", type=float, default=2.0, help="wait after a change, s (2)")
    sweep.add_argument("--max-minutes", type=float, default=30.0, help="bound on the whole sweep (30)")
    sweep.add_argument(
        "--execute", action="store_true", help="change the knobs and measure (default: print the plan)"
    )
    sweep.add_argument(
        "--recommend", action="store_true", help="no sweep: recommend from stored calibrations (--db)"
    )
    load = p.add_argument_group("load (the observed workload of --since, else Poisson)")
    load.add_argument(
        "--since", default=None, help="observe the workload of this window (with --db or --collector)"
    )
    load.add_argument(
        "--dataset", default="live", help="live, a scenario id or latest (a scenario: observed whole)"
    )
    load.add_argument(
        "--collector", default=None, metavar="URL", help="observe the workload through this collector"
    )
    load.add_argument("--rate-scale", type=float, default=1.0, help="multiply the observed rate (1)")
    load.add_argument("--rate", type=float, default=2.0, help="Poisson req/s without --since (2)")
    load.add_argument(
        "--prompt-tokens", type=_range, default=(64, 512), help="Poisson prompts MIN:MAX (64:512)"
    )
    load.add_argument(
        "--output-tokens", type=_range, default=(16, 64), help="Poisson outputs MIN:MAX (16:64)"
    )
    load.add_argument("--seed", type=int, default=0)
    pick = p.add_argument_group("choose")
    pick.add_argument("--mode", choices=MODES, default="bal", help="the recommended mode (bal)")
    pick.add_argument("--eps", type=float, default=0.05, help="throughput may drop by this share (0.05)")
    pick.add_argument(
        "--slo-ttft-ms", type=float, default=None, help="TTFT p99 bound (default: reference × 1.25)"
    )
    pick.add_argument(
        "--slo-itl-ms", type=float, default=None, help="ITL p99 bound (default: reference × 1.25)"
    )
    pick.add_argument("--min-rise-pct", type=float, default=5.0, help="smallest latency rise that counts (5)")
    pick.add_argument(
        "--max-e2e-slowdown",
        type=float,
        default=None,
        metavar="FRACTION",
        help="bound the mean end-to-end latency rise (0.05: 5 %%; EFF twice it); the roles share it (none)",
    )
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.set_defaults(func=cmd_calibrate)


def _fail(message: str, code: int = 2) -> int:
    print(f"phaselens calibrate: error: {message}", file=sys.stderr)
    return code


def _options(args: argparse.Namespace) -> Any:
    from phaselens.power.choose import ChooseOptions

    o = ChooseOptions(
        eps=args.eps,
        slo_ttft_s=None if args.slo_ttft_ms is None else args.slo_ttft_ms / 1e3,
        slo_itl_s=None if args.slo_itl_ms is None else args.slo_itl_ms / 1e3,
        min_rise_pct=args.min_rise_pct,
        max_e2e_slowdown=args.max_e2e_slowdown,
    )
    o.check()
    return o


def _load(args: argparse.Namespace) -> Any:
    from phaselens.power.load import LoadSpec
    from phaselens.power.plan import CalibrateError

    workload = None
    if args.since is not None or args.dataset != "live":
        workload = _observed(args)
    elif args.collector:
        raise CalibrateError("--collector observes a window: give --since (or a --dataset) too")
    spec = LoadSpec(
        workload=workload,
        rate_scale=args.rate_scale,
        rate_rps=args.rate,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        seed=args.seed,
    )
    spec.check()
    return spec


def _observed(args: argparse.Namespace) -> Any:
    from analytics.window import AnalyticsError
    from analytics.workload import Workload
    from phaselens.power.plan import CalibrateError

    params = {"dataset": args.dataset} | ({"since": args.since} if args.since is not None else {})
    if args.db:
        from collector.store import Store
        from phaselens.workload_api import run_workload

        with Store.open(args.db) as store, store.reader() as con:
            try:
                return Workload.from_dict(run_workload(con, params)["observed"])
            except AnalyticsError as e:
                raise CalibrateError(f"--since {args.since}: {e}") from e
    if args.collector:
        import httpx

        try:
            r = httpx.get(f"{args.collector.rstrip('/')}/api/v1/workload", params=params, timeout=120)
        except httpx.HTTPError as e:
            raise CalibrateError(f"cannot reach the collector at {args.collector}: {e}") from e
        if r.status_code != 200:
            raise CalibrateError(f"the collector answered {r.status_code}: {r.text[:300]}")
        return Workload.from_dict(r.json()["observed"])
    raise CalibrateError("--since needs --db FILE or --collector URL to observe the window from")


def cmd_calibrate(args: argparse.Namespace) -> int:
    from phaselens.apply.plan import ApplyError
    from phaselens.apply.stack import StackError
    from phaselens.power.plan import CalibrateError

    say = (lambda s: None) if args.json else (lambda s: print(s, flush=True))
    try:
        options = _options(args)
        if args.simulate:
            out = _simulated(args, options, say)
        else:
            from phaselens.power.run import live_calibrate

            token = args.token or os.environ.get("PHASELENS_CONTROL_TOKEN")
            if not token:
                raise CalibrateError(
                    "the stack's control token is required: pass --token TOKEN or set $PHASELENS_CONTROL_TOKEN"
                )
            out = live_calibrate(args, token, options, say, _load)
    except (CalibrateError, ApplyError) as e:
        return _fail(str(e))
    except StackError as e:
        return _fail(str(e), 1 if e.status else 2)
    if args.json:
        print(json.dumps(out, indent=1, default=str))
    return int(out.get("exit_code", 0))


def _simulated(args: argparse.Namespace, options: Any, say: Any) -> dict[str, Any]:
    from phaselens.power.choose import choose_across_roles, choose_modes
    from phaselens.power.plan import CalibrateError, plan_sweep
    from phaselens.power.records import calibration_row
    from phaselens.power.simulate import sim_bounds, sim_fingerprint, simulate_sweep

    roles, layout = sim_bounds(args.simulate, args.model)
    pool_gpus = {p.role: p.replicas * p.tp for p in layout.pools}
    if args.roles:
        unknown = sorted(set(args.roles) - set(roles))
        if unknown:
            raise CalibrateError(f"--roles {','.join(unknown)}: the layout's roles are {', '.join(roles)}")
        roles = {r: v for r, v in roles.items() if r in args.roles}
    plan = plan_sweep(
        roles,
        knobs=args.knobs,
        points=args.points,
        power_limits_w=args.power_limits,
        sm_clocks_mhz=args.sm_clocks,
        clock_floor_mhz=args.clock_floor_mhz,
        point_s=args.point_s,
        settle_s=0.0,
        max_minutes=args.max_minutes,
        refine=args.refine,
    )
    load = _load(args)
    say(f"simulated calibration of {args.simulate} ({args.model}) under {load.text()}:")
    say(plan.text())
    t0 = time.monotonic()
    results = simulate_sweep(args.simulate, args.model, plan, load, on_note=say, options=options)
    analyses = {r.role: choose_modes(results[r.role]["points"], r.phase, options) for r in plan.roles}
    joint = choose_across_roles(analyses, options)
    rows = []
    for r in plan.roles:
        analysis = analyses[r.role]
        rows.append(
            calibration_row(
                node=socket.gethostname(),
                source="simulated",
                target=f"sim:{args.simulate}",
                fingerprint=sim_fingerprint(layout, args.model, r.role),
                role=r.role,
                phase=r.phase,
                result=results[r.role],
                analysis=analysis,
                duration_s=time.monotonic() - t0,
                trust=["simulated"],
                details={"load": load.describe(), "bounds": bounds_dict(r.bounds), "gpus": pool_gpus[r.role]},
            )
        )
        say(choice_text(r.role, analysis))
    if joint:
        say(joint_text(joint))
    out: dict[str, Any] = {"simulated": True, "plan": plan.text(), "calibrations": rows, "e2e_budget": joint}
    if args.db:
        out["recommendation"] = _store_simulated(args, rows, say)
    return out


def _store_simulated(args: argparse.Namespace, rows: list[dict[str, Any]], say: Any) -> dict[str, Any]:
    """Store a simulated sweep's calibrations and the ``power`` recommendation of ``--mode`` from them:
    a layout not deployed is set up by the exported script (``--format nvidia-smi``), not applied."""
    from analytics.prices import load_prices
    from analytics.recommend.records import save_recommendation
    from collector.store import Store
    from phaselens.power.records import power_recommendation, save_calibrations

    target = rows[0]["target"]
    with Store.open(args.db) as store:
        ids = save_calibrations(store, rows)
        say(f"stored calibrations {', '.join(ids)} in {args.db}")
        before = {w: {"reset": True} for row in rows for w in row["details"]["workers"] or []}
        rec = power_recommendation(
            node=socket.gethostname(),
            target=target,
            rows={row["role"]: row for row in rows},
            mode=args.mode,
            before=before,
            prices=load_prices(),
        )
        save_recommendation(store, rec)
    say(f"recommendation {rec['recommendation_id']} ({args.mode.upper()}): {rec['rationale']}")
    if rec["proposed"]["changes"]:
        say(
            f"a layout not deployed: export it per node and role, "
            f"phaselens export {rec['recommendation_id']} --format nvidia-smi --db {args.db} --out power.sh"
        )
    return rec


def bounds_dict(b: Any) -> dict[str, Any]:
    """A role's bounds as stored (the clock list as its ends and count)."""
    return {
        "power_min_w": b.power_min_w,
        "power_max_w": b.power_max_w,
        "power_default_w": b.power_default_w,
        "sm_clock_min_mhz": b.clocks_mhz[0] if b.clocks_mhz else None,
        "sm_clock_max_mhz": b.clocks_mhz[-1] if b.clocks_mhz else None,
        "sm_clocks": len(b.clocks_mhz),
    }


def joint_text(joint: dict[str, Any]) -> str:
    """The roles' settings chosen together under the end-to-end bound, per mode, in words."""
    lines = ["end-to-end bound (the roles' e2e rises add up), settings chosen together:"]
    for mode, j in joint.items():
        settings = ", ".join(f"{role} {label}" for role, label in j["settings"].items())
        lines.append(
            f"  {mode.upper():<4} {settings}: e2e mean {j['e2e_change_pct']:+.1f} % (bound +{j['bound_pct']:g} %), "
            f"{j['energy_saved_j']:.0f} J saved"
        )
    return "\n".join(lines)


def choice_text(role: str, analysis: dict[str, Any]) -> str:
    """The cliff and the mode choices of one role, in words."""
    lines = [
        f"{role}: noise {analysis['noise_pct']:.1f} % → a rise over {analysis['threshold_pct']:.1f} % counts",
    ]
    for knob, c in (analysis.get("cliff") or {}).items():
        lines.append(
            f"  cliff ({knob}): "
            + (f"{c['setting']['label']} (+{c['rise_pct']:.1f} %)" if c else "none within the swept range")
        )
    for mode, m in analysis["modes"].items():
        if m.get("keep_defaults"):
            lines.append(f"  {mode.upper():<4} keep the defaults: {m['reason']}")
        else:
            lat = [v for v in m["latency_change_pct"].values() if v is not None]
            e2e = m.get("e2e_change_pct")
            lines.append(
                f"  {mode.upper():<4} {m['setting']['label']:<20} tokens/J {m['tokens_per_j_gain_pct']:+.1f} %, "
                f"power {m['power_w_change']:+.0f} W/GPU, latency {max(lat) if lat else 0:+.1f} % (worst of p50/p99)"
                + ("" if e2e is None else f", e2e mean {e2e:+.1f} %")
            )
        if (m.get("budget") or {}).get("instead_of"):
            lines.append(f"       (instead of {m['budget']['instead_of']}: the roles share the e2e bound)")
    return "\n".join(lines)
