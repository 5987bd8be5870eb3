"""The serving stack in virtual time: a discrete-event simulation of a deployment.

The same pieces as the live stack decide what happens: requests are placed by
:func:`serving.routing.choose_route`, each replica's iterations are chosen by the live engine's
:class:`~serving.scheduler.Scheduler` and its :class:`~serving.block_manager.BlockManager` (paged KV,
admission control, preemption, chunked prefill), and every iteration's time, power, clock and
activities come from the GPU model (:func:`serving.devices.gpu_model.predict_iteration`) that the
emulated devices use. There is no model math and no sleeping: time jumps from event to event.

The loop, per event (arrival, iteration end, KV hand-off end): route or admit, then start the next
iteration of every replica that is idle and has work.

Its parts live beside it: ``state`` (replicas, requests, the result), ``telemetry_out`` (batches
and their order), ``executor`` (the GPU model's timing), ``records``, ``summary``, ``layout``,
``gc_pause``. A replica whose next iterations are plain decode steps takes them as one decode run
(:class:`~serving.engine_core.DecodeRun`; docs/SIMULATOR.md, ## Speed and validation).

Output (:class:`SimResult`): telemetry batches in the live stack's format (``docs/TELEMETRY.md``:
iteration events per GPU, request events with every token's time, control events), and per-replica
GPU busy intervals from which :mod:`serving.sim.samples` derives device samples the way an NVML
reader would (cumulative counters differenced over each sample period).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from serving.config import EngineConfig, ModelConfig, SamplingParams
from serving.devices.base import IterationWork
from serving.devices.gpu_model import kv_transfer_s
from serving.devices.gpu_specs import gpu_spec
from serving.engine_core import DecodeRun, Execution, iteration_values
from serving.routing import choose_route
from serving.scheduler import AdmissionError
from serving.sequence import Sequence as Seq
from serving.sim.executor import GpuModelExecutor, execution_of
from serving.sim.gc_pause import gc_paused
from serving.sim.layout import Layout, PoolSpec, check_layout
from serving.sim.records import Busy, RequestStats
from serving.sim.state import Replica, ReplicaEngine, SimGpu, SimRequest, SimResult
from serving.sim.telemetry_out import BATCH_EVENTS, SimTelemetry
from serving.trace import TraceRequest

__all__ = [
    "BATCH_EVENTS",
    "Replica",
    "SimGpu",
    "SimResult",
    "Simulation",
    "SimulationError",
    "gc_paused",
    "virtual_start_s",
]

BF16_BYTES = 2
RUN_ITERATIONS = 16  # the most iterations a decode run takes at once (those past an arrival are redone)

_ARRIVAL, _KV_DONE, _ITER_DONE = 0, 1, 2  # event kinds; at equal times, arrivals go first (the
# arrivals are not in the heap: the loop merges them in before any heap event of the same time)


class SimulationError(ValueError):
    """The simulation cannot run (bad trace, layout or options); the message says what and why."""


class Simulation:
    """One run of ``layout`` serving ``shape`` for ``requests`` (arrival times relative to 0).

    ``start_s`` is the UTC epoch second virtual time 0 maps to. ``scenario`` names the run (GPU
    UUIDs and telemetry carry it). ``progress(done_s, total_s)`` is called now and then.
    ``record_work`` keeps every iteration's start and work on its replica (``works``), for checks.
    ``iteration_model(work, pool)`` replaces the GPU model (e.g. a device model fitted to a live
    run's iterations); it returns an object with :class:`~serving.devices.gpu_model.IterationEstimate`'s
    fields. ``on_batch(batch)`` receives each telemetry batch as it is complete (then the result
    keeps none: a fleet's hour is millions of events). ``dispatch_delay_s`` is the front end's
    time from a request's arrival to its engine seeing it (the live router's HTTP handling,
    tokenization and pipe to the worker; 0: none): each request reaches routing and its engine
    that much after its arrival, which its telemetry and TTFT still count from. ``columnar``:
    ``on_batch`` takes each worker's batch as a :class:`~serving.telemetry_columns.IterationBatch`
    (the same events, kept as columns: what the store writes fastest) rather than its envelope.
    ``decode_runs``: a replica whose next iterations are plain decode steps of an unchanged batch
    takes up to :data:`RUN_ITERATIONS` of them at once (:class:`~serving.engine_core.DecodeRun`),
    cut short by an arrival or a KV hand-off reaching it; the results are those of one iteration at
    a time, bit for bit (off: the loop runs every iteration as one event; the check of that).
    """

    def __init__(
        self,
        layout: Layout,
        shape: ModelConfig,
        requests: Sequence[TraceRequest],
        *,
        start_s: float = 0.0,
        scenario: str = "sim",
        block_size: int = 16,
        progress: Callable[[float, float], None] | None = None,
        record_work: bool = False,
        iteration_model: Callable[[IterationWork, PoolSpec], Any] | None = None,
        on_batch: Callable[[dict[str, Any]], None] | None = None,
        dispatch_delay_s: float = 0.0,
        columnar: bool = False,
        decode_runs: bool = True,
    ) -> None:
        if not requests:
            raise SimulationError("the trace has no requests: nothing to simulate")
        if not (math.isfinite(dispatch_delay_s) and dispatch_delay_s >= 0):
            raise SimulationError(
                f"dispatch_delay_s must be a finite number >= 0 s, got {dispatch_delay_s!r}"
            )
        self.dispatch_delay_s = float(dispatch_delay_s)
        self.layout = layout
        self.shape = shape
        self.capacity = check_layout(layout, shape)
        self.spec = gpu_spec(layout.gpu)
        self.requests = sorted(requests, key=lambda r: r.arrival_s)
        self.start_s = float(start_s)
        self.scenario = scenario
        self.block_size = block_size
        self.progress = progress
        self.iteration_model = iteration_model
        self.replicas: list[Replica] = []
        index = 0
        device = f"simulated:{self.spec.key}"
        for pool in layout.pools:
            executor = GpuModelExecutor(
                self.spec,
                shape,
                pool,
                link=layout.tp_link,
                profile=layout.profile,
                iteration_model=iteration_model,
                dtype=layout.dtype,
            )
            blocks = pool.kv_blocks or max(1, self.capacity[pool.role] // block_size)
            cfg = EngineConfig(
                block_size=block_size,
                num_blocks=blocks,
                max_num_seqs=pool.max_num_seqs,
                max_num_batched_tokens=pool.max_num_batched_tokens,
                chunked_prefill=pool.chunked_prefill,
                max_model_len=shape.max_position,
            )
            for _ in range(pool.replicas):
                gpus = [SimGpu(index + k, f"GPU-sim-{scenario}-{index + k}") for k in range(pool.tp)]
                index += pool.tp
                replica = Replica(f"worker-{len(self.replicas)}", pool, gpus, cfg)
                replica.works = [] if record_work else None
                replica.core = ReplicaEngine(self, replica, executor, device)
                replica.intervals = Busy(executor.busy_table)
                replica.blocks = replica.core.scheduler.blocks
                self.replicas.append(replica)
        self._replicas_by_id = {r.id: r for r in self.replicas}
        self._by_role = {
            role: [r for r in self.replicas if r.role == role] for role in ("prefill", "decode", "mixed")
        }
        self._kv_bytes_per_token = shape.kv_bytes_per_token(BF16_BYTES)
        self._params_cache: dict[int, SamplingParams] = {}
        # telemetry, delivered in the order the live stack sends it (decode runs emit late: held)
        self._runs = decode_runs and iteration_model is None and not record_work
        self.out = SimTelemetry(
            on_batch,
            columnar,
            {r.id: r.core for r in self.replicas},
            self._horizon_s if self._runs else None,
        )
        self._columnar = self.out.columnar
        self._stats = RequestStats()
        # a decode run is timed up to the arrival this many ahead: each goes to one of the replicas,
        # so on a large fleet most do not cut a given run (1 on up to 7 replicas, 8 on 32)
        self._lookahead = max(1, len(self.replicas) // 4)
        self._timed_until_s = math.inf  # that arrival's time
        self._now_s = 0.0  # the current event's time (what routing reads a decode run's load at)

    def _emit(self, source: str, event: dict[str, Any], now_s: float) -> None:
        self.out.emit(source, event, now_s)

    def _horizon_s(self) -> float:
        """The earliest time a telemetry batch not yet made can be sent at: the start of the
        earliest decode run not yet committed (its iterations' events are emitted then)."""
        starts = [r.run.start_s for r in self.replicas if r.run is not None]
        return self.start_s + min(starts) if starts else math.inf

    # -- the run -----------------------------------------------------------------------------------

    def run(self) -> SimResult:
        """Simulate every request to completion; return the telemetry and the GPU busy intervals.

        Python's cyclic garbage collector is paused meanwhile (:func:`gc_paused`): the loop makes
        millions of short-lived containers and no reference cycles, which reference counting frees
        as they go, and each collection would walk every live sequence's token list (a sixth of
        the run's CPU time)."""
        with gc_paused():
            return self._run()

    def _run(self) -> SimResult:
        wall0 = time.perf_counter()
        # The clock runs from 0 (virtual seconds since start_s): epoch seconds would keep only
        # ~0.2 µs of precision through the sums. Emitted times are epoch seconds, start_s + t.
        t0 = self.start_s
        # Arrivals are read in order from the sorted trace, merged with the heap of the other
        # events (iteration ends, KV hand-offs: a few per replica), rather than pushed onto it:
        # the heap stays small. At equal times an arrival goes first, as _ARRIVAL orders it.
        requests = self.requests
        arrivals = [r.arrival_s + self.dispatch_delay_s for r in requests]
        heap: list[tuple[float, int, int, Any]] = []
        counter = itertools.count()
        states: dict[str, SimRequest] = {}
        self._states = states
        self._heap, self._counter = heap, counter
        self._finished = self._failed = 0
        self._emit(
            "router",
            {
                "type": "control",
                "ts_s": t0,
                "action": "start",
                "target": "pool",
                "before": None,
                "after": {"layout": self.layout.describe(), "scenario": self.scenario},
                "actor": "simulator",
            },
            t0,
        )
        last_progress = wall0
        total_s = self.requests[-1].arrival_s
        now = 0.0
        events = 0
        self._events_run = 0  # iteration ends taken inside decode runs (each an event of the loop)
        self._run_iterations = 0
        next_progress = 2048
        heappop, iteration_done, kv_arrived = heapq.heappop, self._iteration_done, self._kv_arrived
        arrive, a, n = self._arrive, 0, len(requests)
        next_arrival_s = arrivals[0]
        ahead = self._lookahead - 1
        self._timed_until_s = arrivals[ahead] if ahead < n else math.inf
        while True:
            if heap and heap[0][0] < next_arrival_s:
                now, kind, _, payload = heappop(heap)
                if kind == _ITER_DONE:
                    iteration_done(payload, now)
                else:
                    kv_arrived(payload, now)
            elif a < n:
                now = next_arrival_s
                arrive(a, requests[a], now)
                a += 1
                next_arrival_s = arrivals[a] if a < n else math.inf
                self._timed_until_s = arrivals[a + ahead] if a + ahead < n else math.inf
            else:
                break
            events += 1
            if self.progress is not None and events >= next_progress:
                next_progress = events + 2048
                wall = time.perf_counter()
                if wall - last_progress > 0.2:
                    last_progress = wall
                    self.progress(min(now, total_s), total_s)
        events += self._events_run
        end_s = t0 + max(now, total_s)
        for replica in self.replicas:
            replica.intervals.settle()
        self.out.flush_all(end_s)
        if self.progress is not None:
            self.progress(total_s, total_s)
        return SimResult(
            layout=self.layout,
            shape=self.shape,
            start_s=t0,
            end_s=end_s,
            batches=self.out.batches,
            replicas=self.replicas,
            requests=len(self.requests),
            finished=self._finished,
            failed=self._failed,
            iterations=sum(r.iterations for r in self.replicas),
            wall_s=time.perf_counter() - wall0,
            gpu_name=self.spec.name,
            events=events,
            stats=self._stats,
            batches_emitted=self.out.emitted,
            run_iterations=self._run_iterations,
        )

    def _params(self, max_tokens: int) -> SamplingParams:
        p = self._params_cache.get(max_tokens)
        if p is None:
            p = self._params_cache[max_tokens] = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        return p

    def _arrive(self, i: int, r: TraceRequest, now: float) -> None:
        rid = f"sim-{i}"
        req = SimRequest(rid, r.arrival_s, max(1, r.prompt_tokens), max(1, r.output_tokens))
        self._now_s = now
        route = choose_route(
            self._by_role["prefill"], self._by_role["decode"], self._by_role["mixed"], self._load
        )
        if route is None:  # pragma: no cover - check_layout guarantees a path
            raise SimulationError("the layout has no prefill+decode pair and no mixed pool")
        req.prefill, req.decode = route.prefill, route.decode
        if route.prefill.run is not None:
            self._interrupt(route.prefill, now)
        try:
            route.prefill.core.add_request(
                rid,
                [0] * req.prompt_tokens,
                self._params(req.output_tokens),
                arrival_s=req.arrival_s,
                handoff=route.disaggregated,
                token_times=req.token_ts,
            )
        except AdmissionError as e:
            self._fail(req, str(e), now)
            return
        route.prefill.inflight.add(rid)
        if route.disaggregated:
            route.decode.inflight.add(rid)
        self._states[rid] = req
        self._kick(route.prefill, now)

    def _kv_arrived(self, payload: tuple[SimRequest, list[int], SamplingParams], now: float) -> None:
        req, token_ids, params = payload
        req.kv_transfer_end_s = now
        replica = req.decode
        if replica.run is not None:
            self._interrupt(replica, now)
        replica.core.queue_prefilled(
            req.request_id,
            token_ids,
            req.prompt_tokens,
            params,
            req.prompt_tokens,
            arrival_s=req.arrival_s,
            token_times=req.token_ts,
        )
        self._kick(replica, now)

    def _load(self, replica: Replica) -> tuple[int, float]:
        # Replica.load without its two hops (once per replica of a role per arrival: 32 x 155k in
        # the 64-GPU hour); a replica in a decode run: its KV use at the arrival
        run = replica.run
        if run is None:
            return len(replica.inflight), replica.blocks.usage
        return len(replica.inflight), run.usage_at(self._now_s)

    def _kick(self, replica: Replica, now: float, runs: bool = True) -> None:
        """Start ``replica``'s next iteration at ``now`` if it is idle and has something to run (its
        next iterations as a decode run, when they are one and ``runs``)."""
        if replica.busy:
            return
        core = replica.core
        if not core.has_work():
            return
        if runs and self._runs:
            executor = core.executor
            if type(executor) is GpuModelExecutor and executor.iteration_model is None:
                run = core.decode_run(RUN_ITERATIONS)
                if run is not None:
                    executor.time_run(run, now, self._timed_until_s)
                    replica.run = run
                    replica.busy = True
                    heapq.heappush(
                        self._heap, (run.ends[-1], _ITER_DONE, next(self._counter), (replica, run, None))
                    )
                    return
        batch = core.begin(now)  # hand-offs admitted, the iteration scheduled
        if batch is None:
            return  # waiting for blocks: a finishing sequence or an arrival kicks it again
        execution = core.executor.execute(batch)
        est = execution.estimate
        end = execution.end_s
        tally = batch.work
        pool = replica.pool
        if batch.sched.preempted:
            for victim in batch.sched.preempted:
                state = self._states.get(victim.request_id)
                if state is not None:
                    state.preemptions += 1
        replica.intervals.add(
            end - est.busy_s,
            end,
            execution.busy,
            tally.context_tokens * self._kv_bytes_per_token // pool.tp,
        )
        replica.busy = True
        replica.iterations += 1
        if replica.works is not None:
            replica.works.append((now, tally))
        t0 = self.start_s
        values = iteration_values(batch, execution, core.scheduler.blocks.num_blocks, t0)
        self.out.emit_iteration(replica.id, len(replica.gpus), values, execution.extra, t0 + now)
        heapq.heappush(self._heap, (end, _ITER_DONE, next(self._counter), (replica, batch, execution)))

    def _iteration_done(self, payload: tuple[Replica, Any, Execution | None], now: float) -> None:
        replica, batch, execution = payload
        if execution is None:  # a decode run's last timed iteration ended
            run = batch
            k = run.k
            if len(run.ends) < k:  # timed up to an arrival that did not reach it: time on
                replica.core.executor.time_more(run, self._timed_until_s)
                self._events_run -= 1  # not an event of the iteration-by-iteration loop
                heapq.heappush(
                    self._heap, (run.ends[-1], _ITER_DONE, next(self._counter), (replica, run, None))
                )
                return
            self._commit(replica, run, k, k - 1 if run.last_finishes else k)
            if run.last_finishes:  # its last iteration's tokens as one (sequences finish): _token
                replica.core.update(
                    replica.core.run_batch(run, k - 1), execution_of(run.entries[-1], run.ends[-2])
                )
            self._events_run += k - 1
            replica.run = None
        else:
            replica.core.update(batch, execution)  # each token: _token
        replica.busy = False
        self._kick(replica, now)

    def _interrupt(self, replica: Replica, now: float) -> None:
        """Something reaches ``replica`` at ``now`` in a decode run: the run's iterations that ended
        before ``now`` are done, the one running at ``now`` goes on as a single iteration (begun at
        its start, as the iteration-by-iteration loop began it), the rest are dropped."""
        run = replica.run
        done = run.ended_before(now)
        self._commit(replica, run, done, done)
        self._events_run += done
        heap = self._heap
        for i, entry in enumerate(heap):
            if entry[3][1] is run:
                heap[i] = heap[-1]
                heap.pop()
                heapq.heapify(heap)
                break
        replica.busy = False
        self._kick(replica, run.ends[done - 1] if done else run.start_s, runs=False)
        replica.run = None  # after the kick: its events are still the run's (the telemetry horizon)

    def _commit(self, replica: Replica, run: DecodeRun, m: int, updated: int) -> None:
        """The first ``m`` iterations of ``replica``'s decode run happened (``updated`` of them
        applied here, the rest by ``EngineCore.update``): the engine's state, and each iteration's
        busy interval and events, as :meth:`_kick` and :meth:`_iteration_done` make them one by one."""
        if m <= 0:
            return
        core = replica.core
        core.commit_decode_run(run, m, updated)
        replica.iterations += m
        self._run_iterations += m
        t0 = self.start_s
        b = len(run.seqs)
        tp = len(replica.gpus)
        kv_per_gpu = self._kv_bytes_per_token
        pool_tp = replica.pool.tp
        total = run.num_blocks
        start = run.start_s
        ends, entries, works, free = run.ends, run.entries, run.works, run.free
        busy_s = [entry[0].busy_s for entry in entries[:m]]
        contexts = [work[3] for work in works[:m]]
        ends_m = ends[:m]
        replica.intervals.extend(
            [end - b_s for end, b_s in zip(ends_m, busy_s, strict=True)],
            ends_m,
            [entry[2] for entry in entries[:m]],
            [c * kv_per_gpu // pool_tp for c in contexts],
        )
        rows, extras, sent = [], [], []
        for j in range(m):
            est, extra, _busy = entries[j]
            end = ends[j]
            sent_s = t0 + start
            rows.append(
                (
                    sent_s,
                    t0 + end,
                    "decode",
                    b,
                    0,
                    b,
                    contexts[j],
                    total - free[j],
                    total,
                    0,
                    busy_s[j],
                    0.0,
                    est.time_s,
                    0.0,
                    est.flops or None,
                    est.hbm_bytes or None,
                )
            )
            extras.append(extra)
            sent.append(sent_s)
            start = end
        self.out.emit_iterations(replica.id, tp, rows, extras, sent)

    def _token(
        self, replica: Replica, seq: Seq, token: int, now: float, reason: str | None, first: bool
    ) -> None:
        """``seq`` got a token at ``now`` on ``replica``; ``reason``: it finished (and is released).
        Its first, last and hand-off tokens only: the engine records the others' times in
        ``seq.token_times``, the request's ``token_ts``."""
        req = self._states[seq.request_id]
        req.token_ts.append(now)
        if req.prefill_end_s is None:
            req.prefill_end_s = now
            req.first_scheduled_s = seq.first_scheduled_s
            req.prefill_start_s = seq.prefill_start_s
        if reason is not None:
            self._finish(req, now)
        elif seq.handoff:
            replica.inflight.discard(req.request_id)
            self._hand_off(req, seq, now)

    def _hand_off(self, req: SimRequest, seq: Seq, now: float) -> None:
        """Ship the prompt's KV to the decode replica over the layout's link."""
        try:
            req.decode.scheduler.check_admissible(req.prompt_tokens, req.output_tokens)
        except AdmissionError as e:
            req.decode.inflight.discard(req.request_id)
            self._states.pop(req.request_id, None)
            self._fail(req, f"decode {req.decode.id}: {e}", now)
            return
        nbytes = req.prompt_tokens * self._kv_bytes_per_token
        req.kv_transfer_start_s = now
        req.kv_transfer_bytes = nbytes
        done = now + kv_transfer_s(self.shape, req.prompt_tokens, self.layout.kv_link, tp=req.decode.pool.tp)
        payload = (req, list(seq.token_ids), seq.params)
        heapq.heappush(self._heap, (done, _KV_DONE, next(self._counter), payload))

    def _finish(self, req: SimRequest, now: float) -> None:
        self._finished += 1
        for r in (req.prefill, req.decode):
            if r is not None:
                r.inflight.discard(req.request_id)
        self._states.pop(req.request_id, None)
        self._emit_request(req, now, "ok", "length", None)

    def _fail(self, req: SimRequest, message: str, now: float) -> None:
        self._failed += 1
        self._emit_request(req, now, "error", "error", message)

    def _emit_request(self, req: SimRequest, now: float, status: str, reason: str, error: str | None) -> None:
        t0 = self.start_s

        def at(t: float | None) -> float | None:
            return None if t is None else t0 + t

        times = np.frombuffer(req.token_ts, dtype=np.float64)
        count = len(times)
        epoch = times + t0
        # a columnar run's router batches carry the array (TokenTimesBatch), an envelope the list
        tokens = epoch if self._columnar else epoch.tolist()
        first = float(epoch[0]) if count else None
        if status == "ok" and count:
            st = self._stats
            st.arrival_s.append(t0 + req.arrival_s)
            st.first_token_s.append(first)
            st.finish_s.append(t0 + now)
            st.prompt_tokens.append(req.prompt_tokens)
            st.output_tokens.append(count)
            if count > 1:
                st.itl_s.frombytes(np.diff(times).tobytes())
        self._emit(
            "router",
            {
                "type": "request",
                "request_id": req.request_id,
                "arrival_s": t0 + req.arrival_s,
                "first_scheduled_s": at(req.first_scheduled_s),
                "prefill_start_s": at(req.prefill_start_s),
                "prefill_end_s": at(req.prefill_end_s),
                "kv_transfer_start_s": at(req.kv_transfer_start_s),
                "kv_transfer_end_s": at(req.kv_transfer_end_s),
                "kv_transfer_bytes": req.kv_transfer_bytes,
                "first_token_s": first,
                "token_ts_s": tokens,
                "finish_s": t0 + now,
                "prompt_tokens": req.prompt_tokens,
                "output_tokens": count,
                "prefill_worker": req.prefill.id if req.prefill else None,
                "decode_worker": req.decode.id if req.decode else None,
                "status": status,
                "finish_reason": reason,
                "error": error,
                "attempts": 1,
                "preemptions": req.preemptions,
            },
            t0 + now,
        )


def virtual_start_s(requests: Sequence[TraceRequest], *, end_at_s: float | None = None) -> float:
    """A start time such that the trace's last arrival falls at ``end_at_s`` (default: now)."""
    end = time.time() if end_at_s is None else end_at_s
    span = max((r.arrival_s for r in requests), default=0.0)
    return math.floor(end - span)
