"""Decode runs (issue 21, item 3): a replica whose next iterations are plain decode steps of an
unchanged batch takes them at once; the run, its telemetry, busy intervals and every request's
token times are those of the iteration-by-iteration loop, bit for bit."""

from __future__ import annotations

import json

import pytest

from serving.config import EngineConfig, SamplingParams, preset
from serving.devices.gpu_specs import gpu_spec
from serving.engine_core import EngineCore
from serving.sim.executor import GpuModelExecutor
from serving.sim.layout import parse_layout
from serving.sim.simulator import Simulation
from serving.trace import load_azure_trace, vendored_trace_path

SHAPE = preset("llama-3.1-70b")
LAYOUTS = (
    "agg:8xh100-sxm:tp2",  # four replicas routed among
    "1p1d:h100-sxm:tp2",  # KV hand-offs reaching a decode replica mid-run
    "agg:2xh100-sxm:tp2:kv_blocks=400",  # a small KV cache: runs cut before a preemption
)


def _run(layout: str, runs: bool):
    requests = load_azure_trace(vendored_trace_path(), duration_s=100)
    sim = Simulation(parse_layout(layout), SHAPE, requests, start_s=1.8e9, scenario="dr", decode_runs=runs)
    return sim.run()


def _busy(result) -> list[tuple]:
    cols = ("start_s", "end_s", "power_w", "sm_clock_mhz", "sm_active", "dram_active", "capped", "kv_bytes")
    return [tuple(getattr(r.intervals, c).tolist() for c in cols) for r in result.replicas]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_decode_runs_give_the_iteration_by_iteration_results(layout: str) -> None:
    fast, slow = _run(layout, True), _run(layout, False)
    assert slow.run_iterations == 0
    assert fast.run_iterations > 0
    if layout.startswith("agg:8"):
        assert fast.run_iterations > fast.iterations // 2  # most iterations went by runs
    assert (fast.iterations, fast.events, fast.finished, fast.end_s) == (
        slow.iterations,
        slow.events,
        slow.finished,
        slow.end_s,
    )
    # every batch, in the order sent (a run's events are emitted late and held for their place)
    assert [json.dumps(b, sort_keys=True) for b in fast.batches] == [
        json.dumps(b, sort_keys=True) for b in slow.batches
    ]
    assert _busy(fast) == _busy(slow)
    for name in ("arrival_s", "first_token_s", "finish_s", "itl_s", "output_tokens"):
        assert getattr(fast.stats, name) == getattr(slow.stats, name), name
    if "kv_blocks" in layout:
        iters = [e for b in slow.batches for e in b["events"] if e["type"] == "iteration"]
        assert sum(e["preempted"] for e in iters) > 0  # the case of a run cut before a preemption


def _engine() -> tuple[EngineCore, GpuModelExecutor]:
    pool = parse_layout("agg:2xh100-sxm:tp2").pools[0]
    executor = GpuModelExecutor(gpu_spec("h100-sxm"), SHAPE, pool)
    cfg = EngineConfig(
        block_size=16, num_blocks=64, max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=4096
    )
    core = EngineCore(cfg, executor, stop_token_ids=SHAPE.eos_token_ids)
    for i, (prompt, out) in enumerate(((30, 80), (17, 200), (64, 45))):
        core.add_request(
            f"r{i}", [0] * prompt, SamplingParams(max_tokens=out, ignore_eos=True), arrival_s=0.0
        )
        core._seqs[f"r{i}"].token_times = []
    return core, executor


def _state(core: EngineCore) -> tuple:
    seqs = sorted(core._seqs.values(), key=lambda s: s.request_id)
    return (
        [
            (s.request_id, len(s.token_ids), s.num_computed, list(s.block_table), list(s.token_times))
            for s in seqs
        ],
        sorted(core.scheduler.blocks._free),
        core.iterations,
    )


def test_an_engine_decode_run_is_its_steps() -> None:
    """EngineCore.decode_run + commit_decode_run leave the engine as that many begin/update steps."""
    a, ex_a = _engine()
    b, ex_b = _engine()
    now_a = now_b = 0.0
    for core in (a, b):  # the prompts, one step each
        now = 0.0
        while core.decode_run(16) is None:
            batch = core.begin(now)
            execution = core.executor.execute(batch)
            core.update(batch, execution)
            now = execution.end_s
        if core is a:
            now_a = now
        else:
            now_b = now
    assert now_a == now_b and _state(a) == _state(b)
    run = b.decode_run(16)
    assert run is not None and run.k == 16 and any(run.grows)  # blocks crossed within the run
    ex_b.time_run(run, now_b)
    assert not run.last_finishes
    b.commit_decode_run(run, run.k, run.k)
    for _ in range(run.k):
        batch = a.begin(now_a)
        assert batch.work == run.works[_] and batch.kv_blocks_used == run.num_blocks - run.free[_]
        execution = ex_a.execute(batch)
        a.update(batch, execution)
        now_a = execution.end_s
        assert now_a == run.ends[_]
    assert _state(a) == _state(b)


def test_a_run_is_timed_up_to_the_next_arrival_then_on() -> None:
    """time_run stops at the first iteration ending at or after ``until_s`` (an arrival may cut the
    run there); time_more goes on from it; the ends are those of timing the run at once."""
    core, ex = _engine()
    now = 0.0
    while core.decode_run(16) is None:
        batch = core.begin(now)
        execution = core.executor.execute(batch)
        core.update(batch, execution)
        now = execution.end_s
    whole = core.decode_run(16)
    lazy = core.decode_run(16)
    assert whole is not None and lazy is not None and whole.k == lazy.k == 16
    ex.time_run(whole, now)
    until_s = (whole.ends[3] + whole.ends[4]) / 2  # inside iteration 4
    ex.time_run(lazy, now, until_s)
    assert list(lazy.ends) == list(whole.ends[:5]) and len(lazy.entries) == 5
    ex.time_more(lazy, whole.ends[9])  # an arrival at an iteration's end: that iteration is the last
    assert list(lazy.ends) == list(whole.ends[:10])
    ex.time_more(lazy)
    assert list(lazy.ends) == list(whole.ends) and lazy.entries == whole.entries
