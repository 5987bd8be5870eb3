"""The few in-place updates the store allows: the status of a recommendation, the outcome of an
audited action (``actions``: planned → applied | failed | rolled_back, ``after``, ``message``,
``rolled_back``/``rolled_back_at_s``) and the status of a power calibration (current → stale when
the stack's fingerprint no longer matches). Every other table is append-only.

Each update is one transaction on the writer (:meth:`Store.transaction`: the buffered appends are
flushed first, so a row appended a moment ago can be updated), and checks the table, the columns
and the row: an unknown one is a StoreError naming what is allowed, and nothing is written.
"""

from __future__ import annotations

import json
from typing import Any

from collector.store.errors import StoreError

# table -> (id column, columns that may change)
UPDATABLE: dict[str, tuple[str, frozenset[str]]] = {
    "recommendations": ("recommendation_id", frozenset({"status", "details"})),
    "actions": ("action_id", frozenset({"status", "after", "message", "rolled_back", "rolled_back_at_s"})),
    "power_calibrations": ("calibration_id", frozenset({"status"})),
}
_JSON = {"details", "after"}
RECOMMENDATION_STATUSES = ("proposed", "applied", "rolled_back", "dismissed", "superseded")
ACTION_STATUSES = ("planned", "applied", "failed", "rolled_back")
CALIBRATION_STATUSES = ("current", "stale", "incomplete")
_STATUSES = {
    "recommendations": RECOMMENDATION_STATUSES,
    "actions": ACTION_STATUSES,
    "power_calibrations": CALIBRATION_STATUSES,
}


def update_row(store: Any, table: str, row_id: str, values: dict[str, Any]) -> None:
    """Set ``values`` on the row of ``table`` whose id is ``row_id`` (StoreError if there is none)."""
    if table not in UPDATABLE:
        raise StoreError(f"table {table!r} is append-only; updatable: {', '.join(UPDATABLE)}")
    id_col, allowed = UPDATABLE[table]
    unknown = set(values) - allowed
    if unknown or not values:
        raise StoreError(
            f"cannot update {sorted(unknown) or 'nothing'} of {table}; allowed: {sorted(allowed)}"
        )
    status = values.get("status")
    statuses = _STATUSES[table]
    if "status" in values and status not in statuses:
        raise StoreError(f"status {status!r} of {table}; allowed: {', '.join(statuses)}")
    cols = sorted(values)
    params = [json.dumps(values[c], separators=(",", ":")) if c in _JSON else values[c] for c in cols]
    sets = ", ".join(f"{c} = ?" for c in cols)
    with store.transaction() as con:
        found = con.execute(f"SELECT count(*) FROM {table} WHERE {id_col} = ?", [row_id]).fetchone()[0]
        if not found:
            raise StoreError(f"no {table} row {row_id!r}")
        con.execute(f"UPDATE {table} SET {sets} WHERE {id_col} = ?", [*params, row_id])


def set_recommendation_status(store: Any, recommendation_id: str, status: str) -> None:
    """A recommendation becomes applied, rolled_back, dismissed or superseded (or proposed again)."""
    update_row(store, "recommendations", recommendation_id, {"status": status})
