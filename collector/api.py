"""The collector's HTTP API: time-range reads of every table, latest values per device, health.

The dashboard, reports and CLI read the store only through here (DuckDB admits no second process
beside the writer).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pandas as pd
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from collector.service import Collector
from collector.store import StoreError
from collector.store.tables import TABLES

MAX_ROWS = 100_000


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """DataFrame rows as JSON-safe dicts (NaN/NaT → null)."""
    rows = df.astype(object).where(df.notna(), None).to_dict(orient="records")
    for row in rows:
        for k, v in row.items():
            if isinstance(v, float) and not math.isfinite(v):
                row[k] = None
            elif hasattr(v, "item"):  # numpy scalars
                row[k] = v.item()
    return rows


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


def create_collector_app(collector: Collector) -> FastAPI:
    """The app; the collector's threads run for the app's lifetime and are flushed at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        collector.start()
        try:
            yield
        finally:
            collector.stop()
            collector.store.close()

    app = FastAPI(title="phaselens collector", lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return collector.health()

    @app.get("/api/v1/tables")
    async def tables() -> dict[str, Any]:
        return {"tables": {name: {"time_column": spec.time_column} for name, spec in sorted(TABLES.items())}}

    @app.get("/api/v1/latest")
    async def latest(since_s: float | None = None) -> Any:
        try:
            return {"rows": _records(collector.store.latest_per_device(since_s=since_s))}
        except StoreError as e:
            return _error(400, str(e))

    @app.get("/api/v1/tables/{table}")
    async def table_range(
        table: str,
        start: float | None = None,
        end: float | None = None,
        device: str | None = None,
        node: str | None = None,
        limit: int = 10_000,
    ) -> Any:
        """Rows of `table` with time in [start, end) (UTC epoch seconds), oldest first."""
        if table not in TABLES:
            return _error(404, f"unknown table {table!r}; tables: {', '.join(sorted(TABLES))}")
        if not 1 <= limit <= MAX_ROWS:
            return _error(400, f"limit must be in [1, {MAX_ROWS}], got {limit}")
        try:
            df = collector.store.range(table, start, end, device=device, node=node, limit=limit)
        except StoreError as e:
            return _error(400, str(e))
        return {"table": table, "rows": _records(df), "truncated": len(df) == limit}

    return app
