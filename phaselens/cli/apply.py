"""``phaselens apply ID [--execute]`` and ``phaselens rollback ACTION_ID|REC_ID``: apply a layout
recommendation to the bundled stack (dry run unless ``--execute``) or restore the layout from before
an apply — through the running collector (its API, which runs it and audits it), or with ``--db`` on
a store file no collector holds (:mod:`phaselens.apply`)."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import Any

from phaselens.cli.data_access import api_error_message, open_store_file

TOKEN_HELP = (
    "the control token (default $PHASELENS_CONTROL_TOKEN; `phaselens demo` prints it): the stack's with --db, "
    "the collector's otherwise"
)


def add_apply_commands(sub: Any) -> None:
    """Register ``phaselens apply`` and ``phaselens rollback``."""
    from phaselens.apply.guard import DEFAULT_GUARD_S, DEFAULT_MAX_ERROR_RATE
    from phaselens.apply.plan import DEFAULT_MAX_ADD, DEFAULT_MAX_STEPS
    from phaselens.apply.runner import DEFAULT_DRAIN_TIMEOUT_S, DEFAULT_SETTLE_S

    p = sub.add_parser(
        "apply", help="apply a layout recommendation to the bundled stack (dry run unless --execute)"
    )
    p.add_argument("recommendation_id", metavar="ID", help="the recommendation (rec-...)")
    p.add_argument(
        "--execute", action="store_true", help="change the stack (default: print the plan, change nothing)"
    )
    p.add_argument(
        "--guard-s",
        type=float,
        default=DEFAULT_GUARD_S,
        help=f"guard window after each step, s ({DEFAULT_GUARD_S:g})",
    )
    p.add_argument(
        "--settle-s", type=float, default=DEFAULT_SETTLE_S, help="wait after a window for its telemetry, s"
    )
    p.add_argument(
        "--drain-timeout-s", type=float, default=DEFAULT_DRAIN_TIMEOUT_S, help="drain limit per step, s"
    )
    p.add_argument(
        "--max-steps", type=int, default=DEFAULT_MAX_STEPS, help=f"refuse a longer plan ({DEFAULT_MAX_STEPS})"
    )
    p.add_argument(
        "--max-add", type=int, default=DEFAULT_MAX_ADD, help=f"workers one apply may add ({DEFAULT_MAX_ADD})"
    )
    p.add_argument(
        "--max-error-rate",
        type=float,
        default=DEFAULT_MAX_ERROR_RATE,
        help="guard: roll back above this error rate",
    )
    _where(p)
    p.set_defaults(func=cmd_apply)
    r = sub.add_parser("rollback", help="restore the stack's layout from before an apply")
    r.add_argument("ref", metavar="ACTION_ID|REC_ID", help="an action of the apply, or its recommendation")
    r.add_argument(
        "--drain-timeout-s", type=float, default=DEFAULT_DRAIN_TIMEOUT_S, help="drain limit per step, s"
    )
    _where(r)
    r.set_defaults(func=cmd_rollback)
    g = sub.add_parser(
        "power-guard",
        help="watch an applied power recommendation's lanes; release a lane's knob when it breaches its SLO",
    )
    g.add_argument("recommendation_id", metavar="ID", help="an applied power recommendation")
    g.add_argument("--db", required=True, help="the store file holding it (the audit rows go there)")
    g.add_argument("--token", default=None, help=TOKEN_HELP)
    g.add_argument("--window-s", type=float, default=30.0, help="judge each lane over this window, s (30)")
    g.add_argument("--for-s", type=float, default=None, help="watch this long (default: until interrupted)")
    g.add_argument("--once", action="store_true", help="judge the last window once and exit")
    g.set_defaults(func=cmd_power_guard)


def _where(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=None, help="run here on this store file (no collector may hold it)")
    p.add_argument(
        "--collector",
        default=os.environ.get("PHASELENS_API_URL") or "http://127.0.0.1:8900",
        metavar="URL",
        help="the running collector that applies and audits it (default: $PHASELENS_API_URL or http://127.0.0.1:8900)",
    )
    p.add_argument("--token", default=None, help=TOKEN_HELP)
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")


def _fail(cmd: str, message: str, code: int = 2) -> int:
    print(f"phaselens {cmd}: error: {message}", file=sys.stderr)
    return code


def _token(args: argparse.Namespace) -> str | None:
    return args.token or os.environ.get("PHASELENS_CONTROL_TOKEN") or None


def _open_store(db: str) -> Any:
    from phaselens.apply.plan import ApplyError

    return open_store_file(db, ApplyError, "drop --db to apply through the collector")


def _options(args: argparse.Namespace, **kw: Any) -> Any:
    from phaselens.apply.runner import ApplyOptions

    return ApplyOptions(
        execute=args.execute,
        guard_s=args.guard_s,
        settle_s=args.settle_s,
        drain_timeout_s=args.drain_timeout_s,
        max_steps=args.max_steps,
        max_add=args.max_add,
        max_error_rate=args.max_error_rate,
        **kw,
    )


def cmd_apply(args: argparse.Namespace) -> int:
    from phaselens.apply.plan import ApplyError

    token = _token(args)
    if not token:
        return _fail(
            "apply",
            "the control token is required: pass --token TOKEN or set $PHASELENS_CONTROL_TOKEN "
            "(`phaselens demo` prints it as its 'control token')",
        )
    try:
        options = _options(args)
        options.check()
        out = _apply_on_file(args, options, token) if args.db else _apply_through(args, token)
    except ApplyError as e:
        return _fail("apply", str(e))
    if args.json:
        print(json.dumps(out, indent=1, default=str))
    return 0 if out.get("outcome") in ("dry_run", "applied") else 1


def _apply_on_file(args: argparse.Namespace, options: Any, token: str) -> dict[str, Any]:
    from phaselens.apply.audit import Audit
    from phaselens.apply.guard import comparison_text
    from phaselens.apply.runner import ApplyRun

    store = _open_store(args.db)
    try:
        say = (lambda s: None) if args.json else (lambda s: print(s, flush=True))
        run = ApplyRun(
            Audit(store, socket.gethostname()), args.recommendation_id, token, options, on_note=say
        )
        summary = run.prepare()
        say(summary["plan"])
        if not options.execute:
            say(
                f"dry run: nothing changed; the plan is audited as {summary['apply_action_id']} (run again with --execute)"
            )
        out = run.run()
        if options.execute:
            say(f"{out['outcome']}: {out.get('reason') or 'every guard window passed'}")
            if "comparison" in out:
                say("realised vs predicted (last guard window):\n" + comparison_text(out["comparison"]))
        return out
    finally:
        store.close()


def _apply_through(args: argparse.Namespace, token: str) -> dict[str, Any]:
    import httpx

    from phaselens.apply.plan import ApplyError

    base = args.collector.rstrip("/")
    body = {
        "dry_run": not args.execute,
        "guard_s": args.guard_s,
        "settle_s": args.settle_s,
        "drain_timeout_s": args.drain_timeout_s,
        "max_steps": args.max_steps,
        "max_add": args.max_add,
        "max_error_rate": args.max_error_rate,
    }
    say = (lambda s: None) if args.json else (lambda s: print(s, flush=True))
    try:
        with httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=httpx.Timeout(600, connect=5)
        ) as c:
            r = c.post(f"/api/v1/recommendations/{args.recommendation_id}/apply", json=body)
            if r.status_code != 202:
                raise ApplyError(f"{base} answered {r.status_code}: {api_error_message(r)}")
            summary = r.json()
            say(summary["plan"])
            if not args.execute:
                say(
                    f"dry run: nothing changed; the plan is audited as {summary['apply_action_id']} (run again with --execute)"
                )
                return {"outcome": "dry_run", **summary}
            return _follow(c, args.recommendation_id, summary, say)
    except httpx.HTTPError as e:
        raise ApplyError(
            f"cannot reach the collector at {base} ({e}); start `phaselens collect`, or pass --db FILE for a store no "
            "collector holds"
        ) from e


def _follow(c: Any, rec_id: str, summary: dict[str, Any], say: Any) -> dict[str, Any]:
    """Print the apply's rows as they appear until it has finished; its outcome."""
    seen = set(summary["action_ids"])
    while True:
        got = c.get("/api/v1/actions", params={"recommendation_id": rec_id}).json()
        for row in got["actions"]:
            if row["action_id"] not in seen:
                seen.add(row["action_id"])
                say(f"  {row['action']} [{row['status']}] {row['message'] or ''}")
        running = got.get("running")
        if running is None:
            last = got.get("last") or {}
            say(
                f"{last.get('outcome')}: {last.get('reason') or last.get('error') or 'every guard window passed'}"
            )
            return last
        time.sleep(0.5)


def cmd_rollback(args: argparse.Namespace) -> int:
    import httpx

    from phaselens.apply.audit import Audit
    from phaselens.apply.plan import ApplyError, roles_text
    from phaselens.apply.runner import ApplyOptions, rollback_apply

    token = _token(args)
    if not token:
        return _fail(
            "rollback", "the control token is required: pass --token TOKEN or set $PHASELENS_CONTROL_TOKEN"
        )
    try:
        options = ApplyOptions(drain_timeout_s=args.drain_timeout_s, actor="phaselens-rollback")
        options.check()
        if args.db:
            store = _open_store(args.db)
            try:
                out = rollback_apply(Audit(store, socket.gethostname()), args.ref, token, options)
            finally:
                store.close()
        else:
            base = args.collector.rstrip("/")
            try:
                r = httpx.post(
                    f"{base}/api/v1/actions/{args.ref}/rollback",
                    json={"drain_timeout_s": args.drain_timeout_s},
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=httpx.Timeout(3700, connect=5),
                )
            except httpx.HTTPError as e:
                raise ApplyError(f"cannot reach the collector at {base} ({e}); or pass --db FILE") from e
            if r.status_code != 200:
                raise ApplyError(f"{base} answered {r.status_code}: {api_error_message(r)}")
            out = r.json()
    except ApplyError as e:
        return _fail("rollback", str(e))
    if args.json:
        print(json.dumps(out, indent=1, default=str))
    else:
        for s in out["steps"]:
            print(f"  {s['text']}")
        roles = out.get("roles")
        print(
            f"{out['outcome']}: the stack has {roles_text(roles) if roles else 'an unknown layout'} (audited as {out['action_id']})"
        )
    return 0 if out["outcome"] == "rolled_back" else 1


def cmd_power_guard(args: argparse.Namespace) -> int:
    """Judge the lanes every window (phaselens/apply/power_guard.py); 0 while all pass, 1 once a lane
    was released, 2 refused."""
    from phaselens.apply.audit import Audit
    from phaselens.apply.plan import ApplyError
    from phaselens.apply.power_guard import PowerGuard

    token = _token(args)
    if not token:
        return _fail(
            "power-guard",
            "the stack's control token is required: pass --token TOKEN or set $PHASELENS_CONTROL_TOKEN",
        )
    released = False
    try:
        store = _open_store(args.db)
        try:
            guard = PowerGuard(
                Audit(store, socket.gethostname()), args.recommendation_id, token, window_s=args.window_s
            )
            end = None if args.for_s is None else time.monotonic() + args.for_s
            try:
                while True:
                    if not args.once:
                        time.sleep(args.window_s)
                    for v in guard.check():
                        state = (
                            "passed"
                            if v["passed"]
                            else "BREACH: knob released"
                            if v.get("released")
                            else "BREACH"
                        )
                        print(f"{v['role']} ({', '.join(v['workers'])}): {state}: {v['why']}", flush=True)
                        released = released or bool(v.get("released"))
                    if args.once or (end is not None and time.monotonic() >= end):
                        break
            except KeyboardInterrupt:
                pass
            finally:
                guard.close()
        finally:
            store.close()
    except ApplyError as e:
        return _fail("power-guard", str(e))
    return 1 if released else 0
