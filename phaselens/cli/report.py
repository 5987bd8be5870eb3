"""``phaselens report``: make an efficiency report now, through the running collector or on a store
file (:mod:`phaselens.reports` makes, stores and renders it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from collector.report_limits import ReportLimits, size_text
from phaselens.cli.data_access import api_error_message, control_headers, open_store_file
from phaselens.reports import Report, ReportError, build_report, save_report, standalone_html


def add_report_command(sub: Any) -> None:
    """``phaselens report --since 24h``: make an efficiency report now (through the running
    collector, or on a store file with ``--db`` while no collector holds it)."""
    import os

    p = sub.add_parser("report", help="make an efficiency report now (HTML + JSON), stored with the others")
    p.add_argument(
        "--since",
        default=None,
        help="the window before now, e.g. 1h, 24h (the default on live data), 7d; on a scenario: before its end "
        "(default: the whole scenario)",
    )
    p.add_argument("--dataset", default="live", help="live, a scenario id, or latest (the newest scenario)")
    p.add_argument(
        "--db", default=None, help="write into this store file directly (no collector may hold it)"
    )
    p.add_argument(
        "--collector",
        default=os.environ.get("PHASELENS_API_URL") or "http://127.0.0.1:8900",
        metavar="URL",
        help="the running collector that makes and stores it (default: $PHASELENS_API_URL or http://127.0.0.1:8900)",
    )
    p.add_argument("--token", default=None, help="the collector's control token, if it has one")
    p.add_argument("--out", default=None, metavar="FILE.html", help="also save the self-contained page here")
    p.add_argument("--json-out", default=None, metavar="FILE.json", help="also save the summary JSON here")
    p.set_defaults(func=cmd_report)


def cmd_report(args: Any) -> int:
    import sys
    from pathlib import Path

    since = args.since if args.since is not None or args.dataset != "live" else "24h"
    params = {"since": since, "dataset": args.dataset}
    for flag, out in (("--out", args.out), ("--json-out", args.json_out)):
        # refused before the report is made and stored, not with a traceback after
        problem = _out_path_problem(out) if out else None
        if problem:
            print(f"phaselens report: error: {flag} {out}: {problem}", file=sys.stderr)
            return 2
    try:
        if args.db:
            made = _report_on_file(args.db, params)
            where = f"stored in {args.db}"
            page, summary = standalone_html(made.body), made.summary
            rid, title, error = made.report_id, made.title, made.error
        else:
            info, page, summary = _report_through(
                args.collector, params, args.token, want_page=bool(args.out)
            )
            rid, title, error = info["report_id"], info["title"], info.get("error")
            where = f"stored by the collector: {args.collector.rstrip('/')}/api/v1/reports/{rid}"
    except ReportError as e:
        print(f"phaselens report: error: {e}", file=sys.stderr)
        return 2
    try:
        if args.out:
            Path(args.out).write_text(page or "", encoding="utf-8")
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(summary, indent=1), encoding="utf-8")
    except OSError as e:
        print(f"phaselens report: error: report {rid} is {where}, but saving it failed: {e}", file=sys.stderr)
        return 1
    print(f"report {rid}: {title}; {where}" + (f"; page {args.out}" if args.out else ""))
    if error:
        print(f"phaselens report: warning: {error}", file=sys.stderr)
    return 0


def _out_path_problem(path: str) -> str | None:
    """Why a file cannot be written at ``path`` (a folder there, or no folder to hold it), else None."""
    p = Path(path)
    if p.is_dir():
        return "is a folder; give a file name, e.g. report.html"
    if not p.resolve().parent.is_dir():
        return f"the folder {p.resolve().parent} does not exist"
    return None


def _report_on_file(db: str, params: dict[str, Any]) -> Report:
    store = open_store_file(db, ReportError, "drop --db to have the collector make the report")
    try:
        with store.reader() as cur:
            report = build_report(cur, params)
        pruned = save_report(store, report, node=_hostname(), limits=ReportLimits())
        if pruned is not None and pruned.count:
            import sys

            print(
                f"phaselens report: note: pruned the {pruned.count} oldest reports ({size_text(pruned.bytes)}) "
                f"to keep {pruned.kept_count} (at most {ReportLimits().max_count}, "
                f"{size_text(ReportLimits().max_bytes)})",
                file=sys.stderr,
            )
        return report
    finally:
        store.close()


def _hostname() -> str:
    import socket

    return socket.gethostname()


def _report_through(
    url: str, params: dict[str, Any], token: str | None, *, want_page: bool
) -> tuple[dict[str, Any], str | None, Any]:

    import httpx

    headers = control_headers(token)
    base = url.rstrip("/")
    try:
        with httpx.Client(base_url=base, timeout=httpx.Timeout(600.0, connect=5.0), headers=headers) as c:
            r = c.post("/api/v1/reports", json=params)
            if r.status_code in (401, 403):
                raise ReportError(
                    f"{base}/api/v1/reports answered {r.status_code}: {api_error_message(r)}. Pass the collector's "
                    "control token with --token TOKEN or $PHASELENS_CONTROL_TOKEN (`phaselens demo` prints "
                    "it as its 'control token')"
                )
            if r.status_code != 200:
                raise ReportError(f"{base}/api/v1/reports answered {r.status_code}: {api_error_message(r)}")
            info = r.json()
            detail = c.get(f"/api/v1/reports/{info['report_id']}", params={"format": "json"}).json()
            page = c.get(f"/api/v1/reports/{info['report_id']}").text if want_page else None
    except httpx.HTTPError as e:
        raise ReportError(
            f"cannot reach the collector at {base} ({e}); start `phaselens collect`, or pass --db FILE for a "
            "store no collector holds"
        ) from e
    return info, page, detail.get("summary")
