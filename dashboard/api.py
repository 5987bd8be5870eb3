"""The dashboard's only way to data: an HTTP client of the collector's API.

The dashboard never opens the DuckDB file (the collector is its only writer and DuckDB admits no
reader beside it) and never talks to the serving stack; everything it shows comes through
``phaselens collect``'s HTTP API (``collector/api.py`` and ``phaselens/api.py``). The base URL is
``$PHASELENS_API_URL`` (default ``http://127.0.0.1:8900``).

Control requests (POST: make a report or a recommendation, apply, roll back) carry the collector's
control token as ``Authorization: Bearer`` when the dashboard has one: ``$PHASELENS_CONTROL_TOKEN``
(``phaselens demo`` gives the dashboard its run's token this way), or one typed on a page
(``CollectorApi(token=...)``). The GETs never send it.

Errors: :class:`ServiceUnavailable` when the collector cannot be reached (not running, wrong URL,
timed out), :class:`ApiError` when it answered with an error (its JSON ``error.message``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import httpx
import pandas as pd

DEFAULT_URL = "http://127.0.0.1:8900"
API_URL_ENV = "PHASELENS_API_URL"
TOKEN_ENV = "PHASELENS_CONTROL_TOKEN"
PAGE_ROWS = 100_000  # the collector's MAX_ROWS: the most one table read returns
# Time column of the tables the dashboard reads (GET /api/v1/tables says the same).
TIME_COLUMNS = {
    "gpu_samples": "ts_s",
    "gpu_samples_10s": "bucket_start_s",
    "devices": "since_s",
    "iterations": "start_s",
    "requests": "arrival_s",
    "ingest_errors": "ts_s",
    "telemetry_gaps": "detected_at_s",
    "reports": "ts_s",
}


class ServiceUnavailable(Exception):
    """The collector's API could not be reached at ``url`` (``reason`` says why)."""

    def __init__(self, url: str, reason: str, *, bad_url: bool = False) -> None:
        super().__init__(f"the phaselens collector at {url} is unreachable: {reason}")
        self.url = url
        self.reason = reason
        self.bad_url = bad_url  # the URL itself is wrong (no http:// or https://), not the service


class ApiError(Exception):
    """The collector answered a request with an error (``status``; the message is its own)."""

    def __init__(self, path: str, status: int, message: str, method: str = "GET") -> None:
        super().__init__(f"{method} {path} answered {status}: {message}")
        self.method = method
        self.path = path
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class TableRead:
    """Rows of one table read (possibly several pages); ``truncated``: more rows were in the range."""

    rows: pd.DataFrame
    truncated: bool


def control_token() -> str | None:
    """The control token the dashboard sends with its POSTs: ``$PHASELENS_CONTROL_TOKEN``, or None."""
    return os.environ.get(TOKEN_ENV) or None


def api_url() -> str:
    """The collector's base URL: ``$PHASELENS_API_URL`` or the default, without a trailing slash."""
    return (os.environ.get(API_URL_ENV) or DEFAULT_URL).rstrip("/")


class CollectorApi:
    """Reads of the collector's HTTP API. ``timeout_s`` bounds connecting; ``read_timeout_s`` a
    whole answer (a 100,000-row page or an analytics summary takes seconds on a large store)."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        timeout_s: float = 3.0,
        read_timeout_s: float = 60.0,
        token: str | None = None,
    ) -> None:
        self.base_url = (base_url or api_url()).rstrip("/")
        self.token = token if token is not None else control_token()
        timeout = httpx.Timeout(read_timeout_s, connect=timeout_s)
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout)

    def close(self) -> None:
        self._client.close()

    def _request(
        self,
        method: str,
        path: str,
        params: dict[str, Any] | None,
        body: Any = None,
        *,
        read_timeout_s: float | None = None,
    ) -> httpx.Response:
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        headers = {"Authorization": f"Bearer {self.token}"} if self.token and method != "GET" else None
        extra: dict[str, Any] = {}
        if read_timeout_s is not None:
            extra["timeout"] = httpx.Timeout(read_timeout_s, connect=self._client.timeout.connect)
        try:
            r = self._client.request(method, path, params=clean, json=body, headers=headers, **extra)
        except httpx.UnsupportedProtocol as e:
            raise ServiceUnavailable(self.base_url, str(e), bad_url=True) from e
        except httpx.TimeoutException as e:
            raise ServiceUnavailable(self.base_url, f"no answer to {method} {path} in time ({e})") from e
        except httpx.HTTPError as e:
            raise ServiceUnavailable(self.base_url, f"{type(e).__name__}: {e}") from e
        if not 200 <= r.status_code < 300:  # an apply answers 202 (accepted, running)
            try:
                err = r.json().get("error")
            except (ValueError, AttributeError):
                err = None
            message = err.get("message") if isinstance(err, dict) else r.text[:300]
            raise ApiError(path, r.status_code, str(message), method)
        return r

    def _json(self, r: httpx.Response, path: str) -> Any:
        try:
            return r.json()
        except ValueError:
            raise ApiError(path, r.status_code, f"not JSON: {r.text[:200]!r}") from None

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """GET ``path`` → its JSON; ServiceUnavailable / ApiError as documented above."""
        return self._json(self._request("GET", path, params), path)

    def post(self, path: str, body: dict[str, Any], *, read_timeout_s: float | None = None) -> Any:
        """POST a JSON body to ``path`` (with the control token when there is one) → the JSON answer."""
        return self._json(self._request("POST", path, None, body, read_timeout_s=read_timeout_s), path)

    # -- endpoints -------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``GET /health``: the service, its writer and every source's status."""
        return self.get("/health")

    def scenarios(self) -> list[dict[str, Any]]:
        """``GET /api/v1/scenarios``: the simulated scenarios, newest first."""
        return self.get("/api/v1/scenarios")["scenarios"]

    def summary(self, **params: Any) -> dict[str, Any]:
        """``GET /api/v1/analytics/summary`` with its query parameters (dataset, since, start_s, ...)."""
        return self.get("/api/v1/analytics/summary", params)

    def histogram(self, **params: Any) -> dict[str, Any]:
        """``GET /api/v1/analytics/histogram``: binned SM activity and utilization % per pool (the
        summary's window parameters plus ``bin_pct``)."""
        return self.get("/api/v1/analytics/histogram", params)

    def gpu_series(self, **params: Any) -> dict[str, Any]:
        """``GET /api/v1/analytics/gpu-series``: per-GPU means of the GPU metrics per time bucket,
        computed by the service (the summary's window parameters plus ``max_points``)."""
        return self.get("/api/v1/analytics/gpu-series", params)

    def overview(self, **params: Any) -> dict[str, Any]:
        """``GET /api/v1/analytics/overview``: headline figures of a window and of the period
        before it (the summary's query parameters)."""
        return self.get("/api/v1/analytics/overview", params)

    def reports(self, *, limit: int = 200, kind: str | None = None) -> list[dict[str, Any]]:
        """``GET /api/v1/reports``: stored reports, newest first, without their pages."""
        return self.get("/api/v1/reports", {"limit": limit, "kind": kind})["reports"]

    def report_page(self, report_id: str) -> str:
        """The self-contained HTML page of a report (Plotly inlined)."""
        return self._request("GET", f"/api/v1/reports/{report_id}", {"format": "html"}).text

    def report_json(self, report_id: str) -> dict[str, Any]:
        """A report's fields and summary JSON (no page)."""
        return self.get(f"/api/v1/reports/{report_id}", {"format": "json"})

    def make_report(self, **params: Any) -> dict[str, Any]:
        """``POST /api/v1/reports``: have the service make (and store) a report now."""
        return self.post("/api/v1/reports", {k: v for k, v in params.items() if v is not None})

    # -- recommendations, apply, the audit (docs/RECOMMENDATIONS.md) ------------------------------

    def recommendations(self, *, status: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """``GET /api/v1/recommendations``: stored layout recommendations, newest first, no details."""
        return self.get("/api/v1/recommendations", {"status": status, "limit": limit})["recommendations"]

    def recommendation(self, recommendation_id: str) -> dict[str, Any]:
        """``GET /api/v1/recommendations/{id}``: one recommendation with its details."""
        return self.get(f"/api/v1/recommendations/{recommendation_id}")

    def make_recommendation(self, body: dict[str, Any], *, read_timeout_s: float = 900.0) -> dict[str, Any]:
        """``POST /api/v1/recommendations``: have the service search and store one now (a minute or
        more for an hour of traffic: the read waits up to ``read_timeout_s``)."""
        return self.post("/api/v1/recommendations", body, read_timeout_s=read_timeout_s)

    def save_workload(self, **params: Any) -> dict[str, Any]:
        """``POST /api/v1/workload``: observe a window's workload, synthesize a trace that follows it,
        store both descriptions; the answer (``observed``, ``synthesized``, ``synthesis``, ``window``)
        with their ids (``observed_id``, ``synthesized_id``)."""
        body = {k: v for k, v in params.items() if v is not None}
        return self.post("/api/v1/workload", body, read_timeout_s=300.0)

    def apply(self, recommendation_id: str, *, dry_run: bool = True, **options: Any) -> dict[str, Any]:
        """``POST /api/v1/recommendations/{id}/apply``: the plan (a dry run by default: nothing
        changes) or the start of its execution; the plan, its action ids and the guard."""
        body = {"dry_run": dry_run} | {k: v for k, v in options.items() if v is not None}
        return self.post(f"/api/v1/recommendations/{recommendation_id}/apply", body, read_timeout_s=300.0)

    def rollback(self, ref: str) -> dict[str, Any]:
        """``POST /api/v1/actions/{id}/rollback`` (an action or recommendation id): back to the
        layout from before its apply."""
        return self.post(f"/api/v1/actions/{ref}/rollback", {}, read_timeout_s=600.0)

    def actions(self, *, recommendation_id: str | None = None, limit: int = 1000) -> dict[str, Any]:
        """``GET /api/v1/actions``: the audit rows (oldest first), the running apply's progress
        (``running``), the last outcome (``last``) and the auto-apply policy (``auto_apply``)."""
        return self.get("/api/v1/actions", {"recommendation_id": recommendation_id, "limit": limit})

    # -- power calibrations (docs/POWER.md, "Power page") -------------------------------------------

    def power_calibrations(
        self,
        *,
        target: str | None = None,
        role: str | None = None,
        status: str | None = None,
        limit: int = 100,
    ) -> dict[str, Any]:
        """``GET /api/v1/power/calibrations``: the stored calibrations, newest first, each with its
        modes' settings and annual savings, confidence and whether it is stale (``calibrations``,
        ``prices``)."""
        return self.get(
            "/api/v1/power/calibrations", {"target": target, "role": role, "status": status, "limit": limit}
        )

    def power_calibration(self, calibration_id: str) -> dict[str, Any]:
        """``GET /api/v1/power/calibrations/{id}``: one calibration, as the list shows it."""
        return self.get(f"/api/v1/power/calibrations/{calibration_id}")

    def table(
        self,
        table: str,
        start_s: float | None = None,
        end_s: float | None = None,
        *,
        node: str | None = None,
        max_rows: int = PAGE_ROWS,
    ) -> TableRead:
        """Rows of ``table`` with time in ``[start_s, end_s)``, oldest first, read in pages of up to
        100,000 rows until ``max_rows``; ``truncated`` when the range held more."""
        time_col = TIME_COLUMNS.get(table)
        frames: list[pd.DataFrame] = []
        got, start, truncated = 0, start_s, False
        while True:
            limit = max(1, min(PAGE_ROWS, max_rows - got))
            body = self.get(
                f"/api/v1/tables/{table}", {"start": start, "end": end_s, "node": node, "limit": limit}
            )
            page = pd.DataFrame(body["rows"])
            more = bool(body.get("truncated"))
            if not more or time_col is None or page.empty or got + len(page) >= max_rows:
                frames.append(page)
                truncated = more
                break
            # next page from the last time read; rows at that very time come again with it
            last = page[time_col].iloc[-1]
            if page[time_col].iloc[0] == last:  # a whole page at one instant: cannot page on
                frames.append(page)
                truncated = True
                break
            page = page[page[time_col] < last]
            frames.append(page)
            got += len(page)
            start = float(last)
        rows = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        return TableRead(rows, truncated)
