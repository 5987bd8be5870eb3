"""From a layout recommendation and the live stack's layout to ordered, bounded steps.

A layout's pools map to worker counts per role on the bundled stack (each live worker is one
emulated or real GPU, TP 1). The steps: first add workers of the roles that are short, then switch
roles (drained), then remove the surplus (drained), each step ordered so that the pool can serve
after it (a prefill+decode pair or a mixed worker): the control API refuses stranding and so does
the plan. A plan is bounded (``max_steps``, ``max_add`` workers added) and refuses a recommendation
it cannot apply: unknown id, not a layout, not for the bundled stack, not proposed, a layout that is
not TP 1 or is for another GPU, or a stack whose layout is no longer the recommendation's
``current`` (stale: re-recommend).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from serving.sim.layout import LayoutError, parse_layout

ROLES = ("mixed", "prefill", "decode")
STACK_PREFIX = "stack:"
DEFAULT_MAX_STEPS = 16
DEFAULT_MAX_ADD = 4


class ApplyError(ValueError):
    """A recommendation that cannot be applied, or a plan refused; ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Step:
    """One change: ``add_worker`` (of ``role``), ``set_role`` (``worker``: ``from_role`` → ``role``),
    ``remove_worker`` (``worker``, of ``from_role``) or ``set_device`` (``worker``'s knobs, of its
    ``pool``: the control API body ``knobs``, whose inverse is ``from_knobs``; ``label`` in words)."""

    action: str
    role: str | None = None
    worker: str | None = None
    from_role: str | None = None
    pool: str | None = None
    knobs: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    from_knobs: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    label: str | None = None

    def describe(self) -> str:
        if self.action == "set_device":
            return f"set {self.worker}{f' ({self.pool})' if self.pool else ''} to {self.label or self.knobs}"
        if self.action == "add_worker":
            return f"add a {self.role} worker"
        if self.action == "set_role":
            return f"drain {self.worker} and switch it {self.from_role} → {self.role}"
        return f"drain and remove {self.worker} ({self.from_role})"

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None} | {"text": self.describe()}


@dataclass(frozen=True, slots=True)
class Plan:
    """The steps from the stack's ``before`` role counts to ``after``."""

    stack_url: str
    before: dict[str, int]
    after: dict[str, int]
    steps: tuple[Step, ...]
    workers_before: tuple[tuple[str, str], ...]  # (id, role) of the ready workers

    def text(self) -> str:
        lines = [f"stack {self.stack_url}: {roles_text(self.before)} → {roles_text(self.after)}"]
        if not self.steps:
            lines.append("  no change: the stack already has this layout")
        lines += [f"  {i}. {s.describe()}" for i, s in enumerate(self.steps, 1)]
        return "\n".join(lines)


def roles_text(roles: dict[str, int]) -> str:
    """``1 prefill + 1 decode`` / ``2 mixed``."""
    return " + ".join(f"{n} {r}" for r, n in roles.items() if n) or "no workers"


def can_serve(roles: dict[str, int]) -> bool:
    """A prefill+decode pair or a mixed worker (serving.pool's rule)."""
    return roles.get("mixed", 0) > 0 or (roles.get("prefill", 0) > 0 and roles.get("decode", 0) > 0)


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def stack_url_of(rec: dict[str, Any]) -> str:
    """The router URL of a recommendation for the bundled stack (``target`` = ``stack:<URL>``)."""
    target = rec.get("target") or ""
    if not target.startswith(STACK_PREFIX):
        raise ApplyError(
            f"recommendation {rec['recommendation_id']} is for {target or 'no target'!r}, not the bundled stack "
            "('stack:<router URL>'): only those can be applied live; export a fleet's or a scenario's layout "
            "with `phaselens export` instead",
            409,
        )
    return target[len(STACK_PREFIX) :].rstrip("/")


APPLICABLE_KINDS = ("layout", "power")


def check_recommendation(
    rec: dict[str, Any] | None, rec_id: str, *, statuses: tuple[str, ...] = ("proposed",)
) -> None:
    """Refuse what cannot be applied: no such row, not a layout or power one, not proposed, not for
    the stack."""
    if rec is None:
        raise ApplyError(f"no recommendation {rec_id!r}; list them with GET /api/v1/recommendations", 404)
    if rec.get("kind") not in APPLICABLE_KINDS:
        raise ApplyError(
            f"recommendation {rec_id} is of kind {rec.get('kind')!r}; only {' and '.join(APPLICABLE_KINDS)} "
            "recommendations can be applied",
            409,
        )
    if rec.get("status") not in statuses:
        raise ApplyError(
            f"recommendation {rec_id} is {rec.get('status')!r}; only a {' or '.join(statuses)} one can be applied "
            "(re-recommend for a fresh one)",
            409,
        )
    stack_url_of(rec)


def layout_roles(text: str, *, what: str) -> tuple[dict[str, int], str]:
    """Worker counts per role of a layout string, and its GPU; refuses TP other than 1."""
    try:
        layout = parse_layout(text)
    except LayoutError as e:
        raise ApplyError(f"the {what} layout: {e}") from e
    roles = dict.fromkeys(ROLES, 0)
    for p in layout.pools:
        if p.tp != 1:
            raise ApplyError(
                f"the {what} layout {text!r} has tp {p.tp} in its {p.role} pool; the bundled stack runs one GPU "
                "per worker (TP 1)"
            )
        roles[p.role] += p.replicas
    return roles, layout.gpu


def live_workers(layout: dict[str, Any]) -> list[tuple[str, str]]:
    """(id, role) of the stack's workers; ApplyError while any is not ready (the layout is changing)."""
    out = []
    for w in layout.get("workers", []):
        if w.get("state") != "ready":
            raise ApplyError(
                f"worker {w.get('id')} of the stack is {w.get('state')}; apply when every worker is ready",
                409,
            )
        out.append((w["id"], w["role"]))
    return out


def counts(workers: list[tuple[str, str]]) -> dict[str, int]:
    out = dict.fromkeys(ROLES, 0)
    for _, role in workers:
        out[role] += 1
    return out


def _stack_gpu(layout: dict[str, Any]) -> str | None:
    devices = {w.get("device") or "" for w in layout.get("workers", [])}
    emulated = {d.split(":", 1)[1].lower() for d in devices if d.startswith("emulated:")}
    return emulated.pop() if len(emulated) == 1 else None


def plan_for(
    rec: dict[str, Any],
    live_layout: dict[str, Any],
    *,
    max_steps: int = DEFAULT_MAX_STEPS,
    max_add: int = DEFAULT_MAX_ADD,
    check_current: bool = True,
) -> Plan:
    """The plan that takes the stack from ``live_layout`` (``GET /control/layout``) to the
    recommendation's proposed layout; ApplyError when the recommendation is stale or out of bounds."""
    rec_id = rec["recommendation_id"]
    url = stack_url_of(rec)
    proposed = _json(rec.get("proposed")) or {}
    if not proposed.get("layout"):
        raise ApplyError(f"recommendation {rec_id} has no proposed layout", 409)
    target, gpu = layout_roles(proposed["layout"], what="proposed")
    stack_gpu = _stack_gpu(live_layout)
    if stack_gpu is not None and stack_gpu != gpu:
        raise ApplyError(
            f"the proposed layout is for {gpu}; the stack's workers are emulated {stack_gpu}", 409
        )
    workers = live_workers(live_layout)
    have = counts(workers)
    if check_current:
        current = _json(rec.get("current")) or {}
        if current.get("layout"):
            was, _ = layout_roles(current["layout"], what="current")
            if was != have:
                raise ApplyError(
                    f"stale recommendation {rec_id}: it was made for {roles_text(was)}, the stack now has "
                    f"{roles_text(have)}; make a new recommendation",
                    409,
                )
    steps = plan_steps(workers, target, max_steps=max_steps, max_add=max_add)
    return Plan(url, have, target, tuple(steps), tuple(workers))


def plan_steps(
    workers: list[tuple[str, str]],
    target: dict[str, int],
    *,
    max_steps: int = DEFAULT_MAX_STEPS,
    max_add: int = DEFAULT_MAX_ADD,
) -> list[Step]:
    """Adds, then role switches, then removals, in an order that keeps the pool serving after each."""
    if not can_serve(target):
        raise ApplyError(
            f"the layout {roles_text(target)} cannot serve: it needs a mixed worker or a prefill+decode pair"
        )
    have = counts(workers)
    short = [r for r in ROLES for _ in range(max(0, target[r] - have[r]))]
    # surplus workers of each role, the newest (last listed) first
    spare = [
        (wid, role)
        for role in ROLES
        for wid, _ in [w for w in workers if w[1] == role][::-1][: max(0, have[role] - target[role])]
    ]
    switches = min(len(short), len(spare))
    adds = short[switches:]
    if len(adds) > max_add:
        raise ApplyError(
            f"the plan adds {len(adds)} workers; at most {max_add} (max_add) may be added in one apply"
        )
    # the roles that are short are reached by switching the spare workers first; the rest are added
    switch_roles, switch_workers = short[:switches], spare[:switches]
    removes = spare[switches:]
    state = dict(have)
    steps = [Step("add_worker", role=r) for r in adds]
    for r in adds:
        state[r] += 1
    pending = [
        Step("set_role", role=r, worker=w, from_role=f)
        for r, (w, f) in zip(switch_roles, switch_workers, strict=True)
    ]
    pending += [Step("remove_worker", worker=w, from_role=f) for w, f in removes]
    while pending:
        for i, step in enumerate(pending):
            nxt = dict(state)
            nxt[step.from_role or ""] -= 1
            if step.role:
                nxt[step.role] += 1
            if can_serve(nxt):
                steps.append(pending.pop(i))
                state = nxt
                break
        else:
            raise ApplyError(
                f"no order of the remaining steps ({', '.join(s.describe() for s in pending)}) keeps the pool serving"
            )
    if len(steps) > max_steps:
        raise ApplyError(f"the plan has {len(steps)} steps; at most {max_steps} (max_steps) in one apply")
    return steps


def inverse(step: Step, added_id: str | None = None) -> Step:
    """The step that undoes ``step`` (an added worker is removed by the id it got)."""
    if step.action == "add_worker":
        return Step("remove_worker", worker=added_id, from_role=step.role)
    if step.action == "set_role":
        return Step("set_role", role=step.from_role, worker=step.worker, from_role=step.role)
    if step.action == "set_device":
        return Step(
            "set_device",
            worker=step.worker,
            pool=step.pool,
            knobs=step.from_knobs,
            from_knobs=step.knobs,
            label="as before",
        )
    return Step("add_worker", role=step.from_role)
