"""The worker pool's records and what its state reads as: a worker's handle (:class:`WorkerHandle`),
a request in flight (:class:`RequestState`), the pool's errors, and the views derived from the
workers alone — the pool's health and layout (``/health``, ``/control/layout``), the paths a request
can be served by and whether removing a worker would strand the pool. Nothing here changes state;
:class:`serving.pool.WorkerPool` (the state machine on the router's loop) does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from serving.config import SamplingParams
from serving.worker import WorkerSpec

RESTART_DELAY_S = 0.5  # first back-off before a dead worker is restarted
MAX_RESTART_DELAY_S = 30.0
STABLE_S = 60.0  # a worker that ran this long before dying restarts after the first delay again

Workers = Mapping[str, "WorkerHandle"]


class NoWorkerError(RuntimeError):
    """No worker can take a request right now (HTTP 503)."""


class WorkerCallError(RuntimeError):
    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type


@dataclass(slots=True, eq=False)
class WorkerHandle:
    spec: WorkerSpec
    role: str
    process: Any
    conn: Any
    state: str = "starting"  # starting | ready | draining | stopped | dead
    info: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    inflight: set[str] = field(default_factory=set)
    ready: asyncio.Future | None = None
    started_s: float = field(default_factory=time.time)
    exited: bool = False  # the process is gone (set before the router decides what that means)
    restarts: int = 0  # times this worker id was restarted after dying
    next_restart_delay_s: float = RESTART_DELAY_S
    died_s: float | None = None
    exitcode: int | None = None
    restart_at_s: float | None = None  # wall time of the pending restart, while dead
    restart_task: asyncio.Task | None = None
    last_error: str | None = None  # why the last restart failed to start
    removed: bool = False  # stopped on purpose (control API, shutdown): never restarted

    @property
    def id(self) -> str:
        return self.spec.worker_id

    @property
    def load(self) -> tuple[int, float]:
        return len(self.inflight), self.stats.get("kv_usage", 0.0)

    @property
    def restart_pending(self) -> bool:
        return self.state == "dead" and self.restart_at_s is not None

    def restart_in_s(self) -> float | None:
        return None if self.restart_at_s is None else round(max(0.0, self.restart_at_s - time.time()), 2)

    def describe(self) -> dict[str, Any]:
        out = {
            "id": self.id,
            "role": self.role,
            "state": self.state,
            "device": self.spec.device,
            "device_name": self.info.get("device_name"),
            "emulated": self.info.get("emulated"),
            "fingerprint": self.info.get("fingerprint"),
            "pid": self.process.pid,
            "inflight": len(self.inflight),
            "stats": self.stats,
            "restarts": self.restarts,
        }
        if self.died_s is not None:
            out["last_death"] = {"died_s": self.died_s, "exitcode": self.exitcode}
        if self.state == "dead":
            out["restart_in_s"] = self.restart_in_s()
            if self.last_error:
                out["restart_error"] = self.last_error
        return out

    def status_note(self) -> str:
        """`worker-1 dead (exit code -9, restarting in 2.0 s)` and the like, for health reasons."""
        if self.state == "dead":
            when = self.restart_in_s()
            then = f"restarting in {when} s" if when is not None else "not restarting"
            return f"{self.id} dead (exit code {self.exitcode}, {then})"
        if self.state == "starting" and self.restarts:
            return f"{self.id} restarting (restart {self.restarts})"
        return f"{self.id} {self.state}"


@dataclass(slots=True, eq=False)
class RequestState:
    """A request as the router sees it, across its prefill and decode workers."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival_s: float
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    output_ids: list[int] = field(default_factory=list)
    token_ts: list[float] = field(default_factory=list)
    prefill_worker: str | None = None
    decode_worker: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None
    error: str | None = None
    attempts: int = 0
    finished_s: float | None = None
    # Called with each output token on the router's loop; True ends the request with finish reason
    # "stop" and aborts it on its workers (the router's stop-string match).
    check_stop: Callable[[int], bool] | None = None

    @property
    def done(self) -> bool:
        return self.finished_s is not None


def eligible(workers: Workers, role: str) -> list[WorkerHandle]:
    """The ready workers of ``role``."""
    return [w for w in workers.values() if w.role == role and w.state == "ready"]


def pool_mode(workers: Workers) -> str:
    """The layout the workers make up (dead ones included: they are being restarted)."""
    return _mode_of({w.role for w in workers.values()})


def serving_paths(workers: Workers) -> list[str]:
    """How a request can be served right now: "prefill+decode" and/or "mixed"."""
    paths = []
    if eligible(workers, "prefill") and eligible(workers, "decode"):
        paths.append("prefill+decode")
    if eligible(workers, "mixed"):
        paths.append("mixed")
    return paths


def strand_reason(workers: Workers, w: WorkerHandle, new_role: str | None = None) -> str | None:
    """Why removing `w` (or giving it `new_role`) would leave the pool unable to serve, else None.

    Workers that are ready, starting or dead with a restart pending count as able to serve.
    """
    live = [x for x in workers.values() if x.state in ("ready", "starting") or x.restart_pending]
    before = {x.role for x in live}
    after = {x.role for x in live if x is not w} | ({new_role} if new_role else set())
    if not _can_serve(before) or _can_serve(after):
        return None
    change = "removing it" if new_role is None else f"making it {new_role}"
    return (
        f"{w.id} is the last {w.role} worker that is ready or coming back; {change} would leave no "
        f"prefill+decode pair and no mixed worker to serve requests. Add another {w.role} worker "
        "first, or pass force=true"
    )


def pool_health(workers: Workers, worker_restarts: int, worker_deaths: int) -> dict[str, Any]:
    """`ok` (everything ready), `degraded` (serving, but a worker is dead, restarting or a role has
    no ready worker) or `unavailable` (no prefill+decode pair and no mixed worker is ready)."""
    roles: dict[str, dict[str, int]] = {}
    by_role: dict[str, list[WorkerHandle]] = {}
    for w in workers.values():
        counts = roles.setdefault(w.role, {s: 0 for s in ("ready", "starting", "draining", "dead")})
        counts[w.state] = counts.get(w.state, 0) + 1
        by_role.setdefault(w.role, []).append(w)
    reasons = []
    for role, ws in by_role.items():
        if not any(w.state == "ready" for w in ws):
            reasons.append(f"no ready {role} worker: " + "; ".join(w.status_note() for w in ws))
        else:
            reasons += [
                w.status_note() for w in ws if w.state == "dead" or (w.state == "starting" and w.restarts)
            ]
    paths = serving_paths(workers)
    if not paths:
        status = "unavailable"
        what = "no worker" if not workers else "no ready prefill+decode pair and no ready mixed worker"
        reasons.insert(0, f"no request can be served: {what}")
    else:
        status = "degraded" if reasons else "ok"
    return {
        "status": status,
        "mode": pool_mode(workers),
        "serving_mode": _serving_mode(paths),
        "serving": paths,
        "roles": roles,
        "ready_workers": [w.id for w in workers.values() if w.state == "ready"],
        "reasons": reasons,
        "worker_restarts": worker_restarts,
        "worker_deaths": worker_deaths,
        "restarts_by_worker": {w.id: w.restarts for w in workers.values()},
        # KV hand-off connections each live worker refused, by reason (kv_transfer.REJECT_REASONS)
        "kv_handoff_rejected": {
            w.id: w.stats["kv_rejected"] for w in workers.values() if "kv_rejected" in w.stats
        },
    }


def pool_layout(workers: Workers, worker_restarts: int, worker_deaths: int) -> dict[str, Any]:
    """Every worker (dead ones too, with exit code, time of death and pending restart) and the
    pool's status as /health reports it."""
    health = pool_health(workers, worker_restarts, worker_deaths)
    return {
        "workers": [w.describe() for w in workers.values()],
        "mode": health["mode"],
        "serving_mode": health["serving_mode"],
        "status": health["status"],
        "reasons": health["reasons"],
        "worker_restarts": worker_restarts,
        "worker_deaths": worker_deaths,
    }


def _can_serve(roles: set[str]) -> bool:
    return {"prefill", "decode"} <= roles or "mixed" in roles


def _mode_of(roles: set[str]) -> str:
    if not roles:
        return "none"
    if roles == {"mixed"}:
        return "aggregated"
    return "hybrid" if "mixed" in roles else "disaggregated"


def _serving_mode(paths: list[str]) -> str:
    if len(paths) == 2:
        return "hybrid"
    if paths:
        return "disaggregated" if paths[0] == "prefill+decode" else "aggregated"
    return "none"
