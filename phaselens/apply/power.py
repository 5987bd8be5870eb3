"""A ``power`` recommendation (issue 24: a power limit or SM-clock window per role) as apply steps.

Each worker of a role whose setting changes gets one ``set_device`` step: the control API's
``POST /control/workers/{id}/device`` body of the setting (a reset first, then the knob), and the
body that puts back what it has now (its inverse: the rollback). The plan is refused before anything
changes when a worker the calibration measured is gone or has another role (stale: calibrate
again), or when a setting is outside a device's bounds (the device would refuse it). The same
runner, guard windows, audit rows and rollback as a layout change (phaselens/apply/runner.py).
"""

from __future__ import annotations

from typing import Any

from phaselens.apply.plan import ApplyError, Plan, Step, counts, live_workers, stack_url_of
from phaselens.power.live import restore_body, same_knobs
from phaselens.power.plan import Bounds, CalibrateError, Setting


def _json(value: Any) -> Any:
    import json

    return json.loads(value) if isinstance(value, str) else value


def plan_power(rec: dict[str, Any], live_layout: dict[str, Any], knobs: dict[str, dict[str, Any]]) -> Plan:
    """The ``set_device`` steps that take the stack's knobs (``knobs``: worker → its knob read now) to
    the recommendation's settings."""
    rec_id = rec["recommendation_id"]
    url = stack_url_of(rec)
    proposed = _json(rec.get("proposed")) or {}
    settings = proposed.get("settings") or {}
    if not settings:
        raise ApplyError(f"recommendation {rec_id} proposes no settings", 409)
    workers = live_workers(live_layout)
    role_of = dict(workers)
    steps: list[Step] = []
    for role, item in settings.items():
        setting = Setting.from_dict(item.get("setting") or {})
        for w in item.get("workers") or []:
            if role_of.get(w) != role:
                now = f"is {role_of[w]}" if w in role_of else "is gone"
                raise ApplyError(
                    f"stale recommendation {rec_id}: {w} was calibrated as {role} and {now}; calibrate again",
                    409,
                )
            try:
                Bounds.from_knobs(knobs[w], where=w).check(setting)
            except CalibrateError as e:
                raise ApplyError(f"recommendation {rec_id}: {e}", 409) from e
            target = setting.body()
            if _already(knobs[w], target):
                continue
            steps.append(
                Step(
                    "set_device",
                    worker=w,
                    pool=role,
                    knobs=target,
                    from_knobs=restore_body(knobs[w]),
                    label=setting.label(),
                )
            )
    have = counts(workers)
    return Plan(url, have, have, tuple(steps), tuple(workers))


def _already(knobs: dict[str, Any], body: dict[str, Any]) -> bool:
    """The device already has the knobs ``body`` would set."""
    want = {
        "power_limit_w": body.get("power_limit_w", knobs.get("power_limit_default_w")),
        "locked_sm_clock_min_mhz": body.get("sm_clock_min_mhz"),
        "locked_sm_clock_max_mhz": body.get("sm_clock_max_mhz"),
    }
    return same_knobs(knobs, want)


def restore_steps(header: dict[str, Any]) -> list[Step]:
    """The steps that put back the knobs an apply recorded before it (``before.knobs``: worker → body)."""
    knobs = ((header.get("before") or {}).get("knobs")) or {}
    return [
        Step("set_device", worker=w, knobs=body, label="as before the apply")
        for w, body in sorted(knobs.items())
    ]
