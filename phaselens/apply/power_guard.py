"""The runtime guard of an applied power recommendation (issue 24, item 3): each lane (the workers of
one role whose knob the recommendation set) is judged on the live traffic of the last window — a
prefill lane on the TTFT of the requests it prefilled, a decode lane on the TPOT of those it decoded,
a mixed lane on both — and a lane that breaches the recommendation's SLO (attainment under its
target, or errors over the limit) has its knob **released**: its devices back to the defaults, an
``actions`` row ``power_release`` with the window's figures. When every lane is released the
recommendation becomes ``rolled_back``. Source: the router's request telemetry and the control API,
as the apply guard (phaselens/apply/guard.py), whose figures and verdict it reuses.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

from phaselens.apply.audit import Audit
from phaselens.apply.guard import DEFAULT_MAX_ERROR_RATE, GuardSpec, judge, measure, slo_of
from phaselens.apply.plan import ApplyError, stack_url_of
from phaselens.apply.stack import StackClient, StackError
from phaselens.power.live import is_default

DEFAULT_WINDOW_S = 30.0


def _lane_slo(role: str, slo: Any) -> Any:
    """A prefill lane answers for TTFT only, a decode lane for TPOT only, a mixed one for both."""
    if role == "prefill":
        return replace(slo, tpot_s=math.inf)
    if role == "decode":
        return replace(slo, ttft_s=math.inf)
    return slo


def _lane_events(events: list[dict[str, Any]], role: str, workers: set[str]) -> list[dict[str, Any]]:
    key = {"prefill": ("prefill_worker",), "decode": ("decode_worker",)}.get(
        role, ("prefill_worker", "decode_worker")
    )
    return [e for e in events if any(e.get(k) in workers for k in key)]


class PowerGuard:
    """Judges and releases the lanes of one applied power recommendation (:meth:`check`)."""

    def __init__(
        self,
        audit: Audit,
        rec_id: str,
        token: str,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        settle_s: float = 1.0,
        max_error_rate: float = DEFAULT_MAX_ERROR_RATE,
        min_requests: int = 1,
    ) -> None:
        rec = audit.recommendation(rec_id)
        if rec is None or rec.get("kind") != "power":
            raise ApplyError(f"no power recommendation {rec_id!r}", 404)
        if rec.get("status") != "applied":
            raise ApplyError(
                f"recommendation {rec_id} is {rec.get('status')!r}: only an applied one is guarded", 409
            )
        if not 0 < window_s <= 3600:
            raise ApplyError(f"window_s must be in (0, 3600] seconds, got {window_s:g}")
        self.audit, self.rec, self.token = audit, rec, token
        self.url = stack_url_of(rec)
        slo, target = slo_of(rec.get("details"))
        self.spec = GuardSpec(window_s, slo, target, max_error_rate, min_requests)
        self.settle_s = settle_s
        self.released: set[str] = set()
        self._stack = StackClient(self.url, token)
        self._events: list[dict[str, Any]] = []

    def close(self) -> None:
        self._stack.close()

    def check(self) -> list[dict[str, Any]]:
        """Judge every lane still set over the last window; release those that breach. Each lane's
        verdict (role, workers, figures, passed, why, released)."""
        try:
            self._events += self._stack.request_events()
            now = time.time() - self.settle_s
            start = now - self.spec.window_s
            self._events = [e for e in self._events if e["arrival_s"] >= start - self.spec.window_s]
            settings = (self.rec.get("proposed") or {}).get("settings") or {}
            out = []
            for role, item in settings.items():
                workers = set(item.get("workers") or [])
                if role in self.released or not workers:
                    continue
                if all(is_default(self._stack.device_knobs(w)) for w in workers):
                    continue  # nothing set on this lane (the defaults were kept, or someone reset it)
                slo = _lane_slo(role, self.spec.slo)
                events = _lane_events(self._events, role, workers)
                figures = measure(events, start, now, slo=slo, gpus=len(workers))
                passed, why = judge(figures, replace(self.spec, slo=slo))
                verdict = {
                    "role": role,
                    "workers": sorted(workers),
                    "figures": figures,
                    "passed": passed,
                    "why": why,
                }
                if not passed:
                    verdict["released"] = self._release(role, sorted(workers), figures, why)
                out.append(verdict)
            return out
        except StackError as e:
            raise ApplyError(f"the power guard cannot read the stack: {e}", 502) from e

    def _release(self, role: str, workers: list[str], figures: dict[str, Any], why: str) -> bool:
        before = {w: self._stack.device_knobs(w) for w in workers}
        errors = []
        for w in workers:
            try:
                self._stack.set_device(w, {"reset": True})
            except StackError as e:
                errors.append(f"{w}: {e}")
        after = {w: self._stack.device_knobs(w) for w in workers}
        ok = not errors and all(is_default(k) for k in after.values())
        rid = self.rec["recommendation_id"]
        self.audit.append(
            [
                self.audit.row(
                    "power_release",
                    actor="phaselens-power-guard",
                    target=f"stack:{self.url}",
                    before={"knobs": before, "window": figures},
                    after={"knobs": after, "role": role, "guard": self.spec.describe()},
                    dry_run=False,
                    status="applied" if ok else "failed",
                    recommendation_id=rid,
                    message=f"{role} lane breached ({why}): its knob released to the defaults"
                    + ("" if ok else f"; failed: {'; '.join(errors)}"),
                )
            ]
        )
        if ok:
            self.released.add(role)
            lanes = {
                r
                for r, item in ((self.rec.get("proposed") or {}).get("settings") or {}).items()
                if item.get("workers")
            }
            if lanes <= self.released:
                self.audit.set_status(rid, "rolled_back")
        return ok
