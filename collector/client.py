"""Asking a running collector to merge a Parquet export (``POST /api/v1/import``).

A process with rows for a store that a collector holds (DuckDB admits one writing process), e.g.
``phaselens simulate``, writes them to a store of its own, exports it with
``collector.store.export_parquet`` and hands the directory to the collector with
:func:`import_into_collector`; the collector's writer thread merges it in one transaction.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx


class CollectorImportError(Exception):
    """The collector refused or failed the import (nothing was imported); ``status`` is the HTTP
    status (None when the collector could not be reached)."""

    def __init__(self, message: str, status: int | None) -> None:
        super().__init__(message)
        self.status = status


def import_into_collector(
    url: str, export_dir: str | Path, *, token: str | None = None, timeout_s: float = 660.0
) -> dict[str, Any]:
    """Have the collector at ``url`` merge ``export_dir`` (``phaselens store export``'s layout).

    ``token`` is the collector's control token (default: ``$PHASELENS_CONTROL_TOKEN``). Returns the
    response: ``{"path", "schema_version", "tables": {table: {"inserted", "duplicates"}},
    "inserted", "duplicates", "ignored_columns"}``. CollectorImportError names the collector's
    reason otherwise (no token configured, wrong token, not an export, newer schema, ...).
    """
    token = token or os.environ.get("PHASELENS_CONTROL_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    endpoint = f"{url.rstrip('/')}/api/v1/import"
    try:
        r = httpx.post(
            endpoint, json={"path": str(Path(export_dir).resolve())}, headers=headers, timeout=timeout_s
        )
    except httpx.HTTPError as e:
        raise CollectorImportError(f"cannot reach the collector at {endpoint}: {e}", None) from e
    try:
        body = r.json()
    except ValueError:
        body = None
    if r.status_code != 200 or not isinstance(body, dict):
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else r.text[:500]
        raise CollectorImportError(f"{endpoint} answered {r.status_code}: {message}", r.status_code)
    return body
