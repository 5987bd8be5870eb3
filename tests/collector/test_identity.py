"""Which GPU a worker ran on: a real 1P1D stack on emulated GPUs, a real collector, the documented query."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from collector.store import Store
from serving.loadgen import run_load
from serving.trace import poisson_trace
from tests.collector.conftest import start_collector
from tests.collector.test_service import rows, wait_for
from tests.serving.conftest import TOKEN, Server, start_server, stop_server

pytestmark = pytest.mark.slow

STORE_MD = Path(__file__).resolve().parents[2] / "docs" / "STORE.md"


def gpu_activity_query() -> str:
    """The one query docs/STORE.md documents for "what did GPU X do", as written there."""
    text = STORE_MD.read_text()
    match = re.search(r"<!-- gpu-activity-query[^>]*-->\s*```sql\n(.*?)```", text, re.S)
    assert match, "docs/STORE.md lost its gpu-activity-query block"
    return match.group(1)


def iterations_caught_up(url: str) -> bool:
    """Every stored token's iteration is stored too (a token's ts_s is its iteration's end_s)."""
    tokens, iterations = rows(url, "tokens"), rows(url, "iterations")
    return bool(tokens and iterations) and max(i["end_s"] for i in iterations) >= max(
        t["ts_s"] for t in tokens
    )


@pytest.fixture(scope="module")
def stack() -> Iterator[Server]:
    server = start_server("--mode", "disaggregated", "--device", "emulated:h100-sxm")
    yield server
    stop_server(server)


def test_iterations_requests_and_joules_join_to_the_gpu_and_role_changes_are_tracked(
    stack: Server, tmp_path: Path
) -> None:
    devices = httpx.get(f"{stack.url}/v1/devices", timeout=30).json()["devices"]
    by_role = {d["role"]: d for d in devices}
    assert set(by_role) == {"prefill", "decode"}
    assert all(d["gpu_uuid"].startswith("GPU-emulated-") for d in devices)
    assert by_role["prefill"]["gpu_uuid"] != by_role["decode"]["gpu_uuid"]
    decode = by_role["decode"]

    db = tmp_path / "identity.duckdb"
    proc, url = start_collector(db, "--serving", stack.url, "--flush-interval", "0.2")
    try:
        wait_for(lambda: len(rows(url, "devices")) >= 2)
        report = run_load(
            stack.url, poisson_trace(20, 4, prompt_tokens=32, output_tokens=6, seed=1), progress=False
        )
        assert report.n_ok == 4
        wait_for(lambda: len(rows(url, "requests")) >= 4)
        # the decode worker becomes a mixed one: it then serves whole requests on the same GPU
        r = httpx.post(
            f"{stack.url}/control/workers/{decode['worker']}/role",
            json={"role": "mixed"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        wait_for(lambda: any(d["role"] == "mixed" for d in rows(url, "devices")))
        report = run_load(
            stack.url, poisson_trace(20, 3, prompt_tokens=32, output_tokens=6, seed=2), progress=False
        )
        assert report.n_ok == 3
        wait_for(lambda: len(rows(url, "requests")) >= 7)
        wait_for(lambda: iterations_caught_up(url))  # workers' batches may trail the router's
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        httpx.post(
            f"{stack.url}/control/workers/{decode['worker']}/role",
            json={"role": "decode"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=60,
        )

    with Store.open(db, read_only=True) as store:
        # every iteration carries its GPU; every sample of the stack its worker and role
        iters = store.query("SELECT worker, gpu_uuid, gpu_index, role FROM iterations_full")
        assert len(iters) and iters["gpu_uuid"].notna().all() and iters["role"].notna().all()
        for _, it in iters.iterrows():
            owner = next(d for d in devices if d["worker"] == it["worker"])
            assert (it["gpu_uuid"], it["gpu_index"]) == (owner["gpu_uuid"], owner["gpu_index"])
        samples = store.query("SELECT uuid, worker, role FROM gpu_samples_full")
        assert samples["worker"].notna().all() and samples["role"].notna().all()

        spans = store.query(gpu_activity_query(), {"uuid": decode["gpu_uuid"]})
        assert spans["worker"].tolist() == [decode["worker"], decode["worker"]]
        assert spans["role"].tolist() == ["decode", "mixed"]
        as_decode, as_mixed = spans.iloc[0], spans.iloc[1]
        assert as_decode["until_s"] == as_mixed["since_s"]
        assert as_decode["requests"] == 4 and as_decode["decoded"] == 4 and as_decode["prefilled"] == 0
        assert as_decode["decode_iterations"] > 0 and not as_decode["prefill_iterations"]
        assert as_mixed["requests"] == 3 and as_mixed["prefilled"] == 3 and as_mixed["decoded"] == 3
        assert as_mixed["iterations"] > 0
        assert (spans["energy_j"] > 0).all() and spans["emulated"].all()
        # the iterations of the GPU's spans are exactly the iterations that name the GPU
        total = store.query("SELECT count(*) AS n FROM iterations WHERE gpu_uuid = ?", [decode["gpu_uuid"]])[
            "n"
        ][0]
        assert spans["iterations"].sum() == total
        # the role change is in the control events too
        changes = store.query("SELECT target, after FROM control_events WHERE action = 'set_role'")
        assert changes["target"].tolist() == [decode["worker"]]
        # the emulated GPU's lag is kept: per iteration, as a host-bound share per sample and as the
        # device's own counters, which agree with the iterations stored
        lag = store.query(
            "SELECT count(*) AS n, count(lag_s) AS with_lag, count(modeled_s) AS with_modeled,"
            " count(*) FILTER (WHERE lag_s > 0) AS lagged FROM iterations WHERE gpu_uuid = ?",
            [decode["gpu_uuid"]],
        ).iloc[0]
        assert lag["n"] == lag["with_lag"] == lag["with_modeled"] > 0
        marked = store.query("SELECT count(host_bound_pct) AS n FROM gpu_samples WHERE emulated")["n"][0]
        assert marked > 0
        counters = store.query(
            """SELECT e.* FROM emulation_samples e JOIN gpu_samples s USING (node, source, device, "index", ts_s)
               WHERE e."index" = ? ORDER BY e.ts_s""",
            [decode["gpu_index"]],
        )
        assert len(counters) > 0 and counters["uptime_s"].is_monotonic_increasing
        last = counters.iloc[-1]
        assert last["iterations_total"] >= lag["n"]  # the device counted every iteration stored
        assert last["lagged_iterations_total"] <= last["iterations_total"]
        assert last["lagged_iterations_total"] + last["paced_iterations_total"] <= last["iterations_total"]
