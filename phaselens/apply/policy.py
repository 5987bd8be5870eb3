"""Auto-apply (opt-in, off by default): a job of the service that, on a schedule, takes the newest
proposed recommendation of each kind it covers (``kinds``: ``layout``, and ``power`` — issue 24's
per-phase power settings — when ``--auto-apply-kinds layout,power`` says so) for the stack it
watches and applies it — through the same plan, guard windows, rollback and audit as ``phaselens
apply`` — when

- its predicted saving (``-est_cost_change_usd_per_h``) exceeds ``min_saving_usd_per_h``,
- its confidence level is at or above ``min_confidence`` (low < medium < high),
- the change budget allows it: at most ``max_per_day`` auto-applies in the last 24 h, not inside the
  quiet hours (UTC, ``start-end``), never while an apply or its guard window is running; one budget
  for every kind (it bounds how often the service changes the stack);
- for a power recommendation, also: the runtime power guard released no lane of that stack in the
  last 24 h (the same setting would breach again).

Every decision about a recommendation is an ``actions`` row: ``auto_apply`` (it was applied; the
apply's own rows follow) or ``auto_apply_skip`` (why not), ``dry_run`` as the policy says; the same
skip is not written again for the same recommendation. Before each decision the job re-recommends
from the stack's latest window (``recommend``: a callable that stores a fresh recommendation;
``phaselens collect --auto-apply`` wires ``phaselens.recommend_window.window_recommender``: the last
``window_s`` of traffic, the policy's SLOs, a small search budget).
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from phaselens.apply.audit import Audit
from phaselens.apply.guard import DEFAULT_GUARD_S
from phaselens.apply.plan import ApplyError
from phaselens.apply.runner import ApplyOptions

log = logging.getLogger(__name__)
CONFIDENCE = ("low", "medium", "high")
KINDS = ("layout", "power")
ACTOR = "phaselens-auto-apply"


@dataclass(frozen=True, slots=True)
class AutoApplyPolicy:
    """When the service applies a recommendation by itself (module docstring)."""

    interval_s: float = 600.0
    min_saving_usd_per_h: float = 0.0
    min_confidence: str = "medium"
    max_per_day: int = 1
    quiet_hours: tuple[int, int] | None = None  # UTC [start, end) hours, may wrap midnight
    dry_run: bool = False
    guard_s: float = DEFAULT_GUARD_S
    # the re-recommendation before each decision: the last window_s of the stack's traffic, these SLOs
    window_s: float = 600.0
    slo_ttft_ms: float = 1000.0
    slo_tpot_ms: float = 30.0
    kinds: tuple[str, ...] = ("layout",)  # which recommendations it may apply (module docstring)

    def check(self) -> None:
        """ValueError naming the policy flag out of range."""
        if not 10 <= self.window_s <= 86_400:
            raise ValueError(f"--auto-apply-window-s must be in [10, 86400], got {self.window_s:g}")
        for flag, value in (("ttft", self.slo_ttft_ms), ("tpot", self.slo_tpot_ms)):
            if not 0 < value <= 600_000:
                raise ValueError(f"--auto-apply-slo-{flag}-ms must be in (0, 600000] ms, got {value:g}")
        if not 1 <= self.interval_s <= 86_400:
            raise ValueError(f"--auto-apply-interval-s must be in [1, 86400], got {self.interval_s:g}")
        if self.min_confidence not in CONFIDENCE:
            raise ValueError(
                f"--auto-apply-min-confidence {self.min_confidence!r}; allowed: {', '.join(CONFIDENCE)}"
            )
        if not 1 <= self.max_per_day <= 100:
            raise ValueError(f"--auto-apply-max-per-day must be in [1, 100], got {self.max_per_day}")
        if not self.kinds or not set(self.kinds) <= set(KINDS):
            raise ValueError(
                f"--auto-apply-kinds {','.join(self.kinds) or 'none'!r}; allowed: a comma list of {', '.join(KINDS)}"
            )
        ApplyOptions(guard_s=self.guard_s).check()

    def in_quiet_hours(self, now_s: float) -> bool:
        if self.quiet_hours is None:
            return False
        hour = time.gmtime(now_s).tm_hour
        start, end = self.quiet_hours
        return start <= hour < end if start <= end else (hour >= start or hour < end)

    def describe(self) -> dict[str, Any]:
        return {
            "interval_s": self.interval_s,
            "min_saving_usd_per_h": self.min_saving_usd_per_h,
            "min_confidence": self.min_confidence,
            "max_per_day": self.max_per_day,
            "quiet_hours_utc": list(self.quiet_hours) if self.quiet_hours else None,
            "dry_run": self.dry_run,
            "guard_s": self.guard_s,
            "window_s": self.window_s,
            "slo_ttft_ms": self.slo_ttft_ms,
            "slo_tpot_ms": self.slo_tpot_ms,
            "kinds": list(self.kinds),
        }


def parse_quiet_hours(text: str | None) -> tuple[int, int] | None:
    """``22-6`` → (22, 6); ValueError naming the form."""
    if not text:
        return None
    a, sep, b = text.partition("-")
    try:
        start, end = int(a), int(b)
    except ValueError:
        start = end = -1
    if not sep or not (0 <= start <= 23 and 0 <= end <= 23) or start == end:
        raise ValueError(
            f"--auto-apply-quiet-hours {text!r}: give START-END in whole UTC hours 0-23, e.g. 22-6"
        )
    return start, end


class AutoApplyJob:
    """The policy on a schedule (a collector job); :meth:`tick` is one decision."""

    def __init__(
        self,
        policy: AutoApplyPolicy,
        coordinator: Any,
        audit: Audit,
        serving_urls: list[str],
        recommend: Callable[[], str | None] | None = None,
    ) -> None:
        self.policy, self.coordinator, self.audit = policy, coordinator, audit
        self.targets = [f"stack:{u.rstrip('/')}" for u in serving_urls]
        self.recommend = recommend  # the hook: store a fresh recommendation from the latest window
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._recorded: set[tuple[str, str]] = set()
        self.last: dict[str, Any] | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="auto-apply", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def health(self) -> dict[str, Any]:
        return {"enabled": True, "policy": self.policy.describe(), "last_decision": self.last}

    def _loop(self) -> None:
        while not self._stop.wait(self.policy.interval_s):
            try:
                self.tick()
            except Exception:
                log.exception("auto-apply decision failed")

    def applied_last_day(self, now_s: float) -> int:
        """Auto-applies (as dry runs when the policy is one) in the 24 h before ``now_s``."""
        rows = self.audit.actions(limit=10_000)
        return sum(
            1
            for r in rows
            if r["action"] == "auto_apply"
            and bool(r["dry_run"]) == self.policy.dry_run
            and r["ts_s"] >= now_s - 86_400
        )

    def power_released_last_day(self, rec: dict[str, Any], now_s: float) -> str | None:
        """The newest ``power_release`` of ``rec``'s stack in the 24 h before ``now_s`` (its message)."""
        rows = self.audit.actions(limit=10_000)
        hits = [
            r
            for r in rows
            if r["action"] == "power_release"
            and r["status"] == "applied"
            and r.get("target") == rec.get("target")
            and now_s - 86_400 <= r["ts_s"] <= now_s
        ]
        return (hits[-1].get("message") or "a lane").split(":")[0] if hits else None

    def _why_not(self, rec: dict[str, Any], now_s: float) -> str | None:
        p = self.policy
        if self.coordinator.busy:
            return "an apply is running (its guard window is open)"
        if rec.get("kind") == "power" and (released := self.power_released_last_day(rec, now_s)):
            return f"the runtime power guard released a lane of this stack in the last 24 h ({released})"
        if p.in_quiet_hours(now_s):
            return f"quiet hours {p.quiet_hours[0]:02d}-{p.quiet_hours[1]:02d} UTC"  # type: ignore[index]
        used = self.applied_last_day(now_s)
        if used >= p.max_per_day:
            return f"change budget spent: {used} of {p.max_per_day} auto-applies in the last 24 h"
        level = ((rec.get("details") or {}).get("confidence") or {}).get("level")
        if level not in CONFIDENCE or CONFIDENCE.index(level) < CONFIDENCE.index(p.min_confidence):
            return f"confidence {level or 'unknown'} is under the floor {p.min_confidence}"
        change = rec.get("est_cost_change_usd_per_h")
        saving = -float(change) if change is not None else None
        if saving is None or saving <= p.min_saving_usd_per_h:
            shown = "unknown" if saving is None else f"${saving:.2f}/h"
            return f"predicted saving {shown} does not exceed the threshold ${p.min_saving_usd_per_h:.2f}/h"
        return None

    def tick(self, now_s: float | None = None, *, wait: bool = False) -> dict[str, Any]:
        """One decision per kind the policy covers: the newest proposed recommendation of that kind for
        a watched stack, applied or skipped (why); recorded as an ``actions`` row. ``wait``: run an
        apply here (tests). Returns the decision (with one kind) or the last kind's with every
        kind's under ``decisions``."""
        now = time.time() if now_s is None else now_s
        fresh: dict[str, Any] = {}
        if self.recommend is not None and "layout" in self.policy.kinds:
            try:
                fresh["recommended"] = self.recommend()
            except Exception as e:  # an empty window, a stack gone: decide on the stored ones
                fresh["recommend_error"] = f"{type(e).__name__}: {e}"
                log.warning("auto-apply: re-recommending failed: %s", e)
        decisions = [self._decide(kind, now, fresh, wait) for kind in self.policy.kinds]
        last = next((d for d in reversed(decisions) if d["decision"] != "none"), decisions[-1])
        self.last = dict(last, decisions=decisions) if len(decisions) > 1 else last
        return self.last

    def _decide(self, kind: str, now: float, fresh: dict[str, Any], wait: bool) -> dict[str, Any]:
        rec = next(
            (r for t in self.targets if (r := self.audit.newest_proposed(t, kinds=(kind,))) is not None), None
        )
        if rec is None:
            return {
                "ts_s": now,
                "kind": kind,
                "decision": "none",
                "reason": f"no proposed {kind} recommendation for the stack",
                **fresh,
            }
        rec_id = rec["recommendation_id"]
        why = self._why_not(rec, now)
        decision = {
            "ts_s": now,
            "kind": kind,
            "recommendation_id": rec_id,
            "decision": "skip" if why else "apply",
            "reason": why,
            "predicted": {
                "saving_usd_per_h": None
                if rec.get("est_cost_change_usd_per_h") is None
                else -float(rec["est_cost_change_usd_per_h"]),
                "tokens_per_j_change_pct": rec.get("est_tokens_per_j_change_pct"),
                "latency_change_pct": rec.get("est_latency_change_pct"),
                "confidence": ((rec.get("details") or {}).get("confidence") or {}).get("level"),
            },
            **fresh,
        }
        p = self.policy
        if why is None:
            try:
                options = ApplyOptions(execute=not p.dry_run, guard_s=p.guard_s, actor=ACTOR)
                got = self.coordinator.apply(rec_id, options)  # planned here, run in the background
                decision["apply_action_id"] = got.get("apply_action_id")
                self._record(rec, "auto_apply", "the policy allows it", decision)
                if wait:
                    self.coordinator.join()
                    decision["outcome"] = (self.coordinator.last or {}).get("outcome")
            except ApplyError as e:
                decision |= {"decision": "skip", "reason": f"not applicable: {e}"}
                self._record(rec, "auto_apply_skip", decision["reason"], decision)
        elif (rec_id, why.split(":")[0]) not in self._recorded:
            self._record(rec, "auto_apply_skip", why, decision)
        return decision

    def _record(self, rec: dict[str, Any], action: str, why: str, decision: dict[str, Any]) -> None:
        rec_id = rec["recommendation_id"]
        self._recorded.add((rec_id, why.split(":")[0]))
        row = self.audit.row(
            action,
            actor=ACTOR,
            target=rec.get("target") or next(iter(self.targets), None),
            before={"policy": self.policy.describe()},
            after=dict(decision),
            dry_run=self.policy.dry_run,
            status="applied",
            recommendation_id=rec_id,
            message=why,
        )
        self.audit.append([row])


def add_auto_apply_arguments(p: argparse.ArgumentParser) -> None:
    """``phaselens collect``'s auto-apply flags (off unless ``--auto-apply``)."""
    d = AutoApplyPolicy()
    g = p.add_argument_group("auto-apply (opt-in; docs/RECOMMENDATIONS.md)")
    g.add_argument(
        "--auto-apply",
        action="store_true",
        help="apply the newest proposed recommendation (of --auto-apply-kinds) for --serving by itself, within the policy below",
    )
    g.add_argument(
        "--auto-apply-kinds",
        default=",".join(d.kinds),
        metavar="KINDS",
        help="which recommendations it may apply: a comma list of layout, power (layout)",
    )
    g.add_argument(
        "--auto-apply-interval-s", type=float, default=d.interval_s, help="decide every this many s (600)"
    )
    g.add_argument(
        "--auto-apply-min-saving-usd-per-h",
        type=float,
        default=d.min_saving_usd_per_h,
        help="apply only when the predicted saving exceeds this, $/h (0)",
    )
    g.add_argument(
        "--auto-apply-min-confidence",
        default=d.min_confidence,
        help="low | medium | high: the floor (medium)",
    )
    g.add_argument(
        "--auto-apply-max-per-day", type=int, default=d.max_per_day, help="changes in any 24 h (1)"
    )
    g.add_argument(
        "--auto-apply-quiet-hours",
        default=None,
        metavar="START-END",
        help="UTC hours never to apply, e.g. 22-6",
    )
    g.add_argument("--auto-apply-dry-run", action="store_true", help="decide and plan, change nothing")
    g.add_argument(
        "--auto-apply-guard-s", type=float, default=d.guard_s, help="guard window after each step, s (30)"
    )
    g.add_argument(
        "--auto-apply-window-s",
        type=float,
        default=d.window_s,
        help="before each decision, re-recommend from the stack's last this many s of traffic (600)",
    )
    g.add_argument(
        "--auto-apply-slo-ttft-ms",
        type=float,
        default=d.slo_ttft_ms,
        help="the re-recommendation's TTFT SLO (1000)",
    )
    g.add_argument(
        "--auto-apply-slo-tpot-ms",
        type=float,
        default=d.slo_tpot_ms,
        help="the re-recommendation's TPOT SLO (30)",
    )


def auto_apply_policy(args: argparse.Namespace) -> AutoApplyPolicy | None:
    """The policy of ``phaselens collect``'s flags (None without ``--auto-apply``); ValueError naming a bad flag."""
    if not args.auto_apply:
        return None
    policy = AutoApplyPolicy(
        interval_s=args.auto_apply_interval_s,
        min_saving_usd_per_h=args.auto_apply_min_saving_usd_per_h,
        min_confidence=args.auto_apply_min_confidence,
        max_per_day=args.auto_apply_max_per_day,
        quiet_hours=parse_quiet_hours(args.auto_apply_quiet_hours),
        dry_run=args.auto_apply_dry_run,
        guard_s=args.auto_apply_guard_s,
        window_s=args.auto_apply_window_s,
        slo_ttft_ms=args.auto_apply_slo_ttft_ms,
        slo_tpot_ms=args.auto_apply_slo_tpot_ms,
        kinds=tuple(k.strip() for k in str(args.auto_apply_kinds).split(",") if k.strip()),
    )
    try:
        policy.check()
    except ApplyError as e:
        raise ValueError(f"--auto-apply-guard-s: {e}") from e
    if not args.serving:
        raise ValueError("--auto-apply needs the stack to apply to: --serving URL")
    return policy
