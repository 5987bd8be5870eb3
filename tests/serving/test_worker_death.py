"""Worker deaths in the real stack: kill -9 of a worker process that has requests in flight.

The victim is stopped (SIGSTOP) before the requests are sent, so the requests routed to it are
certainly in flight on it when it is killed (SIGKILL); nothing in the stack is mocked.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.serving.conftest import TOKEN, Server, start_server, stop_server
from tests.serving.test_server import complete, read_telemetry, stream_many

pytestmark = pytest.mark.slow

HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = 180.0) -> Any:
    """Poll `check` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not reached: {what}")


def health(server: Server) -> tuple[int, dict]:
    r = httpx.get(f"{server.url}/health", timeout=30)
    return r.status_code, r.json()


def worker(server: Server, worker_id: str) -> dict:
    return next(w for w in server.layout()["workers"] if w["id"] == worker_id)


def kill_with_requests_in_flight(
    server: Server, victim: dict, n: int, max_tokens: int, expect: int = 1
) -> tuple[list, int, tuple[int, dict]]:
    """Stop `victim`, send `n` streams, kill -9 it once `expect` requests are routed to it.

    Returns the stream results, how many requests were in flight on the victim just before the
    kill (more may be routed to it in between: they fail too), and the first /health (status code,
    body) that saw the death (the restart comes at least 0.5 s later).
    """
    os.kill(victim["pid"], signal.SIGSTOP)

    async def scenario() -> tuple[list, int, tuple[int, dict]]:
        load = asyncio.create_task(stream_many(server.url, n, max_tokens))
        async with httpx.AsyncClient(base_url=server.url, headers=HEADERS, timeout=30) as c:
            for _ in range(600):
                await asyncio.sleep(0.05)
                layout = (await c.get("/control/layout")).json()
                mine = next(w for w in layout["workers"] if w["id"] == victim["id"])
                if mine["inflight"] >= expect:
                    break
            await asyncio.sleep(0.3)  # let the rest of the requests be routed
            inflight = next(
                w for w in (await c.get("/control/layout")).json()["workers"] if w["id"] == victim["id"]
            )["inflight"]
            os.kill(victim["pid"], signal.SIGKILL)
            for _ in range(600):
                r = await c.get("/health")
                if r.json()["status"] != "ok":
                    break
                await asyncio.sleep(0.01)
        return await load, inflight, (r.status_code, r.json())

    return asyncio.run(scenario())


def metrics(server: Server) -> dict[str, list]:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_a_request_whose_worker_died_is_not_retried_and_the_worker_restarts() -> None:
    server = start_server("--mode", "aggregated", "--workers", "2")
    try:
        victim, survivor = server.layout()["workers"]
        results, inflight, (status, body) = kill_with_requests_in_flight(server, victim, 4, 20)
        assert status == 200 and body["status"] == "degraded", body  # worker-1 still serves
        failed = [r for r in results if r["error"]]
        ok = [r for r in results if r["error"] is None]
        # Before its first token a request used to be re-dispatched to the next worker; a poison
        # request would kill that one too. Now it fails with a message that says why.
        assert len(failed) >= inflight >= 1 and ok, results
        for r in failed:
            assert "worker worker-0 (mixed) died while serving this request (exit code -9)" in r["error"]
            assert "not retried (possible poison request)" in r["error"]
        assert all(r["done"] and r["chunks"] == 20 for r in ok)
        assert worker(server, survivor["id"])["pid"] == survivor["pid"]  # the survivor was never touched
        wait_for(lambda: health(server)[1]["status"] == "ok", "worker-0 restarted")
        restarted = worker(server, "worker-0")
        assert restarted["restarts"] == 1 and restarted["pid"] != victim["pid"]
        assert restarted["last_death"]["exitcode"] == -9
        status, body = health(server)
        assert status == 200 and body["worker_restarts"] == 1 and body["restarts_by_worker"]["worker-0"] == 1
        samples = metrics(server)
        assert [s.value for s in samples["phaselens:worker_restarts"] if s.name.endswith("_total")] == [1.0]
        for i in range(3):
            assert complete(server.url, f"after the restart {i}", max_tokens=4)["usage"]["completion_tokens"]
        events = [e for e in read_telemetry(server.url) if e["type"] == "control"]
        restart = next(e for e in events if e["action"] == "worker_restarted")
        assert restart["target"] == "worker-0" and restart["after"]["pid"] == restarted["pid"]
        assert restart["before"]["exitcode"] == -9
    finally:
        stop_server(server)


def test_prefill_and_decode_deaths_in_disaggregated_mode() -> None:
    server = start_server("--mode", "disaggregated", "--prefill-workers", "2", "--decode-workers", "2")
    try:
        for victim_id, role in (("worker-0", "prefill"), ("worker-2", "decode")):
            victim = worker(server, victim_id)
            assert victim["role"] == role
            results, inflight, (status, body) = kill_with_requests_in_flight(server, victim, 6, 16)
            # The pool notices at once and restarts after 0.5 s and a process start: degraded between.
            assert status == 200 and body["status"] == "degraded", body
            assert any(victim_id in r for r in body["reasons"]), body
            failed = [r for r in results if r["error"]]
            ok = [r for r in results if r["error"] is None]
            assert len(failed) >= inflight >= 1 and ok, (role, results)
            for r in failed:
                assert f"worker {victim_id} ({role}) died while serving this request" in r["error"]
            assert all(r["done"] and r["chunks"] == 16 for r in ok)
            wait_for(lambda: health(server)[1]["status"] == "ok", f"{victim_id} restarted")
            restarted = worker(server, victim_id)
            assert restarted["restarts"] == 1 and restarted["role"] == role
            assert restarted["pid"] != victim["pid"]
        # The restarted workers serve again: with all loads equal the first of each role gets work.
        results = asyncio.run(stream_many(server.url, 4, 6))
        assert all(r["done"] and r["error"] is None for r in results)
        requests = [e for e in read_telemetry(server.url) if e["type"] == "request" and e["status"] == "ok"]
        last = requests[-4:]
        assert any(e["prefill_worker"] == "worker-0" for e in last)
        assert any(e["decode_worker"] == "worker-2" for e in last)
        assert health(server)[1]["worker_restarts"] == 2
    finally:
        stop_server(server)


def test_dead_worker_is_reported_removable_and_the_last_of_a_role_is_guarded() -> None:
    # A long back-off keeps the dead worker dead for the whole test.
    server = start_server(
        "--mode",
        "disaggregated",
        "--prefill-workers",
        "1",
        "--decode-workers",
        "1",
        "--restart-delay-s",
        "600",
    )
    try:
        with server.control() as c:
            r = c.delete("/control/workers/worker-1")
            assert r.status_code == 409, r.text
            message = r.json()["error"]["message"]
            assert "worker-1 is the last decode worker" in message and "force=true" in message
            r = c.post("/control/workers/worker-0/role", json={"role": "decode"})
            assert r.status_code == 409 and "making it decode would leave" in r.json()["error"]["message"]
            for r in (
                c.delete("/control/workers/worker-1", params={"timeout_s": "abc"}),
                c.post("/control/workers/worker-0/role", json={"role": "prefill", "timeout_s": "abc"}),
            ):
                assert r.status_code == 400, r.text
                assert r.json()["error"]["param"] == "timeout_s"
                assert "'timeout_s' must be a number of seconds" in r.json()["error"]["message"]
        assert health(server)[1]["status"] == "ok"

        decode = worker(server, "worker-1")
        results, inflight, _ = kill_with_requests_in_flight(server, decode, 2, 8, expect=2)
        assert inflight == 2 and all("worker worker-1 (decode) died" in r["error"] for r in results)
        status, body = wait_for(
            lambda: (h := health(server))[1]["roles"]["decode"]["dead"] and h, "worker-1 seen dead"
        )
        assert status == 503 and body["status"] == "unavailable"
        assert body["reasons"][0].startswith("no request can be served")
        assert any(
            r.startswith("no ready decode worker: worker-1 dead (exit code -9, restarting in")
            for r in body["reasons"]
        )
        layout = server.layout()
        assert (layout["mode"], layout["serving_mode"], layout["status"]) == (
            "disaggregated",
            "none",
            "unavailable",
        )
        dead = next(w for w in layout["workers"] if w["id"] == "worker-1")
        assert dead["state"] == "dead" and dead["last_death"]["exitcode"] == -9
        assert dead["last_death"]["died_s"] > 0 and dead["restart_in_s"] > 0 and dead["stats"] == {}
        samples = metrics(server)
        assert {"role": "decode", "state": "dead"} in [s.labels for s in samples["phaselens:workers"]]
        for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
            assert [s.labels["engine"] for s in samples[gauge]] == ["worker-0"], gauge
        r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
        assert r.status_code == 503 and "worker-1 dead" in r.json()["error"]["message"]

        with server.control() as c:
            r = c.get("/control/workers/worker-1/device")
            assert r.status_code == 409 and "worker-1 dead" in r.json()["error"]["message"]
            assert c.delete("/control/workers/worker-1").status_code == 409  # it would come back
            r = c.delete("/control/workers/worker-1", params={"force": "true"})
            assert r.status_code == 200, r.text
            assert [w["id"] for w in r.json()["workers"]] == ["worker-0"]
            assert r.json()["serving_mode"] == "none"
            added = c.post("/control/workers", json={"role": "decode"})
            assert added.status_code == 201, added.text
            assert added.json()["id"] == "worker-2"  # a removed worker's id is not reused
        assert health(server)[0] == 200
        assert health(server)[1]["status"] == "ok"
        assert complete(server.url, "served again", max_tokens=3)["usage"]["completion_tokens"] >= 1
        new_id = added.json()["id"]
        with server.control() as c:
            assert c.delete(f"/control/workers/{new_id}").status_code == 409
            assert c.delete(f"/control/workers/{new_id}", params={"force": "true"}).status_code == 200
        assert health(server)[0] == 503
        assert [w["id"] for w in server.layout()["workers"]] == ["worker-0"]  # not restarted
        controls = [e for e in read_telemetry(server.url) if e["type"] == "control"]
        removed = [e for e in controls if e["action"] == "remove_worker"]
        assert [e["target"] for e in removed] == ["worker-1", new_id]
        before = next(w for w in removed[0]["before"]["workers"] if w["id"] == "worker-1")
        assert before["state"] == "dead"
        assert not [e for e in controls if e["action"] == "worker_restarted"]
    finally:
        stop_server(server)
