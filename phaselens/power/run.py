"""``phaselens calibrate`` on the live stack, end to end: read the stack (roles, each worker's knobs,
bounds and fingerprint), plan, print the plan (a dry run stops there), sweep with the knobs restored
however it ends, analyse, store the calibrations and the sweep's ``actions`` row, and recommend.
Also ``--recommend``: the recommendation from stored calibrations, the stale ones marked and left out.
"""

from __future__ import annotations

import argparse
import socket
import time
from collections.abc import Callable
from typing import Any

from phaselens.apply.stack import StackClient, StackError
from phaselens.power.choose import ChooseOptions, choose_across_roles, choose_modes
from phaselens.power.fingerprint import Fingerprint, of_worker
from phaselens.power.live import LiveSweep, SweepInterrupted, interruptible
from phaselens.power.load import LoadSpec
from phaselens.power.model_check import gpu_key, stack_layout
from phaselens.power.plan import Bounds, CalibrateError, plan_sweep
from phaselens.power.records import (
    calibration_row,
    power_recommendation,
    save_calibrations,
    usable_calibrations,
)

ROLE_ORDER = ("prefill", "decode", "mixed")


def read_stack(stack: StackClient, roles_wanted: list[str] | None) -> dict[str, Any]:
    """The stack's ready workers by role, each with its knobs, bounds and fingerprint."""
    layout = stack.layout()
    workers = layout.get("workers", [])
    busy = [w for w in workers if w.get("state") != "ready"]
    if busy:
        raise CalibrateError(
            f"worker {busy[0].get('id')} is {busy[0].get('state')}: calibrate when every worker is ready"
        )
    present = sorted({w["role"] for w in workers}, key=ROLE_ORDER.index)
    if roles_wanted:
        unknown = sorted(set(roles_wanted) - set(present))
        if unknown:
            raise CalibrateError(
                f"--roles {','.join(unknown)}: the stack's roles are {', '.join(present) or 'none'}"
            )
    out: dict[str, Any] = {"roles": {}, "fingerprints": {}, "knobs": {}, "devices": {}}
    for role in present:
        if roles_wanted and role not in roles_wanted:
            continue
        entries, prints = [], set()
        for w in (w for w in workers if w["role"] == role):
            try:
                knobs = stack.device_knobs(w["id"])
            except StackError as e:
                raise CalibrateError(f"cannot read the knobs of {w['id']}: {e}") from e
            out["knobs"][w["id"]] = knobs
            out["devices"][w["id"]] = w.get("device")
            entries.append((w["id"], Bounds.from_knobs(knobs, where=f"{w['id']} ({w.get('device')})")))
            prints.add(of_worker(w, knobs))
        if len(prints) > 1:
            raise CalibrateError(
                f"the {role} workers differ ({'; '.join(p.text() for p in prints)}): one calibration needs one "
                "GPU model and engine per role"
            )
        out["roles"][role] = entries
        out["fingerprints"][role] = prints.pop()
    out["sim_layout"] = _sim_layout(workers, out["fingerprints"])
    return out


def _sim_layout(workers: list[dict[str, Any]], fps: dict[str, Fingerprint]) -> str | None:
    """The stack as a simulator layout (for the model check), None where its GPU has no model."""
    fp = next(iter(fps.values()), None)
    gpu = gpu_key(fp.gpu_model) if fp else None
    if fp is None or gpu is None:
        return None
    roles = {r: sum(1 for w in workers if w["role"] == r) for r in ROLE_ORDER}
    kv = max((int((w.get("stats") or {}).get("kv_blocks_total") or 0) for w in workers), default=0)
    return stack_layout(roles, gpu, fp.model, kv or None)


def live_calibrate(
    args: argparse.Namespace,
    token: str,
    options: ChooseOptions,
    say: Callable[[str], None],
    load_fn: Callable[[argparse.Namespace], Any],
) -> dict[str, Any]:
    """The command on the live stack (module docstring); its outcome with ``exit_code``."""
    url = args.url.rstrip("/")
    target = f"stack:{url}"
    with StackClient(url, token, timeout_s=60.0) as stack:
        seen = read_stack(stack, args.roles)
        fps: dict[str, Fingerprint] = seen["fingerprints"]
        if args.recommend:
            return _recommend_stored(args, target, seen, say)
        plan = plan_sweep(
            seen["roles"],
            knobs=args.knobs,
            points=args.points,
            power_limits_w=args.power_limits,
            sm_clocks_mhz=args.sm_clocks,
            clock_floor_mhz=args.clock_floor_mhz,
            point_s=args.point_s,
            settle_s=args.settle_s,
            max_minutes=args.max_minutes,
            refine=args.refine,
        )
        load = load_fn(args)
        say(f"calibration of {url} under {load.text()}:")
        for role, fp in fps.items():
            say(f"  {role}: {fp.text()}")
        say(plan.text())
        audit = _audit(args)
        header = None
        if audit is not None:
            header = audit.row(
                "calibrate",
                actor="phaselens-calibrate",
                target=target,
                before={"knobs": seen["knobs"]},
                after={"plan": plan.text(), "load": load.describe()},
                dry_run=not args.execute,
                status="planned",
                recommendation_id=None,
                message=plan.text(),
            )
            audit.append([header])
        if not args.execute:
            say(
                "dry run: nothing changed (run again with --execute to sweep; the knobs are restored at the end)"
            )
            _close(audit)
            return {"dry_run": True, "plan": plan.text(), "exit_code": 0}
        sweep = LiveSweep(stack, plan, load, options, on_note=say)
        interrupted: SweepInterrupted | None = None
        error: Exception | None = None
        t0 = time.monotonic()
        try:
            with interruptible():
                sweep.run()
        except SweepInterrupted as e:
            interrupted = e
        except (StackError, CalibrateError) as e:
            error = e
        duration = time.monotonic() - t0
    restored = sweep.restored or {"restored": False, "errors": ["the sweep never started"]}
    rows, _analyses = _rows(args, plan, sweep.results, fps, target, load, duration, seen)
    outcome: dict[str, Any] = {
        "interrupted": str(interrupted) if interrupted else None,
        "error": str(error) if error else None,
        "restored": restored["restored"],
        "calibrations": rows,
    }
    if interrupted:
        say(
            f"{interrupted}: the sweep stopped; {'knobs restored' if restored['restored'] else 'RESTORE FAILED'}"
        )
    if error:
        say(f"the sweep failed: {error}; {'knobs restored' if restored['restored'] else 'RESTORE FAILED'}")
    if audit is not None and header is not None:
        status = (
            "applied" if not (interrupted or error) else "rolled_back" if restored["restored"] else "failed"
        )
        ids = save_calibrations(audit.store, rows) if rows else []
        audit.update(
            header["action_id"],
            status=status,
            after={"restored": restored, "calibrations": ids, "duration_s": round(duration, 2)},
            message=outcome["interrupted"] or outcome["error"] or f"swept {len(rows)} roles; knobs restored",
        )
        say(f"stored {len(ids)} calibrations in {args.db} (audited as {header['action_id']})")
        complete = {r["role"]: r for r in rows if r["status"] == "current"}
        if complete and not (interrupted or error):
            outcome["recommendation"] = _recommend(args, audit, target, complete, seen, say, load)
    _close(audit)
    code = 128 + interrupted.signum if interrupted else 1 if (error or not restored["restored"]) else 0
    return outcome | {"exit_code": code}


def _rows(
    args: argparse.Namespace,
    plan: Any,
    results: dict[str, dict[str, Any]],
    fps: dict[str, Fingerprint],
    target: str,
    load: Any,
    duration: float,
    seen: dict[str, Any],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from phaselens.cli.calibrate import bounds_dict, choice_text, joint_text

    options = _options_of(args)
    analyses = {
        r.role: choose_modes(res["points"], r.phase, options)
        for r in plan.roles
        if (res := results.get(r.role)) and res["points"] and res["complete"]
    }
    joint = choose_across_roles(analyses, options)
    rows = []
    for r in plan.roles:
        res = results.get(r.role)
        if not res or not res["points"]:
            continue
        analysis = analyses.get(r.role)
        if analysis is not None and not args.json:
            print(choice_text(r.role, analysis), flush=True)
            if analysis.get("cliff_note"):
                print(f"  host-bound: {analysis['cliff_note']} (confidence low)", flush=True)
        emulated = all((seen["knobs"][w] or {}).get("emulated") for w in r.workers)
        host_bound = any(p["figures"].get("host_bound") for p in res["points"])
        rows.append(
            calibration_row(
                node=socket.gethostname(),
                source="live",
                target=target,
                fingerprint=fps[r.role],
                role=r.role,
                phase=r.phase,
                result=res,
                analysis=analysis,
                duration_s=duration,
                trust=["emulated" if emulated else "measured"] + (["host-bound"] if host_bound else []),
                details={"load": load.describe(), "bounds": bounds_dict(r.bounds), "point_s": plan.point_s},
            )
        )
    if joint and not args.json:
        print(joint_text(joint), flush=True)
    return rows, analyses


def _options_of(args: argparse.Namespace) -> ChooseOptions:
    from phaselens.cli.calibrate import _options

    return _options(args)


def _audit(args: argparse.Namespace) -> Any:
    if not args.db:
        return None
    from collector.store import Store, StoreError, StoreLockedError
    from phaselens.apply.audit import Audit

    try:
        store = Store.open(args.db)
    except StoreLockedError as e:
        raise CalibrateError(f"--db {args.db}: {e} (a running collector holds it)") from e
    except StoreError as e:
        raise CalibrateError(f"--db {args.db}: {e}") from e
    return Audit(store, socket.gethostname())


def _close(audit: Any) -> None:
    if audit is not None:
        audit.store.close()


def _recommend(
    args: argparse.Namespace,
    audit: Any,
    target: str,
    rows: dict[str, dict[str, Any]],
    seen: dict[str, Any],
    say: Callable[[str], None],
    load: Any = None,
) -> dict[str, Any]:
    from analytics.prices import load_prices
    from analytics.recommend.records import save_recommendation
    from phaselens.power.model_check import model_check

    any_row = next(iter(rows.values()))
    if load is None:  # from stored calibrations: their Poisson load again (an observed one is not kept whole)
        d = (any_row.get("details") or {}).get("load") or {}
        if d.get("source") == "poisson":
            load = LoadSpec(
                rate_rps=d["rate_rps"],
                prompt_tokens=tuple(d["prompt_tokens"]),
                output_tokens=tuple(d["output_tokens"]),
                seed=d.get("seed", 0),
            )
    point_s = float((any_row.get("details") or {}).get("point_s") or args.point_s)
    check = model_check(rows, args.mode, seen.get("sim_layout"), load, max(point_s, 20.0))
    rec = power_recommendation(
        node=audit.node,
        target=target,
        rows=rows,
        mode=args.mode,
        before=seen["knobs"],
        prices=load_prices(),
        sim_check=check,
    )
    save_recommendation(audit.store, rec)
    say(f"recommendation {rec['recommendation_id']} ({args.mode.upper()}): {rec['rationale']}")
    say(f"confidence {rec['details']['confidence']['level']}: {rec['details']['confidence']['text']}")
    if rec["proposed"]["changes"]:
        say(f"apply it: phaselens apply {rec['recommendation_id']} --db {args.db} --token TOKEN [--execute]")
    return rec


def _recommend_stored(
    args: argparse.Namespace, target: str, seen: dict[str, Any], say: Callable[[str], None]
) -> dict[str, Any]:
    if not args.db:
        raise CalibrateError("--recommend reads the stored calibrations: give --db FILE")
    audit = _audit(args)
    try:
        usable, stale = usable_calibrations(audit.store, target, seen["fingerprints"])
        for s in stale:
            say(f"stale: {s['calibration_id']} ({s['role']}) — {s['reason']}; marked stale, not used")
        missing = sorted(set(seen["fingerprints"]) - set(usable))
        if missing:
            raise CalibrateError(
                f"no current calibration of {', '.join(missing)} for {target} matches the running stack"
                + (f" ({len(stale)} stale)" if stale else "")
                + ": run phaselens calibrate --execute first"
            )
        rec = _recommend(args, audit, target, usable, seen, say)
        return {"recommendation": rec, "stale": stale, "exit_code": 0}
    finally:
        _close(audit)
