"""The runtime guard of an applied power recommendation (issue 24, item 3): each lane (the workers of
one role whose knob the recommendation set) is judged on the live traffic of the last window — a
prefill lane on the TTFT of the requests it prefilled, a decode lane on the TPOT of those it decoded,
a mixed lane on both — and a lane that breaches the recommendation's SLO (attainment under its
target, or errors over the limit) has its knob **released**: its devices back to the defaults, an
``actions`` row ``power_release`` with the window's figures. When every lane is released the
recommendation becomes ``rolled_back``. Source: the router's request telemetry and the control API,
as the apply guard (phaselens/apply/guard.py), whose figures and verdict it reuses.

Two ways to run it: ``phaselens power-guard REC_ID`` (a command, one recommendation) and
:class:`PowerGuardJob`, a job of the service (``phaselens collect --serving URL --control-token T``;
``--power-guard-window-s``, 0 turns it off): every window it guards the newest applied power
recommendation of each watched stack, pauses while an apply or rollback runs (its own guard windows
judge then), and forgets a recommendation once it is no longer applied. Its releases are the same
``power_release`` rows (``after.source`` ``service``); its state is ``GET /api/v1/actions``'s
``power_guard``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import replace
from typing import Any

from phaselens.apply.audit import Audit
from phaselens.apply.guard import DEFAULT_MAX_ERROR_RATE, GuardSpec, judge, measure, slo_of
from phaselens.apply.plan import ApplyError, stack_url_of
from phaselens.apply.stack import StackClient, StackError
from phaselens.power.live import is_default

DEFAULT_WINDOW_S = 30.0
ACTOR = "phaselens-power-guard"
log = logging.getLogger(__name__)


def _lane_slo(role: str, slo: Any) -> Any:
    """A prefill lane answers for TTFT only, a decode lane for TPOT only, a mixed one for both."""
    if role == "prefill":
        return replace(slo, tpot_s=math.inf)
    if role == "decode":
        return replace(slo, ttft_s=math.inf)
    return slo


def _finished_s(event: dict[str, Any]) -> float:
    ts = event.get("token_ts_s") or []
    return float(event.get("finish_s") or (ts[-1] if ts else event["arrival_s"]))


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
        max_error_rate: float = DEFAULT_MAX_ERROR_RATE,
        min_requests: int = 1,
        not_before_s: float | None = None,
        source: str = "cli",
    ) -> None:
        """``not_before_s``: requests that arrived earlier are not judged (the service's job passes the
        time it started guarding); ``source``: who runs it (``cli`` or ``service``), in the release rows."""
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
        self.not_before_s, self.source = not_before_s, source
        self.released: set[str] = set()
        self._stack = StackClient(self.url, token)
        self._events: list[dict[str, Any]] = []

    def close(self) -> None:
        self._stack.close()

    def check(self) -> list[dict[str, Any]]:
        """Judge every lane still set on the requests it served that finished in the last window (each
        request judged in the window it finished in, however long it took); release the lanes that
        breach. Each lane's verdict (role, workers, figures, passed, why, released)."""
        try:
            self._events += self._stack.request_events()
            now = time.time()
            start = now - self.spec.window_s
            self._events = [e for e in self._events if _finished_s(e) >= start]
            settings = (self.rec.get("proposed") or {}).get("settings") or {}
            out = []
            for role, item in settings.items():
                workers = set(item.get("workers") or [])
                if role in self.released or not workers:
                    continue
                if all(is_default(self._stack.device_knobs(w)) for w in workers):
                    continue  # nothing set on this lane (the defaults were kept, or someone reset it)
                slo = _lane_slo(role, self.spec.slo)
                events = [
                    e
                    for e in _lane_events(self._events, role, workers)
                    if _finished_s(e) < now
                    and (self.not_before_s is None or e["arrival_s"] >= self.not_before_s)
                ]
                arrived_from = min((e["arrival_s"] for e in events), default=start)
                figures = measure(events, arrived_from, now, slo=slo, gpus=len(workers))
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
                    actor=ACTOR,
                    target=f"stack:{self.url}",
                    before={"knobs": before, "window": figures},
                    after={
                        "knobs": after,
                        "role": role,
                        "workers": workers,
                        "why": why,
                        "guard": self.spec.describe(),
                        "source": self.source,
                    },
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


class PowerGuardJob:
    """The runtime guard as a job of the service (module docstring): :meth:`tick` is one window."""

    def __init__(
        self,
        audit: Audit,
        token: str,
        serving_urls: list[str],
        *,
        window_s: float = DEFAULT_WINDOW_S,
        coordinator: Any = None,
        min_requests: int = 1,
    ) -> None:
        if not 1 <= window_s <= 3600:
            raise ValueError(f"--power-guard-window-s must be 0 (off) or in [1, 3600] s, got {window_s:g}")
        self.audit, self.token, self.coordinator = audit, token, coordinator
        self.targets = [f"stack:{u.rstrip('/')}" for u in serving_urls]
        self.window_s, self.min_requests = window_s, min_requests
        self._guards: dict[str, PowerGuard] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last: dict[str, Any] | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="power-guard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for guard in self._guards.values():
            guard.close()
        self._guards.clear()

    def health(self) -> dict[str, Any]:
        """The job's state: enabled, its window, the recommendations guarded, the last window's verdicts."""
        return {
            "enabled": True,
            "window_s": self.window_s,
            "guarding": sorted(self._guards),
            "last": self.last,
        }

    def _loop(self) -> None:
        while not self._stop.wait(self.window_s):
            try:
                self.tick()
            except Exception:
                log.exception("power guard window failed")

    def tick(self) -> dict[str, Any]:
        """One window: judge the lanes of the newest applied power recommendation of each watched
        stack, releasing those that breach. Returns (and keeps as ``last``) what was judged."""
        now = time.time()
        if self.coordinator is not None and self.coordinator.busy:
            self.last = {"ts_s": now, "state": "paused", "reason": "an apply or rollback is running"}
            return self.last
        recs = [r for t in self.targets if (r := self.audit.newest(t, kinds=("power",), status="applied"))]
        wanted = {r["recommendation_id"] for r in recs}
        for rid in [rid for rid in self._guards if rid not in wanted]:
            self._guards.pop(rid).close()
        out: dict[str, Any] = {"ts_s": now, "state": "watching" if recs else "idle", "recommendations": []}
        for rec in recs:
            rid = rec["recommendation_id"]
            item: dict[str, Any] = {"recommendation_id": rid, "target": rec.get("target")}
            guard = self._guards.get(rid)
            try:
                if guard is None:  # judged from the next window on: what follows is under its knobs
                    self._guards[rid] = PowerGuard(
                        self.audit,
                        rid,
                        self.token,
                        window_s=self.window_s,
                        min_requests=self.min_requests,
                        not_before_s=now,
                        source="service",
                    )
                    item["lanes"], item["note"] = [], "guarding from now on"
                else:
                    item["lanes"] = [
                        {k: v for k, v in verdict.items() if k != "figures"}
                        | {"requests": verdict["figures"]["requests"]}
                        for verdict in guard.check()
                    ]
                    item["released"] = sorted(guard.released)
            except ApplyError as e:
                item["error"] = str(e)
                log.warning("power guard %s: %s", rid, e)
            out["recommendations"].append(item)
        self.last = out
        return out
