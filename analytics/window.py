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
    when ``same_day_as`` falls on the same UTC day. Times that are not finite are shown as given."""
    if ts_s is None or not math.isfinite(ts_s):
        return str(ts_s)
    t = time.gmtime(ts_s)
    if same_day_as is not None and math.isfinite(same_day_as) and time.gmtime(same_day_as)[:3] == t[:3]:
        return time.strftime("%H:%M:%S UTC", t)
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", t)


def parse_span_s(text: str) -> float:
    """``90s``, ``30m``, ``1h``, ``2d`` or plain seconds → seconds; AnalyticsError naming the format."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except (ValueError, KeyError):
        raise AnalyticsError(f"{text!r} is not a time span; use e.g. 90s, 30m, 1h or 2d") from None
    if not math.isfinite(value):
        raise AnalyticsError(f"time span {text!r} must be finite; use e.g. 90s, 30m, 1h or 2d")
    if value <= 0:
        raise AnalyticsError(f"time span {text!r} must be > 0")
    return value


#: 2000-01-01 00:00:00 UTC: a window time before it is a typo (a span, a negative number), not data
EARLIEST_S = 946_684_800.0


def check_epoch_s(name: str, value: float | None, since: str = "--since SPAN") -> None:
    """AnalyticsError unless ``value`` (``--start-s`` / ``--end-s`` given by a person, or the API's
    ``start_s`` / ``end_s``) is None or a finite UTC epoch time from 2000 on; ``since`` is how the
    caller's user asks for a span instead."""
    if value is None:
        return
    if not math.isfinite(value):
        raise AnalyticsError(f"{name} must be finite UTC epoch seconds, got {value}")
    if value < EARLIEST_S:
        raise AnalyticsError(
            f"{name} {value:g} is {utc(value)}: give UTC epoch seconds from 2000 on "
            f"(e.g. {time.time():.0f} is now), or {since} for the last SPAN"
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
            raise AnalyticsError(f"unknown data set {dataset!r}; use 'live' or a scenario id ({known})")
        if nodes:
            raise AnalyticsError("nodes narrow a live window; a scenario is one node of its own")
        s0, s1 = float(row[0]), float(row[1])
        end = s1 + 1e-6 if end_s is None else end_s  # the last sample and token lie at end_s itself
        start = start_s if start_s is not None else (end - since_s if since_s is not None else s0)
        return Window(start, end if end > start else start + 1e-9, dataset)
    now = time.time() if now_s is None else now_s
    end = now if end_s is None else end_s
    start = start_s if start_s is not None else end - (since_s if since_s is not None else 3600.0)
    return Window(start, end, LIVE, tuple(nodes) if nodes else None)
