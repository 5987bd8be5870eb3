"""Efficiency reports: the analytics summary of a window as a self-contained HTML page (Plotly's
JavaScript inlined, readable offline, no CDN) plus its JSON, stored in the ``reports`` table.

Just over 600 lines: the report job, its schedules (cron parsing, catch-up at start-up) and its limits
are one unit; the schedules are the part to move out next (its rendering already lives in
``dashboard/report_html``).

Scheduled reports run inside ``phaselens collect`` (APScheduler 3.x ``BackgroundScheduler``):
``hourly`` (``0 * * * *``) and ``daily`` (``0 6 * * *``) by default, cron syntax in UTC, set with
``--report-schedule NAME=CRON`` (repeatable; ``--report-schedule off``: none). CRON has five fields
(minute hour day-of-month month day-of-week, APScheduler's ``CronTrigger.from_crontab``) or six with a
seconds field first (``*/30 * * * * *``: every 30 s; the fields are APScheduler's ``CronTrigger``
``second``, ``minute``, ``hour``, ``day``, ``month``, ``day_of_week``). A run covers the period before
it (from the schedule's previous fire time to this one) of the live data.

Misfire policy: ``coalesce=True`` (runs missed in a row become one run) and
``misfire_grace_time`` = a quarter of the schedule's period (15 min for hourly, 6 h for daily): a
run later than that is skipped and the next one runs on time. A run missed while the service was
down counts the same way: at start, a schedule that has stored a report before and whose latest
fire time since then lies within the grace time runs once, at once, for that fire time's period;
an older one is skipped (logged). A schedule that never ran has nothing to catch up.

The page itself (headline figures against the previous period, the dashboard's charts per section,
what is missing, the detailed tables folded) is rendered by ``dashboard/report_html/``; this
module makes the report (:func:`build_report`: the summary, plus the overview and the activity
histogram of the same window), schedules, stores, lists and serves it.

The stored body is the page without Plotly's 3.6 MB of JavaScript (a marker in its place), so an
hourly report costs kilobytes in the store; :func:`standalone_html` puts the script back when the
page is served or downloaded (``GET /api/v1/reports/{id}``).

Storage is bounded (``collector/report_limits.py``): at most ``--report-max-count`` reports of
``--report-max-mib`` together, the oldest pruned first after each report is stored (counted in
/health ``reports.pruned``); ``POST /api/v1/reports`` is rate-limited (a token bucket, 429).

The page is ``dashboard/report_html/``, the bounds ``collector/report_limits.py``, the ``phaselens
report`` command ``phaselens/cli/report.py``.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from collector.report_limits import (
    DEFAULT_SCHEDULES,
    Pruned,
    ReportBudget,
    ReportLimits,
    prune_reports,
    size_text,
    stored_size,
)
from dashboard.report_html import PLOTLY_MARKER, render_html, standalone_html
from dashboard.report_html import utc_text as _utc
from phaselens.report_title import report_scope, report_title

__all__ = [  # the page itself is dashboard/report_html/; these names are imported from here
    "DEFAULT_SCHEDULES",
    "PLOTLY_MARKER",
    "Report",
    "ReportError",
    "ReportSchedule",
    "ReportScheduler",
    "add_report_routes",
    "build_report",
    "get_report",
    "list_reports",
    "parse_schedule",
    "parse_schedules",
    "render_html",
    "save_report",
    "standalone_html",
]

log = logging.getLogger(__name__)

MANUAL = "manual"
WRITE_TIMEOUT_S = 120.0


class ReportError(ValueError):
    """A report cannot be made or found as asked (bad schedule, unknown id, ...); ``param``, when
    known, is the request parameter it was about."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ReportTooLarge(ReportError):
    """A report larger than the whole storage bound (``--report-max-mib``): not stored."""


# -- schedules ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReportSchedule:
    """A named cron schedule (UTC) of reports over the live data."""

    name: str
    cron: str

    def trigger(self) -> Any:
        """The APScheduler trigger: five cron fields, or six with seconds first (ValueError else)."""
        from apscheduler.triggers.cron import CronTrigger

        fields = self.cron.split()
        if len(fields) == 5:
            return CronTrigger.from_crontab(self.cron, timezone=UTC)
        if len(fields) != 6:
            raise ValueError(f"{len(fields)} fields, expected 5 or 6")
        second, minute, hour, day, month, day_of_week = fields
        # the same field meanings as from_crontab (APScheduler 3.x: day-of-week 0 is Monday), a second before
        return CronTrigger(
            second=second,
            minute=minute,
            hour=hour,
            day=day,
            month=month,
            day_of_week=day_of_week,
            timezone=UTC,
        )

    def period_s(self, at_s: float) -> float:
        """The schedule's period around ``at_s``: from its fire time at or after ``at_s`` to the next."""
        trig = self.trigger()
        now = datetime.fromtimestamp(at_s, UTC)
        first = trig.get_next_fire_time(None, now)
        second = trig.get_next_fire_time(first, first + timedelta(seconds=1))
        return (second - first).total_seconds()

    def grace_s(self) -> float:
        """The misfire grace time: a quarter of the period (at least a minute)."""
        return max(60.0, self.period_s(time.time()) / 4)

    def fire_times_s(self, after_s: float, until_s: float, limit: int | None = None) -> list[float]:
        """Fire times in ``(after_s, until_s]``, oldest first (the first ``limit`` of them, if given)."""
        trig = self.trigger()
        out: list[float] = []
        prev = None
        now = datetime.fromtimestamp(after_s + 1e-3, UTC)
        while limit is None or len(out) < limit:
            nxt = trig.get_next_fire_time(prev, now)
            if nxt is None or nxt.timestamp() > until_s:
                return out
            out.append(nxt.timestamp())
            prev, now = nxt, nxt
        return out


def parse_schedule(text: str) -> ReportSchedule:
    """``NAME=CRON`` (five fields, or six with seconds first; UTC) → a schedule; ReportError naming
    the problem."""
    name, sep, cron = text.partition("=")
    name, cron = name.strip(), cron.strip()
    if not sep or not name or not cron:
        raise ReportError(
            f"report schedule {text!r}: expected NAME=CRON, e.g. 'hourly=0 * * * *' or 'daily=0 6 * * *'"
        )
    if not name.replace("-", "").replace("_", "").isalnum() or name == MANUAL:
        raise ReportError(f"report schedule name {name!r}: letters, digits, - and _ only, and not {MANUAL!r}")
    schedule = ReportSchedule(name, cron)
    try:
        schedule.trigger()
    except ValueError as e:
        raise ReportError(
            f"report schedule {name!r}: {cron!r} is not a 5-field cron expression "
            f"(minute hour day month weekday), nor a 6-field one with seconds first: {e}"
        ) from e
    return schedule


def parse_schedules(texts: list[str]) -> list[ReportSchedule]:
    """The schedules of ``--report-schedule`` values (``off`` alone: none); names must differ."""
    if [t.strip().lower() for t in texts] == ["off"]:
        return []
    schedules = [parse_schedule(t) for t in texts]
    names = [s.name for s in schedules]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ReportError(f"report schedule name(s) given twice: {', '.join(dupes)}")
    return schedules


# -- one report --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Report:
    """One report: its row in ``reports`` (the HTML without Plotly's script, the summary JSON)."""

    report_id: str
    kind: str
    title: str
    ts_s: float
    start_s: float | None
    end_s: float | None
    body: str
    summary: dict[str, Any] | None
    error: str | None
    params: dict[str, Any]

    def row(self, node: str) -> dict[str, Any]:
        details = {"summary": self.summary, "error": self.error, "params": self.params}
        return {
            "report_id": self.report_id,
            "node": node,
            "ts_s": self.ts_s,
            "kind": self.kind,
            "title": self.title,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "format": "html",
            "body": self.body,
            "details": details,
        }


def build_report(con: Any, params: dict[str, Any], *, kind: str = MANUAL, title: str | None = None) -> Report:
    """Run the analytics summary of ``params`` (``analytics.reads.run_summary``'s: dataset, since,
    start_s, end_s, ...) on ``con`` and render it. A summary that fails is a report too, saying
    why (a scheduled run must leave a trace); bad parameters raise ReportError."""
    from analytics.reads import run_summary, window_of
    from analytics.window import AnalyticsError, scenarios

    params = {k: v for k, v in params.items() if v is not None}
    if params.get("dataset") == "latest":
        found = scenarios(con)
        if not found:
            raise ReportError("dataset latest: no simulated scenario is stored")
        params["dataset"] = found[0]["scenario_id"]
    try:  # the window first (checked as every analytics read checks it): a report names its window
        window = window_of(con, params)  # even when the analysis fails
    except AnalyticsError as e:
        raise ReportError(str(e), e.param) from e
    start_s, end_s = window.start_s, window.end_s
    fixed = {k: v for k, v in params.items() if k != "since"} | {"start_s": start_s, "end_s": end_s}
    summary: dict[str, Any] | None = None
    error = None
    try:
        summary = run_summary(con, fixed)
    except AnalyticsError as e:
        raise ReportError(str(e), e.param) from e
    except Exception as e:  # the analysis failed on this data: recorded in the report
        log.exception("report %s: the analytics summary failed", kind)
        error = f"the analytics summary failed: {type(e).__name__}: {e}"
    if summary is not None:
        summary |= _report_extras(con, fixed, summary, window)
    scope = _scope(con, window)
    if summary is not None:
        summary["scope"] = scope
    title = title or report_title(kind, str(params.get("dataset") or "live"), scope, start_s, end_s)
    body = render_html(summary, title=title, error=error, start_s=start_s, end_s=end_s)
    return Report(uuid.uuid4().hex, kind, title, time.time(), start_s, end_s, body, summary, error, fixed)


def _report_extras(con: Any, params: dict[str, Any], summary: dict[str, Any], window: Any) -> dict[str, Any]:
    """What the page adds to the summary: ``overview`` (the headline figures against the previous
    period, ``analytics.overview``), ``recommendation`` (the best layout recommendation, its saving,
    its staleness and the auto-apply decisions: ``phaselens/report_recommend.py``) and ``histogram`` (the window's binned SM activity and
    utilization per pool, ``analytics.histogram``), each on ``con``. One that fails is left out and
    named in the summary's ``missing`` (the rest of the report stands)."""
    from analytics.histogram import activity_histogram
    from analytics.overview import overview
    from phaselens.overview import previous_summary
    from phaselens.report_energy import energy_part
    from phaselens.report_recommend import recommendation_part

    out: dict[str, Any] = {}
    missing = summary.setdefault("missing", {})
    try:
        previous, why = previous_summary(con, params, summary)
        fleet = params.get("fleet_gpus")
        out["overview"] = overview(
            summary, previous, fleet_gpus=int(fleet) if fleet else None, previous_missing=why
        )
    except Exception as e:  # the previous period's analysis failed: the headline has no trend
        log.exception("report: the previous period's summary failed")
        missing["previous_period"] = f"{type(e).__name__}: {e}"
        out["overview"] = overview(summary, None, previous_missing=f"no data: {type(e).__name__}: {e}")
    try:  # the best recommendation, its saving, whether it is stale; auto-apply decisions
        out["recommendation"] = recommendation_part(con, params, window)
    except Exception as e:
        log.exception("report: the recommendation part failed")
        missing["recommendation"] = f"{type(e).__name__}: {e}"
    try:  # energy per token per phase; what the power settings save (phaselens/report_energy.py)
        out["energy"] = energy_part(con, params, summary, window.end_s)
    except Exception as e:
        log.exception("report: the energy part failed")
        missing["energy"] = f"{type(e).__name__}: {e}"
    try:
        out["histogram"] = activity_histogram(con, window).to_dict()
    except Exception as e:
        log.exception("report: the activity histogram failed")
        missing["histogram"] = f"{type(e).__name__}: {e}"
    return out


def _scope(con: Any, window: Any) -> dict[str, Any]:
    """The model and layout the report is of (``phaselens/report_title.py``); nothing known when
    reading them fails (the report stands)."""
    try:
        return report_scope(con, window)
    except Exception as e:
        log.exception("report: the model and layout could not be read")
        return {"model": None, "layout": None, "error": f"{type(e).__name__}: {e}"}


def save_report(store: Any, report: Report, node: str, limits: ReportLimits | None = None) -> Pruned | None:
    """Append the report's row and commit it (on the store's writer: the collector's writer
    thread, or a process holding the file), then prune the oldest reports beyond ``limits``
    (what was pruned; None without limits). ReportTooLarge, storing nothing, when the report
    alone is larger than ``limits.max_bytes``."""
    row = report.row(node)
    if limits is not None:
        size = len(row["body"].encode()) + len(json.dumps(row["details"]).encode())
        if size > limits.max_bytes:
            raise ReportTooLarge(
                f"the report takes {size_text(size)}, more than all reports may ({size_text(limits.max_bytes)}, "
                f"--report-max-mib {limits.max_bytes / 2**20:.4g}): not stored"
            )
    store.append("reports", [row])
    store.flush()
    if limits is None:
        return None
    with store.transaction() as con:
        return prune_reports(con, limits)


# -- reading -----------------------------------------------------------------------------------------

_LIST_SQL = """
SELECT report_id, node, ts_s, kind, title, start_s, end_s, format,
       details->>'error' AS error, details->'params'->>'dataset' AS dataset,
       details->'summary'->'trust'->'labels' AS trust
FROM reports {where} ORDER BY ts_s DESC LIMIT ?
"""


def list_reports(store: Any, *, limit: int = 100, kind: str | None = None) -> list[dict[str, Any]]:
    """Stored reports, newest first, without their bodies: id, kind, title, window, trust labels."""
    where, params = ("WHERE kind = ?", [kind]) if kind else ("", [])
    with store.reader() as cur:
        rows = cur.execute(_LIST_SQL.format(where=where), [*params, limit]).fetchall()
        names = [d[0] for d in cur.description]
    out = []
    for r in rows:
        item = dict(zip(names, r, strict=True))
        item["trust"] = json.loads(item["trust"]) if isinstance(item["trust"], str) else []
        item["dataset"] = item["dataset"] or "live"
        out.append(item)
    return out


def get_report(store: Any, report_id: str) -> dict[str, Any]:
    """One stored report: its list fields, ``body`` (the stored HTML) and ``summary``; ReportError
    when there is none of that id."""
    with store.reader() as cur:
        row = cur.execute(
            "SELECT report_id, node, ts_s, kind, title, start_s, end_s, format, body, details "
            "FROM reports WHERE report_id = ?",
            [report_id],
        ).fetchone()
        names = [d[0] for d in cur.description]
    if row is None:
        raise ReportError(f"no report {report_id!r} (GET /api/v1/reports lists them)")
    item = dict(zip(names, row, strict=True))
    details = json.loads(item.pop("details") or "{}")
    item["summary"] = details.get("summary")
    item["error"] = details.get("error")
    item["params"] = details.get("params") or {}
    return item


# -- the scheduler -------------------------------------------------------------------------------------


class ReportScheduler:
    """Runs the scheduled reports inside the collector (a ``BackgroundScheduler``, UTC). ``run``
    makes one report: ``run(params, kind)`` reads through the store's reader, writes through
    ``write`` (the collector's writer thread) and returns the report."""

    def __init__(
        self,
        schedules: list[ReportSchedule],
        store: Any,
        node: str,
        write: Callable[[Callable[[], Any]], Any],
        limits: ReportLimits | None = None,
    ) -> None:
        self.schedules = schedules
        self.store = store
        self.node = node
        self._write = write  # hands a job to the writer thread; returns a Future
        self._scheduler: Any = None
        self.runs = 0
        self.last_error: str | None = None
        self.limits = limits or ReportLimits()
        with store.reader() as cur:
            self.budget = ReportBudget(self.limits, stored_size(cur))

    def start(self) -> None:
        """Prune to the bounds (they may have been lowered since the last run), schedule every
        report, then catch up a run missed while the service was down."""
        try:
            self.budget.count(self._write(self._prune).result(timeout=WRITE_TIMEOUT_S))
        except Exception as e:  # logged and in /health; the reports are pruned after the next one
            self.last_error = f"pruning: {type(e).__name__}: {e}"
            log.exception("pruning the stored reports failed")
        if not self.schedules:
            return
        from apscheduler.schedulers.background import BackgroundScheduler

        self._scheduler = BackgroundScheduler(
            timezone=UTC, job_defaults={"coalesce": True, "max_instances": 1}
        )
        for s in self.schedules:
            self._scheduler.add_job(
                self._scheduled,
                s.trigger(),
                args=[s],
                id=f"report-{s.name}",
                name=f"{s.name} report",
                coalesce=True,
                misfire_grace_time=int(s.grace_s()),
            )
        self._scheduler.start()
        for s in self.schedules:
            due = self.missed_fire_s(s, time.time())
            if due is not None:
                self._scheduler.add_job(
                    self._scheduled, args=[s, due], id=f"catch-up-{s.name}", name="catch-up"
                )

    def stop(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None

    def next_runs(self) -> dict[str, float | None]:
        """Each schedule's next fire time (UTC epoch s), for /health."""
        if self._scheduler is None:
            return {}
        out = {}
        for s in self.schedules:
            job = self._scheduler.get_job(f"report-{s.name}")
            nxt = job.next_run_time if job is not None else None
            out[s.name] = nxt.timestamp() if nxt is not None else None
        return out

    def missed_fire_s(self, schedule: ReportSchedule, now_s: float) -> float | None:
        """The fire time to catch up at start (the misfire policy above), or None."""
        with self.store.reader() as cur:
            row = cur.execute("SELECT max(ts_s) FROM reports WHERE kind = ?", [schedule.name]).fetchone()
        last = row[0] if row else None
        if last is None:
            return None  # never ran here: nothing was missed
        grace = schedule.grace_s()
        # coalesce: the missed runs become one, for the latest; only fire times within the grace time
        # are listed (a seconds schedule down for a week has 600,000 fire times since its last run)
        recent = [
            f for f in schedule.fire_times_s(max(float(last), now_s - grace - 1), now_s) if now_s - f <= grace
        ]
        if recent:
            return recent[-1]
        missed = schedule.fire_times_s(float(last), now_s, limit=1)
        if missed:
            log.warning(
                "%s report missed since %s UTC by more than its grace time (%.0f s): skipped",
                schedule.name,
                _utc(missed[0]),
                grace,
            )
        return None

    def _scheduled(self, schedule: ReportSchedule, fire_s: float | None = None) -> None:
        end = fire_s if fire_s is not None else time.time()
        end = float(int(end))  # the fire time (a scheduled job starts a few ms after it)
        period = schedule.period_s(end)  # the period before it: that of a regular schedule
        params = {"dataset": "live", "start_s": end - period, "end_s": end}
        try:
            self.run(params, kind=schedule.name)
        except Exception as e:  # logged and counted (health), the scheduler carries on
            self.last_error = f"{schedule.name}: {type(e).__name__}: {e}"
            log.exception("%s report failed", schedule.name)

    def health(self) -> dict[str, Any]:
        """What /health says of the reports: schedules and their next run, runs, last error, what
        is stored against the bounds, what was pruned, and the manual reports' rate limit."""
        return {
            "schedules": {s.name: s.cron for s in self.schedules},
            "next_run_s": self.next_runs(),
            "runs": self.runs,
            "last_error": self.last_error,
        } | self.budget.health()

    def _prune(self) -> Pruned:
        with self.store.transaction() as con:
            return prune_reports(con, self.limits)

    def run(self, params: dict[str, Any], *, kind: str = MANUAL, title: str | None = None) -> Report:
        """Make one report of ``params`` now and store it, pruning the oldest beyond the bounds;
        ReportError for bad parameters, ReportTooLarge for a report larger than the byte bound."""
        with self.store.reader() as cur:
            report = build_report(cur, params, kind=kind, title=title)
        fut = self._write(lambda: save_report(self.store, report, self.node, self.limits))
        try:
            pruned = fut.result(timeout=WRITE_TIMEOUT_S)
        except ReportTooLarge:
            self.budget.count_too_large()
            raise
        self.budget.count(pruned)
        self.runs += 1
        return report


# -- HTTP ------------------------------------------------------------------------------------------------

_POST_FIELDS = {
    "since",
    "start_s",
    "end_s",
    "dataset",
    "node",
    "slo_ttft_ms",
    "slo_tpot_ms",
    "fleet_gpus",
    "title",
}


def add_report_routes(
    app: Any, collector: Any, scheduler: ReportScheduler, error: Callable[..., Any]
) -> None:
    """``GET /api/v1/reports`` (newest first, no bodies), ``GET /api/v1/reports/{id}?format=html|json``
    (the self-contained page, or the summary JSON) and ``POST /api/v1/reports`` (make one now: a
    JSON body of run_summary's parameters, e.g. ``{"since": "24h"}``; it needs the control token
    when the collector has one). ``error(status, message, param)`` makes the API's JSON errors."""
    import asyncio

    from fastapi import Request
    from fastapi.responses import HTMLResponse

    @app.get("/api/v1/reports")
    def reports(limit: int = 100, kind: str | None = None) -> Any:
        if not 1 <= limit <= 10_000:
            return error(400, f"limit must be in [1, 10000], got {limit}", "limit")
        listed = list_reports(collector.store, limit=limit, kind=kind)
        health = scheduler.budget.health()  # what is kept against the bounds, what was pruned
        return {"reports": listed} | {k: health[k] for k in ("stored", "max", "pruned")}

    @app.get("/api/v1/reports/{report_id}")
    def report(report_id: str, format: str = "html") -> Any:
        if format not in ("html", "json"):
            return error(400, f"format must be html or json, got {format!r}", "format")
        try:
            item = get_report(collector.store, report_id)
        except ReportError as e:
            return error(404, str(e), "report_id")
        if format == "json":
            item.pop("body", None)
            return item
        name = f"phaselens-report-{item['kind']}-{_utc(item['ts_s'], '%Y%m%dT%H%M')}.html"
        return HTMLResponse(
            standalone_html(item["body"] or ""), headers={"Content-Disposition": f'inline; filename="{name}"'}
        )

    async def make_report(request: Request) -> Any:
        from collector.api import control_post_body

        body = await control_post_body(request, collector.settings.control_token, '{"since": "24h"}')
        if not isinstance(body, dict):
            return body
        unknown = sorted(set(body) - _POST_FIELDS)
        if unknown:
            return error(
                400, f"unknown field(s) {', '.join(unknown)}; fields: {', '.join(sorted(_POST_FIELDS))}"
            )
        title = body.pop("title", None)
        budget = scheduler.budget
        wait_s = budget.admit_manual()
        if wait_s:
            return error(429, budget.refusal(wait_s), headers={"Retry-After": str(math.ceil(wait_s))})
        try:
            made = await asyncio.to_thread(scheduler.run, body, kind=MANUAL, title=title)
        except ReportTooLarge as e:
            return error(507, str(e))
        except ReportError as e:
            budget.manual.give_back()  # bad parameters made nothing
            return error(400, str(e), e.param)
        except Exception as e:  # the writer refused (stopping) or the store failed
            log.exception("report failed")
            return error(503, f"the report could not be stored: {type(e).__name__}: {e}")
        return {
            "report_id": made.report_id,
            "kind": made.kind,
            "title": made.title,
            "ts_s": made.ts_s,
            "start_s": made.start_s,
            "end_s": made.end_s,
            "error": made.error,
            "url": f"/api/v1/reports/{made.report_id}",
        }

    # this module's annotations are strings (postponed) and fastapi is imported here only, so that
    # the `phaselens` command does not pay for it: hand FastAPI the class itself
    make_report.__annotations__["request"] = Request
    app.post("/api/v1/reports")(make_report)
