"""Bounds on efficiency reports: how many the store keeps and how many bytes they take (the oldest
pruned first, every prune counted), and how fast ``POST /api/v1/reports`` makes them (a token
bucket: a burst, then a steady rate; beyond it a 429 with ``Retry-After``).

A report's size is its stored row: the page's HTML (without Plotly's script) plus its JSON details
(the summary, the overview, the histogram). Scheduled reports are not rate-limited; they count
against the storage bounds like manual ones, so a flood of manual reports prunes the oldest reports
of any kind but never stops the schedules.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: the scheduled reports of ``phaselens collect`` without ``--report-schedule`` (phaselens/reports.py)
DEFAULT_SCHEDULES = ("hourly=0 * * * *", "daily=0 6 * * *")
DEFAULT_MAX_REPORTS = 2_000  # ~80 days of the default hourly + daily schedules
DEFAULT_MAX_REPORT_MIB = 512.0
DEFAULT_REPORT_BURST = 5  # manual reports made at once before the rate applies
DEFAULT_REPORTS_PER_MIN = 2.0  # the steady rate of manual reports after a burst
MIN_BYTES = round(0.01 * 2**20)  # the smallest byte bound (--report-max-mib 0.01)

#: a report row's stored bytes in SQL (``strlen`` counts bytes; the JSON column as its text)
ROW_BYTES_SQL = "coalesce(strlen(body), 0) + coalesce(strlen(CAST(details AS VARCHAR)), 0)"


@dataclass(frozen=True, slots=True)
class ReportLimits:
    """The bounds of ``phaselens collect --report-max-count/--report-max-mib/--report-burst/
    --report-rate-per-min``; ValueError naming the flag when one is out of range."""

    max_count: int = DEFAULT_MAX_REPORTS
    max_bytes: int = int(DEFAULT_MAX_REPORT_MIB * 2**20)
    burst: int = DEFAULT_REPORT_BURST
    per_min: float = DEFAULT_REPORTS_PER_MIN

    def __post_init__(self) -> None:
        if not 1 <= self.max_count <= 10_000_000:
            raise ValueError(f"--report-max-count must be in [1, 10000000] reports, got {self.max_count}")
        if not MIN_BYTES <= self.max_bytes <= 2**40:
            raise ValueError(
                f"--report-max-mib must be in [0.01, 1048576] MiB, got {self.max_bytes / 2**20:g}"
            )
        if not 1 <= self.burst <= 1000:
            raise ValueError(f"--report-burst must be in [1, 1000] reports, got {self.burst}")
        if not (math.isfinite(self.per_min) and 0.001 <= self.per_min <= 600):
            raise ValueError(
                f"--report-rate-per-min must be in [0.001, 600] reports a minute, got {self.per_min:g}"
            )


@dataclass(frozen=True, slots=True)
class Pruned:
    """What one prune deleted (the oldest reports beyond the bounds) and what the store then holds."""

    count: int
    bytes: int
    kept_count: int
    kept_bytes: int


def size_text(n_bytes: float) -> str:
    """Bytes for a message: ``12.3 KiB``, ``4.56 MiB``."""
    return f"{n_bytes / 2**20:.2f} MiB" if n_bytes >= 2**20 else f"{n_bytes / 1024:.1f} KiB"


def stored_size(con: Any) -> tuple[int, int]:
    """``(reports, bytes)`` the store holds."""
    n, size = con.execute(f"SELECT count(*), coalesce(sum({ROW_BYTES_SQL}), 0) FROM reports").fetchone()
    return int(n), int(size)


def prune_reports(con: Any, limits: ReportLimits) -> Pruned:
    """Delete the oldest reports until at most ``limits.max_count`` are kept, of at most
    ``limits.max_bytes`` together (newest first: a report is kept while it and every newer one fit).
    ``con`` is the writer's connection inside a transaction (``Store.transaction``)."""
    doomed = con.execute(
        f"""
        WITH sized AS (SELECT report_id, ts_s, {ROW_BYTES_SQL} AS bytes FROM reports),
        ranked AS (
            SELECT report_id, bytes,
                   row_number() OVER newest AS rank,
                   sum(bytes) OVER (newest ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS upto
            FROM sized
            WINDOW newest AS (ORDER BY ts_s DESC, report_id DESC)
        )
        SELECT report_id, bytes FROM ranked WHERE rank > ? OR upto > ?
        """,
        [limits.max_count, limits.max_bytes],
    ).fetchall()
    if doomed:
        con.execute("DELETE FROM reports WHERE list_contains(?, report_id)", [[r[0] for r in doomed]])
    kept_count, kept_bytes = stored_size(con)
    return Pruned(len(doomed), sum(int(r[1]) for r in doomed), kept_count, kept_bytes)


class TokenBucket:
    """``burst`` tokens, refilled at ``per_s``; :meth:`take` spends one or says how long to wait."""

    def __init__(self, burst: int, per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.per_s = per_s
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.per_s)
        self._at = now

    def take(self) -> float:
        """0 when a token was spent, else the seconds until one is there (none spent)."""
        with self._lock:
            self._refill()
            if self._tokens >= 1:
                self._tokens -= 1
                return 0.0
            return (1 - self._tokens) / self.per_s

    def give_back(self) -> None:
        """Return a token spent on a request that made nothing (bad parameters)."""
        with self._lock:
            self._refill()
            self._tokens = min(float(self.burst), self._tokens + 1)


class ReportBudget:
    """A collector's bounds on its reports and what they did since start: the manual reports'
    token bucket (and how many it refused), what is stored, what was pruned, what was too large.
    Thread-safe: the scheduler, the API's threads and the writer's results all count here."""

    def __init__(self, limits: ReportLimits, stored: tuple[int, int] = (0, 0)) -> None:
        self.limits = limits
        self.manual = TokenBucket(limits.burst, limits.per_min / 60)  # POST /api/v1/reports
        self.refused = 0  # manual requests refused (429)
        self.stored, self.stored_bytes = stored
        self.pruned = self.pruned_bytes = 0  # reports deleted to keep within the bounds
        self.too_large = 0  # reports not stored: alone larger than the byte bound
        self._lock = threading.Lock()

    def admit_manual(self) -> float:
        """0 when a manual report may be made now, else the seconds to wait (counted as refused)."""
        wait_s = self.manual.take()
        if wait_s:
            with self._lock:
                self.refused += 1
        return wait_s

    def refusal(self, wait_s: float) -> str:
        """The message of a 429."""
        lim = self.limits
        return (
            f"too many manual reports: {lim.burst} at once, then {lim.per_min:g} a minute "
            f"(phaselens collect --report-burst, --report-rate-per-min); try again in {math.ceil(wait_s)} s"
        )

    def count(self, pruned: Pruned | None) -> None:
        """Count a prune (after a report was stored, or at start)."""
        if pruned is None:
            return
        with self._lock:
            self.pruned += pruned.count
            self.pruned_bytes += pruned.bytes
            self.stored, self.stored_bytes = pruned.kept_count, pruned.kept_bytes
        if pruned.count:
            log.info(
                "pruned the %d oldest reports (%s) to keep within the bounds",
                pruned.count,
                size_text(pruned.bytes),
            )

    def count_too_large(self) -> None:
        with self._lock:
            self.too_large += 1

    def health(self) -> dict[str, Any]:
        """``stored``, ``max``, ``pruned``, ``too_large``, ``manual_rate`` for /health and the list."""
        lim = self.limits
        return {
            "stored": {"count": self.stored, "bytes": self.stored_bytes},
            "max": {"count": lim.max_count, "bytes": lim.max_bytes},
            "pruned": {"count": self.pruned, "bytes": self.pruned_bytes},
            "too_large": self.too_large,
            "manual_rate": {"burst": lim.burst, "per_min": lim.per_min, "refused": self.refused},
        }
