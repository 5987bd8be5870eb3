"""Apply a layout recommendation to the bundled stack: plan, dry run or execute step by step with a
guard window after each, roll back on breach, and compare what was realised with what was predicted.

Every step is an ``actions`` row written before anything changes (status ``planned``) and updated as
it runs (``applied`` | ``failed`` | ``rolled_back``); each guard window is a ``guard`` row (the
figures before and after, the verdict); a rollback writes its own steps and a ``rollback`` row; the
last row of a successful apply (``realised``) carries realised vs predicted in its ``after``. The
recommendation becomes ``applied`` or ``rolled_back``. A dry run (the default) writes the plan's rows
with ``dry_run`` true and changes nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from phaselens.apply.audit import Audit
from phaselens.apply.guard import (
    DEFAULT_GUARD_S,
    DEFAULT_MAX_ERROR_RATE,
    GuardSpec,
    comparison_text,
    judge,
    measure,
    realised_vs_predicted,
    slo_of,
)
from phaselens.apply.plan import (
    DEFAULT_MAX_ADD,
    DEFAULT_MAX_STEPS,
    ApplyError,
    Plan,
    Step,
    check_recommendation,
    counts,
    inverse,
    live_workers,
    plan_for,
    plan_steps,
    roles_text,
    stack_url_of,
)
from phaselens.apply.power import plan_power, restore_steps
from phaselens.apply.stack import StackClient, StackError

DEFAULT_SETTLE_S = 1.0
DEFAULT_DRAIN_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class ApplyOptions:
    """How an apply runs: ``execute`` (else a dry run), the guard, the bounds of the plan."""

    execute: bool = False
    guard_s: float = DEFAULT_GUARD_S
    settle_s: float = DEFAULT_SETTLE_S  # after a window, for its last requests' telemetry to arrive
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    max_steps: int = DEFAULT_MAX_STEPS
    max_add: int = DEFAULT_MAX_ADD
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE
    min_requests: int = 1
    actor: str = "phaselens-apply"

    def check(self) -> None:
        """ApplyError naming the option out of range."""
        if not 0 < self.guard_s <= 3600:
            raise ApplyError(f"guard_s must be in (0, 3600] seconds, got {self.guard_s:g}")
        if not 0 <= self.settle_s <= 60:
            raise ApplyError(f"settle_s must be in [0, 60] seconds, got {self.settle_s:g}")
        if not 0 < self.drain_timeout_s <= 3600:
            raise ApplyError(f"drain_timeout_s must be in (0, 3600] seconds, got {self.drain_timeout_s:g}")
        if not 1 <= self.max_steps <= 64:
            raise ApplyError(f"max_steps must be in [1, 64], got {self.max_steps}")
        if not 0 <= self.max_add <= 16:
            raise ApplyError(f"max_add must be in [0, 16], got {self.max_add}")
        if not 0 <= self.max_error_rate <= 1:
            raise ApplyError(f"max_error_rate must be in [0, 1], got {self.max_error_rate:g}")
        if self.min_requests < 0:
            raise ApplyError(f"min_requests must be >= 0, got {self.min_requests}")


@dataclass
class Progress:
    """What an apply is doing now (GET /api/v1/actions shows it while it runs)."""

    recommendation_id: str
    apply_action_id: str | None = None
    state: str = "planning"  # planning | applying | guarding | rolling_back | done | failed
    step: int = 0
    steps: int = 0
    step_text: str = ""
    guard_ends_at_s: float | None = None
    outcome: str | None = None
    action_ids: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        left = (
            None if self.guard_ends_at_s is None else round(max(0.0, self.guard_ends_at_s - time.time()), 2)
        )
        return {
            "recommendation_id": self.recommendation_id,
            "apply_action_id": self.apply_action_id,
            "state": self.state,
            "step": self.step,
            "steps": self.steps,
            "current_step": self.step_text,
            "guard_left_s": left if self.state == "guarding" else None,
            "outcome": self.outcome,
            "action_ids": list(self.action_ids),
        }


class ApplyRun:
    """One apply of one recommendation: :meth:`prepare` (plan + rows), then :meth:`run`."""

    def __init__(
        self,
        audit: Audit,
        recommendation_id: str,
        token: str | None,
        options: ApplyOptions = ApplyOptions(),
        *,
        stop: threading.Event | None = None,
        allowed_urls: list[str] | None = None,
        on_note: Callable[[str], None] | None = None,
    ) -> None:
        if not token:
            raise ApplyError(
                "the serving stack's control token is required: pass --token TOKEN or set "
                "$PHASELENS_CONTROL_TOKEN (`phaselens demo` prints it as its 'control token')",
                401,
            )
        options.check()
        self.audit, self.options, self.token = audit, options, token
        self.rec_id = recommendation_id
        self.stop = stop or threading.Event()
        self.allowed_urls = allowed_urls
        self.progress = Progress(recommendation_id)
        self.rec: dict[str, Any] = {}
        self.plan: Plan | None = None
        self.header: dict[str, Any] = {}
        self.step_rows: list[dict[str, Any]] = []
        self.guard = GuardSpec()
        self.log: list[str] = []
        self.on_note = on_note

    # -- planning ------------------------------------------------------------------------------------

    def prepare(self) -> dict[str, Any]:
        """Check the recommendation, read the stack's layout, plan, and write the plan's rows."""
        rec = self.audit.recommendation(self.rec_id)
        check_recommendation(rec, self.rec_id)
        assert rec is not None
        self.rec = rec
        url = stack_url_of(rec)
        if self.allowed_urls is not None and url not in [u.rstrip("/") for u in self.allowed_urls]:
            raise ApplyError(
                f"recommendation {self.rec_id} is for the stack at {url}, which this collector does not watch "
                f"(--serving: {', '.join(self.allowed_urls) or 'none'})",
                409,
            )
        o = self.options
        with StackClient(url, self.token) as stack:
            try:
                live = stack.layout()
                if rec.get("kind") == "power":
                    knobs = {w["id"]: stack.device_knobs(w["id"]) for w in live.get("workers", [])}
            except StackError as e:
                raise ApplyError(str(e), 401 if e.status == 401 else 502) from e
        if rec.get("kind") == "power":
            self.plan = plan = plan_power(rec, live, knobs)
        else:
            self.plan = plan = plan_for(rec, live, max_steps=o.max_steps, max_add=o.max_add)
        slo, target = slo_of(rec.get("details"))
        self.guard = GuardSpec(o.guard_s, slo, target, o.max_error_rate, o.min_requests)
        self.trust = "emulated" if all(w.get("emulated") for w in live.get("workers", [])) else "measured"
        details = rec.get("details") or {}
        dry = not o.execute
        t0 = time.time()
        header = self.audit.row(
            "apply",
            actor=o.actor,
            target=f"stack:{url}",
            before={"roles": plan.before, "workers": [list(w) for w in plan.workers_before]}
            | _knobs_before(plan),
            after={
                "roles": plan.after,
                "proposed": (rec.get("proposed") or {}).get("layout"),
                "predicted": details.get("predicted"),
                "confidence": details.get("confidence"),
                "guard": self.guard.describe(),
                "steps": [s.as_dict() for s in plan.steps],
            },
            dry_run=dry,
            status="planned",
            recommendation_id=self.rec_id,
            message=plan.text(),
        )
        rows, state = [header], dict(plan.before)
        for i, step in enumerate(plan.steps, 1):
            nxt = _after(state, step)
            row = self.audit.row(
                step.action,
                actor=o.actor,
                target=step.worker or step.role,
                before={"roles": state},
                after={"roles": nxt, "step": step.as_dict(), "index": i},
                dry_run=dry,
                status="planned",
                recommendation_id=self.rec_id,
                message=step.describe(),
            )
            row["ts_s"] = t0 + i * 1e-6
            rows.append(row)
            state = nxt
        header["ts_s"] = t0
        self.audit.append(rows)
        self.header, self.step_rows = header, rows[1:]
        p = self.progress
        p.apply_action_id, p.steps = header["action_id"], len(plan.steps)
        p.action_ids = [r["action_id"] for r in rows]
        p.state = "planned" if dry else "applying"
        return self.summary()

    def summary(self) -> dict[str, Any]:
        """The plan as the API and the CLI show it."""
        assert self.plan is not None
        return {
            "recommendation_id": self.rec_id,
            "dry_run": not self.options.execute,
            "stack": self.plan.stack_url,
            "before": self.plan.before,
            "after": self.plan.after,
            "steps": [
                s.as_dict() | {"action_id": r["action_id"]}
                for s, r in zip(self.plan.steps, self.step_rows, strict=True)
            ],
            "apply_action_id": self.header["action_id"],
            "action_ids": self.progress.action_ids,
            "guard": self.guard.describe(),
            "predicted": (self.rec.get("details") or {}).get("predicted"),
            "plan": self.plan.text(),
        }

    # -- running -------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Execute the plan (after :meth:`prepare`); a dry run returns at once. The outcome."""
        assert self.plan is not None
        if not self.options.execute:
            self.progress.state, self.progress.outcome = "done", "dry_run"
            return {"outcome": "dry_run", **self.summary()}
        try:
            return self._execute()
        except Exception as e:  # never leave the rows saying "planned" for something that ran
            self.progress.state, self.progress.outcome = "failed", "error"
            self._note(f"apply failed: {type(e).__name__}: {e}")
            self.audit.update(self.header["action_id"], status="failed", message=f"{type(e).__name__}: {e}")
            raise

    def _note(self, text: str) -> None:
        self.log.append(text)
        if self.on_note is not None:
            self.on_note(text)

    def _execute(self) -> dict[str, Any]:
        assert self.plan is not None
        plan, o, p = self.plan, self.options, self.progress
        with StackClient(plan.stack_url, self.token) as stack:
            start = time.time()
            events = stack.request_events()
            baseline = self._measure(events, start - o.guard_s, start, None, None, sum(plan.before.values()))
            done: list[tuple[Step, dict[str, Any], str | None]] = []  # (step, its row, added worker id)
            previous = baseline
            for i, (step, row) in enumerate(zip(plan.steps, self.step_rows, strict=True), 1):
                p.step, p.step_text, p.state = i, step.describe(), "applying"
                self._note(f"step {i}/{len(plan.steps)}: {step.describe()}")
                try:
                    added = self._do(stack, step)
                except StackError as e:
                    self.audit.update(row["action_id"], status="failed", message=f"{step.describe()}: {e}")
                    return self._roll_back(stack, done, f"step {i} failed: {e}", start)
                after = dict(row["after"]) | {"worker": added or step.worker, "done_at_s": time.time()}
                self.audit.update(row["action_id"], status="applied", after=after)
                done.append((step, row, added))
                try:
                    metrics, passed, why = self._guard_window(stack, events, i, previous)
                except (StackError, ApplyError) as e:  # the stack stopped answering mid-window
                    return self._roll_back(
                        stack, done, f"guard window after step {i} could not be read: {e}", start
                    )
                if self.stop.is_set():
                    return self._roll_back(stack, done, "the service stopped during the guard window", start)
                if not passed:
                    return self._roll_back(stack, done, f"guard window after step {i}: {why}", start)
                previous = metrics
            if not plan.steps:  # nothing to change: the final window is the layout as it is
                previous = self._guard_window(stack, events, 0, baseline)[0]
        return self._finish(baseline, previous)

    def _do(self, stack: StackClient, step: Step) -> str | None:
        o = self.options
        if step.action == "set_device":
            stack.set_device(step.worker or "", step.knobs or {"reset": True})
            return None
        if step.action == "add_worker":
            return str(stack.add_worker(step.role or "mixed")["id"])
        if step.action == "set_role":
            stack.set_role(step.worker or "", step.role or "", o.drain_timeout_s)
        else:
            stack.remove_worker(step.worker or "", o.drain_timeout_s)
        return None

    def _measure(
        self,
        events: list[dict[str, Any]],
        start_s: float,
        end_s: float,
        energy_j: float | None,
        host_bound: float | None,
        gpus: int,
    ) -> dict[str, Any]:
        return measure(
            events,
            start_s,
            end_s,
            slo=self.guard.slo,
            gpus=gpus,
            energy_j=energy_j,
            trust=self.trust,
            host_bound_share=host_bound,
        )

    def _guard_window(
        self, stack: StackClient, events: list[dict[str, Any]], index: int, previous: dict[str, Any]
    ) -> tuple[dict[str, Any], bool, str]:
        """Wait out a guard window after step ``index``, measure it, write its ``guard`` row."""
        o, p = self.options, self.progress
        gpus = sum(roles_now(stack).values())
        c0 = stack.counters()
        start = time.time()
        p.state, p.guard_ends_at_s = "guarding", start + o.guard_s
        while time.time() < p.guard_ends_at_s and not self.stop.is_set():
            events += stack.request_events()
            time.sleep(min(0.25, max(0.0, p.guard_ends_at_s - time.time())))
        end = time.time()
        c1 = stack.counters()
        p.guard_ends_at_s = None
        self.stop.wait(o.settle_s)
        events += stack.request_events()
        metrics = self._measure(events, start, end, *window_counters(c0, c1), gpus)
        passed, why = judge(metrics, self.guard)
        self._note(f"guard after step {index}: {'passed' if passed else 'BREACH'}: {why}")
        row = self.audit.row(
            "guard",
            actor=o.actor,
            target=f"stack:{self.plan.stack_url if self.plan else ''}",
            before=previous,
            after=metrics | {"passed": passed, "step": index, "guard": self.guard.describe()},
            dry_run=False,
            status="applied" if passed else "failed",
            recommendation_id=self.rec_id,
            message=why,
        )
        self.audit.append([row])
        p.action_ids.append(row["action_id"])
        return metrics, passed, why

    def _roll_back(
        self, stack: StackClient, done: list[tuple[Step, dict[str, Any], str | None]], why: str, start: float
    ) -> dict[str, Any]:
        """Undo the applied steps, newest first; mark them rolled back; the recommendation too."""
        p = self.progress
        p.state = "rolling_back"
        self._note(f"rolling back: {why}")
        undo = [inverse(step, added) for step, _, added in reversed(done)]
        ok, failures = execute_steps(self.audit, stack, undo, self.rec_id, self.options, p, "rollback")
        now = time.time()
        for _, row, _ in done:
            self.audit.update(row["action_id"], status="rolled_back", rolled_back=True, rolled_back_at_s=now)
        roles = roles_now(stack) if ok else None
        summary = self.audit.row(
            "rollback",
            actor=self.options.actor,
            target=f"stack:{stack.url}",
            before={"steps_applied": len(done)},
            after={"roles": roles, "restored": roles == self.plan.before if self.plan and roles else False},
            dry_run=False,
            status="applied" if ok else "failed",
            recommendation_id=self.rec_id,
            message=why if ok else f"{why}; the rollback failed: {'; '.join(failures)}",
        )
        self.audit.append([summary])
        p.action_ids.append(summary["action_id"])
        self.audit.update(
            self.header["action_id"],
            status="rolled_back",
            rolled_back=True,
            rolled_back_at_s=now,
            message=why,
        )
        if done:
            self.audit.set_status(self.rec_id, "rolled_back")
        p.state, p.outcome = "done", "rolled_back"
        return {"outcome": "rolled_back", "reason": why, "roles": roles, "log": self.log, **self.summary()}

    def _finish(self, baseline: dict[str, Any], realised: dict[str, Any]) -> dict[str, Any]:
        """The final row: realised (the last guard window) vs predicted; the recommendation applied."""
        p = self.progress
        predicted = (self.rec.get("details") or {}).get("predicted")
        cmp = realised_vs_predicted(realised, predicted)
        row = self.audit.row(
            "realised",
            actor=self.options.actor,
            target=f"stack:{self.plan.stack_url if self.plan else ''}",
            before=baseline,
            after={"realised": realised, "predicted": predicted, "comparison": cmp, "trust": self.trust},
            dry_run=False,
            status="applied",
            recommendation_id=self.rec_id,
            message="realised vs predicted over the last guard window\n" + comparison_text(cmp),
        )
        self.audit.append([row])
        p.action_ids.append(row["action_id"])
        self.audit.update(self.header["action_id"], status="applied")
        self.audit.set_status(self.rec_id, "applied")
        p.state, p.outcome = "done", "applied"
        return {
            "outcome": "applied",
            "realised": realised,
            "comparison": cmp,
            "log": self.log,
            **self.summary(),
        }


def roles_now(stack: StackClient) -> dict[str, int]:
    """The stack's ready workers per role (any other state left out; never raises for one)."""
    return counts(
        [(w["id"], w["role"]) for w in stack.layout().get("workers", []) if w.get("state") == "ready"]
    )


def window_counters(
    c0: dict[str, dict[str, float]], c1: dict[str, dict[str, float]]
) -> tuple[float | None, float | None]:
    """(energy J, host-bound share of the emulated iterations) between two device reads of the
    same workers (None where a worker came or went, or nothing reports it)."""
    if not c1 or set(c0) != set(c1):
        return None, None
    energy = [
        c1[w]["energy_j"] - c0[w]["energy_j"] for w in c1 if "energy_j" in c1[w] and "energy_j" in c0[w]
    ]
    iters = sum(c1[w].get("iterations", 0) - c0[w].get("iterations", 0) for w in c1)
    lagged = sum(c1[w].get("lagged", 0) - c0[w].get("lagged", 0) for w in c1)
    return (sum(energy) if len(energy) == len(c1) else None), (lagged / iters if iters else None)


def _knobs_before(plan: Plan) -> dict[str, Any]:
    """The knobs a power apply changes, as they were (worker → the body that restores them)."""
    knobs = {s.worker: s.from_knobs for s in plan.steps if s.action == "set_device" and s.worker}
    return {"knobs": knobs} if knobs else {}


def _after(roles: dict[str, int], step: Step) -> dict[str, int]:
    out = dict(roles)
    if step.from_role:
        out[step.from_role] -= 1
    if step.role:
        out[step.role] += 1
    return out


def execute_steps(
    audit: Audit,
    stack: StackClient,
    steps: list[Step],
    rec_id: str | None,
    options: ApplyOptions,
    progress: Progress | None,
    label: str,
) -> tuple[bool, list[str]]:
    """Run ``steps`` (no guard: a rollback), each written as an applied or failed row; stop at the
    first failure. (all applied, failures)."""
    failures: list[str] = []
    for step in steps:
        if progress is not None:
            progress.step_text = f"{label}: {step.describe()}"
        row = audit.row(
            step.action,
            actor=options.actor,
            target=step.worker or step.role,
            before={"step": step.as_dict()},
            dry_run=False,
            status="applied",
            recommendation_id=rec_id,
            message=f"{label}: {step.describe()}",
        )
        try:
            if step.action == "set_device":
                row["after"] = {"knobs": stack.set_device(step.worker or "", step.knobs or {"reset": True})}
            elif step.action == "add_worker":
                row["after"] = {"worker": stack.add_worker(step.role or "mixed")["id"]}
            elif step.action == "set_role":
                stack.set_role(step.worker or "", step.role or "", options.drain_timeout_s)
            else:
                stack.remove_worker(step.worker or "", options.drain_timeout_s)
        except StackError as e:
            row["status"], row["message"] = "failed", f"{label}: {step.describe()}: {e}"
            failures.append(str(e))
        audit.append([row])
        if progress is not None:
            progress.action_ids.append(row["action_id"])
        if failures:
            return False, failures
    return True, failures


def rollback_apply(
    audit: Audit, ref: str, token: str | None, options: ApplyOptions = ApplyOptions()
) -> dict[str, Any]:
    """Restore the layout from before an apply (``ref``: one of its action ids, or its recommendation
    id): plan from the stack's layout now back to the apply's ``before`` roles, run it, audit it."""
    if not token:
        raise ApplyError(
            "the serving stack's control token is required: pass --token TOKEN or set $PHASELENS_CONTROL_TOKEN",
            401,
        )
    rows = audit.actions(action_id=ref)
    rec_id = rows[0]["recommendation_id"] if rows else ref
    applies = [
        r
        for r in audit.actions(recommendation_id=rec_id)
        if r["action"] == "apply" and not r["dry_run"] and r["status"] == "applied"
    ]
    if not applies:
        raise ApplyError(
            f"no applied layout change for {ref!r} (an action id or recommendation id) to roll back", 404
        )
    header = applies[-1]
    before = {k: int(v) for k, v in (header["before"] or {}).get("roles", {}).items()}
    url = (header["target"] or "").removeprefix("stack:")
    o = replace(options, actor=options.actor if options.actor != "phaselens-apply" else "phaselens-rollback")
    with StackClient(url, token) as stack:
        try:
            workers = live_workers(stack.layout())
        except StackError as e:
            raise ApplyError(str(e), 401 if e.status == 401 else 502) from e
        steps = plan_steps(workers, before, max_steps=o.max_steps, max_add=o.max_add) + restore_steps(header)
        ok, failures = execute_steps(audit, stack, steps, rec_id, o, None, "rollback")
        roles = roles_now(stack) if ok else None
    now = time.time()
    for r in audit.actions(recommendation_id=rec_id):
        if (
            r["status"] == "applied"
            and not r["dry_run"]
            and r["ts_s"] >= header["ts_s"]
            and r["action"] in ("apply", "add_worker", "set_role", "remove_worker", "set_device")
            and not (r["message"] or "").startswith("rollback")
        ):
            audit.update(r["action_id"], status="rolled_back", rolled_back=True, rolled_back_at_s=now)
    summary = audit.row(
        "rollback",
        actor=o.actor,
        target=header["target"],
        before={"roles": counts(workers)},
        after={"roles": roles, "restored": roles == before, "steps": [s.as_dict() for s in steps]},
        dry_run=False,
        status="applied" if ok else "failed",
        recommendation_id=rec_id,
        message=f"restore {roles_text(before)} from before apply {header['action_id']}"
        + ("" if ok else f": failed: {'; '.join(failures)}"),
    )
    audit.append([summary])
    if ok:
        audit.set_status(rec_id, "rolled_back")
    return {
        "outcome": "rolled_back" if ok else "failed",
        "roles": roles,
        "before": before,
        "action_id": summary["action_id"],
        "recommendation_id": rec_id,
        "steps": [s.as_dict() for s in steps],
    }
