"""The discrete-event simulation: the live scheduler and routing in virtual time."""

import itertools

import numpy as np
import pytest

from serving.config import preset
from serving.scheduler import Scheduler
from serving.sim.layout import parse_layout
from serving.sim.simulator import Simulation, SimulationError
from serving.trace import TraceRequest, poisson_trace

SHAPE = preset("llama-3.1-8b")


def _run(layout: str, requests, **kw):
    return Simulation(
        parse_layout(layout), SHAPE, requests, start_s=1_800_000_000.0, scenario="t", **kw
    ).run()


def _events(result, kind):
    return [e for b in result.batches for e in b["events"] if e["type"] == kind]


@pytest.fixture(scope="module")
def trace():
    return poisson_trace(20.0, 300, prompt_tokens=(64, 2048), output_tokens=(8, 256), seed=3)


@pytest.fixture(scope="module")
def agg(trace):
    return _run("agg:2xh100-sxm", trace)


@pytest.fixture(scope="module")
def disagg(trace):
    return _run("1p1d:h100-sxm", trace)


def test_every_request_finishes_with_all_its_tokens(trace, agg):
    reqs = _events(agg, "request")
    assert len(reqs) == len(trace) == agg.finished
    assert all(r["status"] == "ok" and r["finish_reason"] == "length" for r in reqs)
    by_arrival = sorted(reqs, key=lambda r: r["arrival_s"])
    assert [r["output_tokens"] for r in by_arrival] == [t.output_tokens for t in trace]
    assert [r["prompt_tokens"] for r in by_arrival] == [t.prompt_tokens for t in trace]
    for r in reqs:
        ts = r["token_ts_s"]
        assert len(ts) == r["output_tokens"]
        assert all(b >= a for a, b in itertools.pairwise(ts))
        assert r["arrival_s"] <= r["first_scheduled_s"] <= r["prefill_start_s"] < r["prefill_end_s"]
        assert r["first_token_s"] == r["prefill_end_s"] == ts[0] and r["finish_s"] == ts[-1]


def test_replicas_run_the_live_scheduler_and_never_overlap_iterations(agg):
    for replica in agg.replicas:
        assert type(replica.scheduler) is Scheduler
        start = np.asarray(replica.intervals.start_s)
        end = np.asarray(replica.intervals.end_s)
        assert len(start) == replica.iterations > 0
        assert np.all(end > start)
        assert np.all(start[1:] >= end[:-1] - 1e-12)


def test_iteration_events_match_the_busy_intervals_and_carry_gpu_identity(agg):
    iters = _events(agg, "iteration")
    assert len(iters) == agg.iterations  # TP 1: one event per iteration
    uuids = {g.uuid for r in agg.replicas for g in r.gpus}
    assert {e["gpu_uuid"] for e in iters} == uuids
    assert {e["phase"] for e in iters} <= {"prefill", "decode", "mixed"}
    assert sum(e["decode_seqs"] for e in iters) + sum(1 for r in _events(agg, "request")) == sum(
        r["output_tokens"] for r in _events(agg, "request")
    )  # one token per prompt, the rest by decode


def test_least_loaded_routing_spreads_requests(agg):
    workers = [r["prefill_worker"] for r in _events(agg, "request")]
    counts = {w: workers.count(w) for w in set(workers)}
    assert len(counts) == 2 and min(counts.values()) > 0.35 * len(workers)


def test_disaggregated_requests_hand_off_their_kv(disagg):
    reqs = _events(disagg, "request")
    assert all(r["status"] == "ok" for r in reqs)
    multi = [r for r in reqs if r["output_tokens"] > 1]
    assert multi
    for r in multi:
        assert r["prefill_worker"] != r["decode_worker"]
        assert r["prefill_end_s"] <= r["kv_transfer_start_s"] < r["kv_transfer_end_s"] <= r["token_ts_s"][1]
        assert r["kv_transfer_bytes"] == r["prompt_tokens"] * SHAPE.kv_bytes_per_token(2)
    phases = {}
    for e in _events(disagg, "iteration"):
        phases.setdefault(e["worker"], set()).add(e["phase"])
    roles = {r.id: r.role for r in disagg.replicas}
    for worker, seen in phases.items():
        assert seen == ({"prefill"} if roles[worker] == "prefill" else {"decode"})


def test_tensor_parallel_replicas_emit_one_iteration_per_gpu():
    result = _run("agg:4xh100-sxm:tp2", poisson_trace(5.0, 40, seed=1))
    iters = _events(result, "iteration")
    assert len(iters) == 2 * result.iterations
    for replica in result.replicas:
        mine = {e["gpu_index"] for e in iters if e["worker"] == replica.id}
        assert mine == {g.index for g in replica.gpus} and len(mine) == 2


def test_a_small_kv_cache_preempts_and_still_finishes_everything():
    trace = poisson_trace(50.0, 120, prompt_tokens=(2000, 4000), output_tokens=(200, 400), seed=2)
    layout = parse_layout("agg:1xh100-sxm:gpu_memory_utilization=0.22")
    result = Simulation(layout, SHAPE, trace, start_s=0.0).run()
    reqs = _events(result, "request")
    assert len(reqs) == 120 and all(r["status"] == "ok" for r in reqs)
    assert sum(r["preemptions"] for r in reqs) > 0
    assert sum(e["preempted"] for e in _events(result, "iteration")) > 0


def test_a_request_too_long_for_the_model_fails_alone():
    trace = [TraceRequest(0.0, 200_000, 10), TraceRequest(0.1, 100, 10)]
    result = _run("agg:1xh100-sxm", trace)
    reqs = sorted(_events(result, "request"), key=lambda r: r["arrival_s"])
    assert reqs[0]["status"] == "error" and "exceeds the model's context" in reqs[0]["error"]
    assert reqs[1]["status"] == "ok"
    assert (result.finished, result.failed) == (1, 1)


def test_runs_are_deterministic(trace):
    a, b = _run("1p1d:h100-sxm", trace[:80]), _run("1p1d:h100-sxm", trace[:80])
    assert [r["token_ts_s"] for r in _events(a, "request")] == [
        r["token_ts_s"] for r in _events(b, "request")
    ]


def test_telemetry_batches_are_numbered_per_source(agg):
    seqs = {}
    for b in agg.batches:
        assert b["schema"] == "phaselens.telemetry" and b["version"] == 1
        seqs.setdefault(b["source"], []).append(b["seq"])
    assert set(seqs) == {"router", "worker-0", "worker-1"}
    assert all(s == list(range(len(s))) for s in seqs.values())


def test_an_empty_trace_is_refused():
    with pytest.raises(SimulationError, match="no requests"):
        Simulation(parse_layout("agg:1xh100-sxm"), SHAPE, [])
