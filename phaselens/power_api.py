"""The service API's read of the power calibrations (issue 24, items 1–2; the dashboard's Power page):

- ``GET /api/v1/power/calibrations[?target=&role=&status=&limit=]`` — the stored ``power_calibrations``
  rows (migration 15), newest first, each with what the page shows beside it: ``annual_by_mode`` (per
  mode PERF / BAL / EFF: the setting, its tokens/J gain, its power change per GPU and the kWh and $ a
  year it saves on the role's GPUs at the calibrated load, as the ``power`` recommendation computes
  them), ``confidence`` (measured or simulated, the reference runs' noise) and ``usable``.
- ``GET /api/v1/power/calibrations/{id}`` — one row, the same way (404 naming it when absent).

**Stale**: a row is stale when the store says so (``phaselens calibrate --recommend`` marked it), and
also when its target is one of the collector's ``--serving`` stacks and that stack's engine
fingerprint, read now (``GET /control/layout`` and each worker's knob read, with the collector's
control token), no longer matches (``stale_reason`` names what changed). A stale or incomplete row is
never ``usable``. Read-only: nothing is written; the store's ``status`` changes only when a
recommendation is next made (``phaselens/power/records.usable_calibrations``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from collector.store import StoreError
from phaselens.power.choose import MODES

STATUSES = ("current", "stale", "incomplete")
ROLES = ("prefill", "decode", "mixed")
CHECK_TIMEOUT_S = 5.0
JSON_COLUMNS = ("reference", "cliff", "points", "trust", "details")


def _mode_annual(row: dict[str, Any], prices: Any) -> dict[str, Any]:
    """Per mode: the setting and what it saves a year on the role's GPUs (records.annual_saving)."""
    from phaselens.power.records import annual_saving, role_gpus

    modes = (((row.get("details") or {}).get("choice") or {}).get("modes")) or {}
    gpus = role_gpus(row)
    out: dict[str, Any] = {}
    for mode in MODES:
        m = modes.get(mode)
        if not isinstance(m, dict):
            continue
        keep = bool(m.get("keep_defaults"))
        saving = annual_saving(None if keep else m.get("power_w_change"), gpus, prices)
        out[mode] = {
            "knob": m.get("knob"),
            "setting": (m.get("setting") or {}).get("label") or "defaults",
            "keep_defaults": keep,
            "reason": m.get("reason"),
            "tokens_per_j_gain_pct": m.get("tokens_per_j_gain_pct"),
            "power_w_change": m.get("power_w_change"),
            "latency_change_pct": m.get("latency_change_pct"),
            "gpus": gpus,
            **({"kwh_per_year": 0.0, "usd_per_year": 0.0} if keep else saving),
        }
    return out


def stack_fingerprints(url: str, token: str) -> dict[str, Any]:
    """The running stack's engine fingerprint per role (``{role: Fingerprint}``), read as
    ``phaselens calibrate`` reads it; raises on a stack that cannot be read."""
    from phaselens.apply.stack import StackClient
    from phaselens.power.run import read_stack

    with StackClient(url, token, timeout_s=CHECK_TIMEOUT_S) as stack:
        return dict(read_stack(stack, None)["fingerprints"])


def view(
    row: dict[str, Any], prices: Any, current: dict[str, Any] | None, check: dict[str, Any] | None
) -> dict[str, Any]:
    """``row`` with ``annual_by_mode``, ``confidence``, ``stale`` / ``stale_reason`` and ``usable``
    (``current``: the running stack's fingerprint per role, None when not checked)."""
    from phaselens.power.fingerprint import stale_reason
    from phaselens.power.records import confidence

    out = dict(row)
    out["annual_by_mode"] = _mode_annual(row, prices)
    out["confidence"] = confidence({row["role"]: row}, "bal", None) if row.get("points") else None
    why = None
    if row.get("status") == "stale":
        why = "marked stale in the store: the stack's engine fingerprint had changed when it was last read"
    elif current is not None and row.get("status") == "current":
        fp = current.get(row["role"])
        why = f"the stack has no {row['role']} worker now" if fp is None else stale_reason(row, fp)
        if why is not None:
            why += " (read now; the store marks it stale when a recommendation is next made)"
    out["stale"] = why is not None
    out["stale_reason"] = why
    out["stack_check"] = check
    out["usable"] = row.get("status") == "current" and why is None
    return out


def add_power_routes(app: Any, collector: Any, error: Callable[..., Any]) -> None:
    """Add the routes of the module's docstring; ``error(status, message, param)`` makes the errors."""
    from analytics.prices import load_prices
    from phaselens.power.records import list_calibrations

    settings = collector.settings

    def checks(rows: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any] | None, dict[str, Any]]]:
        """Per ``stack:`` target of the rows: the stack's fingerprints now (None when not read) and
        what the check says."""
        out: dict[str, tuple[dict[str, Any] | None, dict[str, Any]]] = {}
        watched = {u.rstrip("/") for u in settings.serving_urls}
        for target in {str(r.get("target") or "") for r in rows}:
            url = target.removeprefix("stack:").rstrip("/")
            if not target.startswith("stack:") or url not in watched:
                out[target] = (
                    None,
                    {"checked": False, "text": "not checked: not a stack this collector watches"},
                )
            elif not settings.control_token:
                out[target] = (
                    None,
                    {"checked": False, "text": "not checked: the collector has no control token"},
                )
            else:
                try:
                    fps = stack_fingerprints(url, settings.control_token)
                    out[target] = (fps, {"checked": True, "text": f"checked against {url} now"})
                except Exception as e:  # the stack is down, changing, or older: said, not fatal
                    out[target] = (None, {"checked": False, "text": f"not checked: {e}"})
        return out

    def views(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        prices = load_prices()
        found = checks(rows)
        return [view(r, prices, *found[str(r.get("target") or "")]) for r in rows]

    @app.get("/api/v1/power/calibrations")
    def calibrations(
        target: str | None = None, role: str | None = None, status: str | None = None, limit: int = 100
    ) -> Any:
        """Stored power calibrations, newest first (the module's docstring says what each carries)."""
        if not 1 <= limit <= 1000:
            return error(400, f"limit must be in [1, 1000], got {limit}", "limit")
        if role is not None and role not in ROLES:
            return error(400, f"role must be one of {', '.join(ROLES)}, got {role!r}", "role")
        if status is not None and status not in STATUSES:
            return error(400, f"status must be one of {', '.join(STATUSES)}, got {status!r}", "status")
        try:
            rows = list_calibrations(
                collector.store, target=target, limit=10_000 if role or status else limit
            )
        except StoreError as e:
            return error(500, f"the calibrations read failed on the store: {e}")
        rows = [r for r in rows if role is None or r["role"] == role]
        got = views(rows)
        if status is not None:  # after the check: a row the stack no longer matches is stale too
            got = [
                r
                for r in got
                if (r["stale"] and status == "stale") or (r["status"] == status and not r["stale"])
            ]
        prices = load_prices()
        return {
            "calibrations": got[:limit],
            "prices": {"electricity_usd_per_kwh": prices.electricity_usd_per_kwh, "pue": prices.pue},
        }

    @app.get("/api/v1/power/calibrations/{calibration_id}")
    def calibration(calibration_id: str) -> Any:
        """One stored calibration, as the list shows it."""
        try:
            with collector.store.reader() as cur:
                got = cur.execute(
                    "SELECT * FROM power_calibrations WHERE calibration_id = ?", [calibration_id]
                )
                names = [d[0] for d in got.description]
                found = got.fetchall()
        except StoreError as e:
            return error(500, f"the calibrations read failed on the store: {e}")
        if not found:
            return error(404, f"no power calibration {calibration_id!r}", "calibration_id")
        row = dict(zip(names, found[0], strict=True))
        for k in JSON_COLUMNS:
            if isinstance(row.get(k), str):
                row[k] = json.loads(row[k])
        return views([row])[0]
