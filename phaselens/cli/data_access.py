"""How a command reaches the data: a store file opened directly (``--db FILE``) or the running
collector's HTTP API (``--collector URL``), with the same errors whichever command asks.

The commands that make something from the store (report, workload, recommend, export, apply) open it
through :func:`open_store_file` and call the collector with :func:`control_headers`, reading its
errors with :func:`api_error_message`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collector.store import Store


def open_store_file(db: str, error: type[Exception], locked_hint: str, *, read_only: bool = False) -> Store:
    """The store file ``db`` opened, or ``error`` saying why not: no such file (a store that does not
    exist would be created empty), a running collector holds it (``locked_hint`` says what to do
    instead: "drop --db to read it through the collector"), or the store's own error."""
    from collector.store import Store, StoreError, StoreLockedError

    if not Path(db).is_file():
        raise error(f"--db {db}: no such store file")
    try:
        return Store.open(db, read_only=read_only)
    except StoreLockedError as e:
        raise error(f"{e}; a running collector holds it: {locked_hint}") from e
    except StoreError as e:
        raise error(str(e)) from e


def control_headers(token: str | None) -> dict[str, str]:
    """The collector's control token as a request header: ``token``, else ``$PHASELENS_CONTROL_TOKEN``;
    none when neither is set (the collector then answers 401 where a POST needs it)."""
    token = token or os.environ.get("PHASELENS_CONTROL_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def api_error_message(r: Any) -> str:
    """The message of the collector's error answer ``r`` (``{"error": {"message": ...}}``), else the
    first 300 characters of its body."""
    try:
        return str(r.json().get("error", {}).get("message", r.text[:300]))
    except ValueError:
        return r.text[:300]
