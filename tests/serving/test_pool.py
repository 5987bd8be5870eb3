"""The worker pool in-process with real worker processes: iteration errors, deaths and restarts."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable

import psutil
import pytest

from serving.config import EngineConfig, SamplingParams
from serving.metrics import ServingMetrics
from serving.pool import RequestState, WorkerPool, stop_fork_server
from serving.telemetry import TelemetryHub
from serving.worker import MAX_CONSECUTIVE_ITERATION_ERRORS, WorkerSpec

pytestmark = pytest.mark.slow

ENGINE = EngineConfig(kv_cache_bytes=8 * 2**20)


def spec(worker_id: str = "worker-0") -> WorkerSpec:
    return WorkerSpec(worker_id, "cpu", engine=ENGINE)


async def outcome(req: RequestState) -> tuple[str, object]:
    """("done", finish reason) or ("error", message) once the request ends."""
    while True:
        kind, *rest = await req.events.get()
        if kind != "token":
            return kind, rest[0]


async def until(check: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not reached: {what}")


def control_events(hub: TelemetryHub, pool: WorkerPool) -> list[dict]:
    pool.telemetry.flush()
    batches = hub.read({}, 10_000)["batches"]
    return [e for b in batches for e in b["events"] if e["type"] == "control"]


def run(scenario: Callable[[WorkerPool, TelemetryHub], Awaitable[None]], **pool_kw: object) -> None:
    async def main() -> None:
        hub = TelemetryHub()
        pool = WorkerPool(hub, **pool_kw)
        try:
            await scenario(pool, hub)
        finally:
            await pool.shutdown()
            hub.close()

    asyncio.run(main())


def test_an_iteration_error_fails_its_requests_and_the_worker_goes_on() -> None:
    async def scenario(pool: WorkerPool, hub: TelemetryHub) -> None:
        w = await pool.start_worker(spec(), "mixed")
        pid = w.process.pid
        # A token id past the vocabulary raises inside the model's forward (the HTTP API rejects
        # it earlier; the pool does not): the iteration fails, pinned to this request.
        bad = pool.submit([10**6], SamplingParams(max_tokens=4))
        kind, message = await outcome(bad)
        assert kind == "error"
        assert "worker worker-0 failed while running this request's batch (IndexError" in str(message)
        good = pool.submit([1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True))
        assert await outcome(good) == ("done", "length")
        assert len(good.output_ids) == 5
        assert w.process.is_alive() and w.process.pid == pid and w.state == "ready"
        assert pool.worker_deaths == 0
        await until(lambda: w.stats.get("iteration_errors") == 1, "iteration error counted in stats")
        text = ServingMetrics("tiny", lambda: pool).render().decode()
        assert 'phaselens:iteration_errors_total{engine="worker-0"} 1.0' in text
        # Failing iterations with no good one between: after MAX_CONSECUTIVE_ITERATION_ERRORS the
        # worker gives up (a broken worker must not fail every request) and the pool restarts it.
        errors = []
        for _ in range(MAX_CONSECUTIVE_ITERATION_ERRORS):
            errors.append(await outcome(pool.submit([10**6], SamplingParams(max_tokens=2))))
        assert all("failed while running this request's batch" in str(m) for _, m in errors[:-1])
        assert "worker worker-0 (mixed) died while serving this request" in str(errors[-1][1])
        await until(lambda: pool.health()["status"] == "ok", "worker-0 restarted")
        assert pool.worker_deaths == 1 and pool.workers["worker-0"].process.pid != pid

    run(scenario, restart_delay_s=0.1)


def test_a_dead_worker_is_restarted_with_back_off() -> None:
    async def scenario(pool: WorkerPool, hub: TelemetryHub) -> None:
        first = await pool.start_worker(spec(), "mixed")
        pids = [first.process.pid]
        for n in (1, 2):
            os.kill(pids[-1], signal.SIGKILL)
            await until(lambda n=n: pool.worker_deaths == n, f"death {n} seen")
            health = pool.health()
            assert health["status"] == "unavailable"
            assert health["roles"]["mixed"]["ready"] == 0
            assert any("worker-0 dead (exit code -9, restarting in" in r for r in health["reasons"])
            dead = pool.layout()["workers"][0]
            assert dead["state"] == "dead" and dead["last_death"]["exitcode"] == -9
            await until(lambda: pool.health()["status"] == "ok", f"restart {n} ready")
            w = pool.workers["worker-0"]
            assert w.restarts == n and w.role == "mixed" and w.process.pid not in pids
            pids.append(w.process.pid)
        req = pool.submit([5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))
        assert await outcome(req) == ("done", "length")
        events = control_events(hub, pool)
        died = [e for e in events if e["action"] == "worker_died"]
        restarted = [e for e in events if e["action"] == "worker_restarted"]
        assert [e["after"]["restart_in_s"] for e in died] == [0.2, 0.4]  # back-off doubles
        assert [e["after"]["restarts"] for e in restarted] == [1, 2]
        assert pool.worker_restarts == 2 and pool.health()["restarts_by_worker"] == {"worker-0": 2}

    run(scenario, restart_delay_s=0.2)


def test_a_worker_stopped_on_purpose_is_not_restarted() -> None:
    async def scenario(pool: WorkerPool, hub: TelemetryHub) -> None:
        w = await pool.start_worker(spec(), "mixed")
        await pool.stop_worker(w)
        await asyncio.sleep(0.5)  # longer than the back-off: a restart would have begun
        assert pool.workers == {} and pool.worker_deaths == 0
        assert not [e for e in control_events(hub, pool) if e["action"] == "worker_restarted"]
        assert pool.health()["status"] == "unavailable"

    run(scenario, restart_delay_s=0.1)


def _fork_server_processes() -> list[psutil.Process]:
    """This process's fork server (a child of this process, not of a stack another test started) and
    the workers forked from it, while they run."""
    found = []
    for p in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if "multiprocessing.forkserver" in " ".join(p.cmdline()):
                found += [q for q in (p, *p.children()) if q.status() != psutil.STATUS_ZOMBIE]
    return found


def test_workers_are_forked_from_one_fork_server_that_stops_with_the_router() -> None:
    pids: list[int] = []

    async def scenario(pool: WorkerPool, hub: TelemetryHub) -> None:
        for worker_id in ("worker-0", "worker-1"):
            w = await pool.start_worker(spec(worker_id), "mixed")
            pids.append(w.process.pid)
        running = {p.pid for p in _fork_server_processes()}
        assert set(pids) < running and len(running) == 3  # the two workers and their fork server
        req = pool.submit([1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True))
        assert await outcome(req) == ("done", "length")

    run(scenario)
    stop_fork_server()  # what the router does once its pool has shut down
    assert _fork_server_processes() == []
    # the next worker starts a fork server again
    run(lambda pool, hub: pool.start_worker(spec(), "mixed"))
    stop_fork_server()
    assert _fork_server_processes() == []


def test_the_hand_off_secret_reaches_the_workers_but_no_command_line_or_environment() -> None:
    """``ps`` (any user's) shows command lines: the per-stack secret must not be on one. The workers
    hold it -- a disaggregated request's KV goes through their authenticated connection."""
    secret = bytes(range(100, 132))

    async def scenario(pool: WorkerPool, hub: TelemetryHub) -> None:
        prefill = await pool.start_worker(spec("worker-0"), "prefill")
        decode = await pool.start_worker(spec("worker-1"), "decode")
        req = pool.submit([1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True))
        assert await outcome(req) == ("done", "length") and req.meta["kv_transfer_bytes"] > 0
        procs = [psutil.Process(w.process.pid) for w in (prefill, decode)] + _fork_server_processes()
        for p in [*procs, psutil.Process()]:
            seen = "\0".join(p.cmdline()) + "\0".join(f"{k}={v}" for k, v in p.environ().items())
            assert secret.hex() not in seen.lower() and secret.decode("latin-1") not in seen, p

    run(scenario, kv_secret=secret)
