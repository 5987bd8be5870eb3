"""What an analysis looks at: a data set (live rows, or one simulated scenario) over a time window.

Analytics are plain functions over a DuckDB connection (a cursor of the store's writer connection in
the service, or a read-only connection to a file); every one of them takes a :class:`Window`.

* ``dataset="live"``: every node that is not a simulated scenario (``node`` not ``sim:*``) —
  measured and emulated rows; the two are told apart per row by ``trust_label``.
* ``dataset=<scenario_id>``: the rows of that scenario only (``node = 'sim:<scenario_id>'``).

Simulated and live rows are never mixed in one result. ``nodes`` narrows a live window further.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb

LIVE = "live"
SIM_PREFIX = "sim:"


class AnalyticsError(ValueError):
    """An analysis cannot run as asked (unknown data set, empty or inverted window, ...); the
    message says what was wrong and what is allowed; ``param``, when known, is the request
    parameter it was about (an API names it in its error)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Window:
    """``[start_s, end_s)`` in UTC epoch seconds of one data set."""

    start_s: float
    end_s: float
    dataset: str = LIVE
    nodes: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start_s) and math.isfinite(self.end_s)):
            raise AnalyticsError(
                f"window bounds must be finite epoch seconds, got {self.start_s}, {self.end_s}"
            )
        if self.end_s <= self.start_s:
            raise AnalyticsError(
                f"window end {utc(self.end_s)} ({self.end_s:.3f} s) is not after its start "
                f"{utc(self.start_s)} ({self.start_s:.3f} s)"
            )

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def simulated(self) -> bool:
        return self.dataset != LIVE

    def node_sql(self, column: str = "node") -> tuple[str, list[Any]]:
        """A SQL predicate (with ``?`` parameters) selecting this window's nodes in ``column``."""
        if self.simulated:
            return f"{column} = ?", [SIM_PREFIX + self.dataset]
        clause = f"NOT starts_with({column}, '{SIM_PREFIX}')"
        if self.nodes:
            marks = ", ".join("?" for _ in self.nodes)
            return f"{clause} AND {column} IN ({marks})", list(self.nodes)
        return clause, []

    def label(self) -> str:
        """The window for a message: its data set and UTC times (``live, 2026-12-02 04:15:46 –
        04:30:46 UTC``); JSON keeps the epoch seconds (:meth:`describe`)."""
        return f"{self.dataset}, {utc(self.start_s)} – {utc(self.end_s, same_day_as=self.start_s)}"

    def describe(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "duration_s": self.duration_s,
            "nodes": list(self.nodes) if self.nodes else None,
        }


def utc(ts_s: float, *, same_day_as: float | None = None) -> str:
    """Epoch seconds as a UTC time for people: ``2026-12-02 04:15:46 UTC``; only ``04:30:46 UTC``
    when ``same_day_as`` falls on the same UTC day. Times that are not finite, or beyond what the
    platform's calendar holds (``9e18``), are shown as given: a message never fails on its time."""
    if ts_s is None or not math.isfinite(ts_s):
        return str(ts_s)
    try:
        t = time.gmtime(ts_s)
    except (OverflowError, OSError, ValueError):
        return f"{ts_s:g} s"
    try:
        same = (
            same_day_as is not None and math.isfinite(same_day_as) and time.gmtime(same_day_as)[:3] == t[:3]
        )
    except (OverflowError, OSError, ValueError):
        same = False
    if same:
        return time.strftime("%H:%M:%S UTC", t)
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", t)


#: 2000-01-01 00:00:00 UTC: a window time before it is a typo (a span, a negative number), not data
EARLIEST_S = 946_684_800.0
#: 9999-12-31 23:59:59 UTC: the last time any time parameter may name (the calendar's end)
LATEST_S = 253_402_300_799.0
#: the longest time span a window may have: 36500 days (100 years; a window starts from 2000 on anyway)
MAX_SPAN_S = 36_500 * 86_400.0
_SPAN_EXAMPLES = "e.g. 90s, 30m, 1h or 2d"


def parse_span_s(text: str, name: str | None = None) -> float:
    """``90s``, ``30m``, ``1h``, ``2d`` or plain seconds → seconds in ``(0, MAX_SPAN_S]``;
    AnalyticsError naming the format and the range otherwise (``param`` and the message name
    ``name``, the request parameter, when given)."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    t = str(text).strip().lower()
    shown = f"{name}={text!r}" if name else repr(text)
    at_most = f"at most {MAX_SPAN_S / 86400:.0f}d ({MAX_SPAN_S:.0f} s)"
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except (ValueError, KeyError, OverflowError):
        raise AnalyticsError(f"{shown} is not a time span; use {_SPAN_EXAMPLES}, {at_most}", name) from None
    if not math.isfinite(value) or not 0 < value <= MAX_SPAN_S:
        raise AnalyticsError(f"time span {shown} must be > 0 and {at_most}; use {_SPAN_EXAMPLES}", name)
    return value


def epoch_s(
    name: str, raw: Any, *, earliest_s: float = EARLIEST_S, since: str = "since=SPAN"
) -> float | None:
    """A time parameter (``start_s``, ``end_s``, the tables' ``start`` / ``end``, a CLI flag) as UTC
    epoch seconds: None when not given, else a finite number in ``[earliest_s, LATEST_S]``.
    AnalyticsError (``param`` = ``name``) names the parameter, the value and what is allowed; every
    endpoint and the CLI check their times here, so they accept and refuse the same values."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError, OverflowError):
        value = math.nan
    if math.isfinite(value) and earliest_s <= value <= LATEST_S:
        return value
    first = "2000 on (946684800)" if earliest_s == EARLIEST_S else f"{earliest_s:.0f} ({utc(earliest_s)})"
    allowed = (
        f"UTC epoch seconds from {first} up to {LATEST_S:.0f} ({utc(LATEST_S)}), e.g. {time.time():.0f} (now)"
    )
    if not math.isfinite(value):
        raise AnalyticsError(f"{name} must be finite {allowed}; got {raw!r}", name)
    if value > LATEST_S:
        raise AnalyticsError(f"{name} {value:g} is after {utc(LATEST_S)}: give {allowed}", name)
    also = f", or {since} for the last SPAN" if earliest_s > 0 else ""  # a span where a time belongs
    raise AnalyticsError(f"{name} {value:g} is {utc(value)}: give {allowed}{also}", name)


def check_epoch_s(name: str, value: float | None, since: str = "--since SPAN") -> None:
    """AnalyticsError unless ``value`` (``--start-s`` / ``--end-s`` given by a person, or the API's
    ``start_s`` / ``end_s``) is None or a finite UTC epoch time from 2000 to 9999 (:func:`epoch_s`);
    ``since`` is how the caller's user asks for a span instead."""
    epoch_s(name, value, since=since)


def check_window_start(window: Window, *, param: str) -> None:
    """AnalyticsError (naming ``param``: ``since``, or ``end_s`` with the default span) when a
    window counted back from its end would start before 2000, the earliest time a window holds."""
    if window.start_s < EARLIEST_S:
        raise AnalyticsError(
            f"{param}: the window would start at {utc(window.start_s)}, before {utc(EARLIEST_S)} "
            f"(the earliest a window may start): give a span of at most "
            f"{max(window.end_s - EARLIEST_S, 0) / 86400:.0f}d before its end, or start_s",
            param,
        )


def scenarios(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """The stored simulated scenarios, newest first: id, name, model, gpu, start_s, end_s."""
    rows = con.execute(
        "SELECT scenario_id, name, model, gpu, start_s, end_s FROM scenarios ORDER BY created_s DESC"
    ).fetchall()
    keys = ("scenario_id", "name", "model", "gpu", "start_s", "end_s")
    return [dict(zip(keys, r, strict=True)) for r in rows]


def resolve_window(
    con: duckdb.DuckDBPyConnection,
    *,
    dataset: str = LIVE,
    since_s: float | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
    nodes: Sequence[str] | None = None,
    now_s: float | None = None,
) -> Window:
    """The window asked for. A live window defaults to the last hour up to now; a scenario's to its
    whole span (``since_s`` then counts back from the scenario's end, not from now)."""
    if dataset != LIVE:
        row = con.execute("SELECT start_s, end_s FROM scenarios WHERE scenario_id = ?", [dataset]).fetchone()
        if row is None:
            known = ", ".join(s["scenario_id"] for s in scenarios(con)[:10]) or "none stored"
            raise AnalyticsError(
                f"unknown data set {dataset!r}; use 'live', 'latest' or a scenario id ({known})", "dataset"
            )
        if nodes:
            raise AnalyticsError("nodes narrow a live window; a scenario is one node of its own", "node")
        s0, s1 = float(row[0]), float(row[1])
        end = s1 + 1e-6 if end_s is None else end_s  # the last sample and token lie at end_s itself
        start = start_s if start_s is not None else (end - since_s if since_s is not None else s0)
        return Window(start, end if end > start else start + 1e-9, dataset)
    now = time.time() if now_s is None else now_s
    end = now if end_s is None else end_s
    start = start_s if start_s is not None else end - (since_s if since_s is not None else 3600.0)
    return Window(start, end, LIVE, tuple(nodes) if nodes else None)
