"""The audit trail: ``actions`` rows for every planned, applied, failed or rolled-back step, guard
window and decision, and the recommendation's status — written on the store's writer (the
collector's writer thread in the service, the process holding the file for ``--db``)."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from typing import Any, TypeVar

from collector.store.updates import set_recommendation_status, update_row

T = TypeVar("T")
Writer = Callable[[Callable[[], Any]], Any]  # runs a function on the store's writer, returns its result
_JSON_COLS = ("current", "proposed", "details", "before", "after")


def new_id(prefix: str = "act") -> str:
    """``act-<unix seconds>-<6 hex>`` (the recommendation ids' form)."""
    return f"{prefix}-{int(time.time())}-{secrets.token_hex(3)}"


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    for col in _JSON_COLS:
        if isinstance(row.get(col), str):
            try:
                row[col] = json.loads(row[col])
            except ValueError:
                pass
    return row


class Audit:
    """Reads recommendations and actions, writes actions and statuses through ``writer``."""

    def __init__(self, store: Any, node: str, writer: Writer | None = None) -> None:
        self.store = store
        self.node = node
        self._writer: Writer = writer or (lambda fn: fn())

    def recommendation(self, rec_id: str) -> dict[str, Any] | None:
        """The recommendation row (JSON columns decoded), or None."""
        with self.store.reader() as cur:
            got = cur.execute("SELECT * FROM recommendations WHERE recommendation_id = ?", [rec_id])
            names = [d[0] for d in got.description]
            row = got.fetchone()
        return _decode(dict(zip(names, row, strict=True))) if row else None

    def newest_proposed(
        self, target: str | None = None, kinds: tuple[str, ...] = ("layout",)
    ) -> dict[str, Any] | None:
        """The newest proposed recommendation of ``kinds`` (for ``target`` when given)."""
        return self.newest(target, kinds=kinds, status="proposed")

    def newest(
        self, target: str | None = None, *, kinds: tuple[str, ...] = ("layout",), status: str = "proposed"
    ) -> dict[str, Any] | None:
        """The newest recommendation of ``kinds`` in ``status`` (for ``target`` when given)."""
        marks = ", ".join("?" for _ in kinds)
        sql = f"SELECT * FROM recommendations WHERE kind IN ({marks}) AND status = ?"
        params: list[Any] = [*kinds, status]
        if target:
            sql += " AND target = ?"
            params.append(target)
        with self.store.reader() as cur:
            got = cur.execute(sql + " ORDER BY ts_s DESC LIMIT 1", params)
            names = [d[0] for d in got.description]
            row = got.fetchone()
        return _decode(dict(zip(names, row, strict=True))) if row else None

    def actions(
        self, *, recommendation_id: str | None = None, action_id: str | None = None, limit: int = 1000
    ) -> list[dict[str, Any]]:
        """Action rows, oldest first (JSON decoded)."""
        where, params = [], []
        if recommendation_id:
            where.append("recommendation_id = ?")
            params.append(recommendation_id)
        if action_id:
            where.append("action_id = ?")
            params.append(action_id)
        sql = "SELECT * FROM (SELECT * FROM actions"
        sql += (" WHERE " + " AND ".join(where)) if where else ""
        sql += " ORDER BY ts_s DESC, action_id DESC LIMIT ?) ORDER BY ts_s, action_id"
        with self.store.reader() as cur:
            got = cur.execute(sql, [*params, limit])
            names = [d[0] for d in got.description]
            rows = got.fetchall()
        return [_decode(dict(zip(names, r, strict=True))) for r in rows]

    def row(
        self,
        action: str,
        *,
        actor: str,
        target: str | None,
        before: Any = None,
        after: Any = None,
        dry_run: bool,
        status: str,
        recommendation_id: str | None,
        message: str | None = None,
    ) -> dict[str, Any]:
        """A new action row (not yet written)."""
        return {
            "action_id": new_id(),
            "node": self.node,
            "ts_s": time.time(),
            "actor": actor,
            "action": action,
            "target": target,
            "before": before,
            "after": after,
            "dry_run": dry_run,
            "status": status,
            "rolled_back": False,
            "recommendation_id": recommendation_id,
            "message": message,
        }

    def append(self, rows: list[dict[str, Any]]) -> None:
        """Write ``rows`` and commit them."""

        def write() -> None:
            self.store.append("actions", rows)
            self.store.flush()

        self._writer(write)

    def update(self, action_id: str, **values: Any) -> None:
        """Set an action row's status, after, message, rolled_back or rolled_back_at_s."""
        self._writer(lambda: update_row(self.store, "actions", action_id, values))

    def set_status(self, recommendation_id: str, status: str) -> None:
        """The recommendation's status (applied, rolled_back, ...)."""
        self._writer(lambda: set_recommendation_status(self.store, recommendation_id, status))
