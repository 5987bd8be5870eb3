"""The serving stack in virtual time: a discrete-event simulation of a deployment.

The same pieces as the live stack decide what happens: requests are placed by
:func:`serving.routing.choose_route`, each replica's iterations are chosen by the live engine's
:class:`~serving.scheduler.Scheduler` and its :class:`~serving.block_manager.BlockManager` (paged KV,
admission control, preemption, chunked prefill), and every iteration's time, power, clock and
activities come from the GPU model (:func:`serving.devices.gpu_model.predict_iteration`) that the
emulated devices use. There is no model math and no sleeping: time jumps from event to event.

The loop, per event (arrival, iteration end, KV hand-off end): route or admit, then start the next
iteration of every replica that is idle and has work.

Over 600 lines for a reason: the event loop and its per-replica state are one hot path (every line is
run per event of an hour-long fleet); its separable parts already live beside it (``records``, ``executor``,
``summary``, ``layout``). A split of the run's set-up from its loop is the next step when it grows.

Output (:class:`SimResult`): telemetry batches in the live stack's format (``docs/TELEMETRY.md``:
iteration events per GPU, request events with every token's time, control events), and per-replica
GPU busy intervals from which :mod:`serving.sim.samples` derives device samples the way an NVML
reader would (cumulative counters differenced over each sample period).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import heapq
import itertools
import math
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from serving.block_manager import BlockManager
from serving.config import EngineConfig, ModelConfig, SamplingParams
from serving.devices.base import IterationWork
from serving.devices.gpu_model import kv_transfer_s
from serving.devices.gpu_specs import gpu_spec
from serving.engine_core import Batch, EngineCore, Execution, iteration_values
from serving.routing import choose_route
from serving.scheduler import AdmissionError, Scheduler
from serving.sequence import Sequence as Seq
from serving.sim.executor import GpuModelExecutor
from serving.sim.layout import Layout, PoolSpec, check_layout
from serving.sim.records import Busy, RequestStats
from serving.telemetry import envelope
from serving.telemetry_columns import IterationBatch, TokenTimesBatch
from serving.trace import TraceRequest

BATCH_EVENTS = 4096  # events per telemetry batch (the live stack batches by time; the size is free)
BF16_BYTES = 2

_ARRIVAL, _KV_DONE, _ITER_DONE = 0, 1, 2  # event kinds; at equal times, arrivals go first (the
# arrivals are not in the heap: the loop merges them in before any heap event of the same time)


class SimulationError(ValueError):
    """The simulation cannot run (bad trace, layout or options); the message says what and why."""


@dataclass(frozen=True, slots=True)
class SimGpu:
    index: int
    uuid: str


@dataclass(slots=True)
class _IterationRows:
    """A replica's iteration events not yet in a batch: one row of values per iteration
    (:func:`~serving.engine_core.iteration_values`), ``skip`` GPUs of the first already sent."""

    rows: list[tuple[Any, ...]] = field(default_factory=list)
    extras: list[dict[str, Any] | None] = field(default_factory=list)
    skip: int = 0
    events: int = 0  # events pending: len(rows) * tp - skip


class Replica:
    """One engine (a worker) of the deployment on ``tp`` GPUs, in virtual time: the live engine's
    step (:class:`~serving.engine_core.EngineCore`) with the GPU model as its executor."""

    __slots__ = (
        "blocks",
        "busy",
        "core",
        "engine_cfg",
        "gpus",
        "id",
        "inflight",
        "intervals",
        "iterations",
        "pool",
        "works",
    )

    def __init__(self, wid: str, pool: PoolSpec, gpus: list[SimGpu], engine_cfg: EngineConfig) -> None:
        self.id = wid
        self.pool = pool
        self.gpus = gpus
        self.engine_cfg = engine_cfg
        self.core: _ReplicaEngine | None = None  # set by the Simulation
        self.blocks: BlockManager | None = None  # its scheduler's, set with it (read per arrival)
        self.inflight: set[str] = set()
        self.busy = False
        self.intervals = Busy()
        self.iterations = 0
        self.works: list[Any] | None = None  # each iteration's tally, when the run records them

    @property
    def role(self) -> str:
        return self.pool.role

    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    @property
    def load(self) -> tuple[int, float]:
        return len(self.inflight), self.core.scheduler.blocks.usage

    def has_work(self) -> bool:
        return self.core.has_work()


class _ReplicaEngine(EngineCore):
    """A replica's engine: the shared step; each token goes to the simulation's request state."""

    _collects_outputs = False

    def __init__(self, sim: Simulation, replica: Replica, executor: GpuModelExecutor, device: str) -> None:
        super().__init__(
            replica.engine_cfg,
            executor,
            worker_id=replica.id,
            device=device,
            gpus=[(g.uuid, g.index) for g in replica.gpus],
            stop_token_ids=sim.shape.eos_token_ids,
            time_offset_s=sim.start_s,
        )
        # each token straight to the simulation (an instance attribute: one call per token, the hot path)
        self._on_token = functools.partial(sim._token, replica)


@dataclass(slots=True)
class _Request:
    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefill: Replica | None = None
    decode: Replica | None = None
    first_scheduled_s: float | None = None
    prefill_start_s: float | None = None
    prefill_end_s: float | None = None
    kv_transfer_start_s: float | None = None
    kv_transfer_end_s: float | None = None
    kv_transfer_bytes: int | None = None
    # every token's time (virtual s), packed: read once at the end as an array, not as float objects
    # scattered over the run's memory
    token_ts: array = field(default_factory=lambda: array("d"))
    preemptions: int = 0


@dataclass(slots=True)
class SimResult:
    """What a simulation produced; times are UTC epoch seconds of the virtual clock."""

    layout: Layout
    shape: ModelConfig
    start_s: float
    end_s: float
    batches: list[dict[str, Any]]  # empty when the run streamed them to ``on_batch``
    replicas: list[Replica]
    requests: int
    finished: int
    failed: int
    iterations: int
    wall_s: float
    gpu_name: str
    events: int = 0
    stats: RequestStats = field(default_factory=RequestStats)
    batches_emitted: int = 0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def gpus(self) -> list[tuple[Replica, SimGpu]]:
        return [(r, g) for r in self.replicas for g in r.gpus]


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
                replica.core = _ReplicaEngine(self, replica, executor, device)
                replica.intervals = Busy(executor.busy_table)
                replica.blocks = replica.core.scheduler.blocks
                self.replicas.append(replica)
        self._replicas_by_id = {r.id: r for r in self.replicas}
        self._by_role = {
            role: [r for r in self.replicas if r.role == role] for role in ("prefill", "decode", "mixed")
        }
        self._kv_bytes_per_token = shape.kv_bytes_per_token(BF16_BYTES)
        self._params_cache: dict[int, SamplingParams] = {}
        # telemetry
        self._batches: list[dict[str, Any]] = []
        self._on_batch = on_batch
        self._batches_emitted = 0
        self._stats = RequestStats()
        self._columnar = columnar and on_batch is not None
        # per source, in the order of its first event: the router's events, a worker's iteration rows
        self._pending_events: dict[str, list[dict[str, Any]] | _IterationRows] = {}
        self._seq: dict[str, int] = {}

    # -- telemetry -------------------------------------------------------------------------------

    def _emit(self, source: str, event: dict[str, Any], now_s: float) -> None:
        events = self._pending_events.setdefault(source, [])
        events.append(event)
        if len(events) >= BATCH_EVENTS:
            self._flush_source(source, now_s)

    def _flush_source(self, source: str, now_s: float) -> None:
        events = self._pending_events.get(source)
        if isinstance(events, _IterationRows):
            if events.events:
                self._flush_iterations(source, events, now_s, events.events)
            return
        if not events:
            return
        self._pending_events[source] = []
        batch = envelope(source, self._next_seq(source), now_s, 0, events)
        self._deliver(TokenTimesBatch(batch) if self._columnar else batch)

    def _next_seq(self, source: str) -> int:
        seq = self._seq.get(source, 0)
        self._seq[source] = seq + 1
        return seq

    def _deliver(self, batch: dict[str, Any] | IterationBatch) -> None:
        self._batches_emitted += 1
        if self._on_batch is None:
            self._batches.append(batch)
        else:
            self._on_batch(batch)

    def _emit_iteration(self, replica: Replica, values: tuple[Any, ...], extra: Any, now_s: float) -> None:
        """Queue an iteration's events (one per GPU of ``replica``); a full batch goes out."""
        pending = self._pending_events.get(replica.id)
        if pending is None:
            pending = self._pending_events[replica.id] = _IterationRows()
        pending.rows.append(values)
        pending.extras.append(extra)
        pending.events += len(replica.gpus)
        if pending.events >= BATCH_EVENTS:  # the batch ends with its BATCH_EVENTS-th event
            self._flush_iterations(replica.id, pending, now_s, BATCH_EVENTS)

    def _flush_iterations(self, source: str, pending: _IterationRows, now_s: float, n: int) -> None:
        replica = self._replicas_by_id[source]
        core = replica.core
        tp = len(core.gpus)
        end = pending.skip + n  # events of the rows taken, counted from rows[0]'s first GPU
        taken = -(-end // tp)
        batch = IterationBatch(
            source,
            self._next_seq(source),
            now_s,
            source,
            core.device_name,
            tuple(core.gpus),
            pending.rows[:taken],
            pending.extras[:taken],
            n,
            pending.skip,
        )
        keep = taken - (1 if end % tp else 0)  # a row whose last GPUs are not sent stays
        del pending.rows[:keep], pending.extras[:keep]
        pending.skip = end % tp
        pending.events -= n
        if self._columnar:
            batch.columns()  # now, while its rows are in the cache; the store reads them later
            self._deliver(batch)
        else:
            self._deliver(batch.envelope())

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
        states: dict[str, _Request] = {}
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
        heappop, iteration_done, kv_arrived = heapq.heappop, self._iteration_done, self._kv_arrived
        arrive, a, n = self._arrive, 0, len(requests)
        next_arrival_s = arrivals[0]
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
            else:
                break
            events += 1
            if self.progress is not None and events % 2048 == 0:
                wall = time.perf_counter()
                if wall - last_progress > 0.2:
                    last_progress = wall
                    self.progress(min(now, total_s), total_s)
        end_s = t0 + max(now, total_s)
        for replica in self.replicas:
            replica.intervals.settle()
        for source in list(self._pending_events):
            self._flush_source(source, end_s)
        if self.progress is not None:
            self.progress(total_s, total_s)
        return SimResult(
            layout=self.layout,
            shape=self.shape,
            start_s=t0,
            end_s=end_s,
            batches=self._batches,
            replicas=self.replicas,
            requests=len(self.requests),
            finished=self._finished,
            failed=self._failed,
            iterations=sum(r.iterations for r in self.replicas),
            wall_s=time.perf_counter() - wall0,
            gpu_name=self.spec.name,
            events=events,
            stats=self._stats,
            batches_emitted=self._batches_emitted,
        )

    def _params(self, max_tokens: int) -> SamplingParams:
        p = self._params_cache.get(max_tokens)
        if p is None:
            p = self._params_cache[max_tokens] = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        return p

    def _arrive(self, i: int, r: TraceRequest, now: float) -> None:
        rid = f"sim-{i}"
        req = _Request(rid, r.arrival_s, max(1, r.prompt_tokens), max(1, r.output_tokens))
        route = choose_route(self._by_role["prefill"], self._by_role["decode"], self._by_role["mixed"], _load)
        if route is None:  # pragma: no cover - check_layout guarantees a path
            raise SimulationError("the layout has no prefill+decode pair and no mixed pool")
        req.prefill, req.decode = route.prefill, route.decode
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

    def _kv_arrived(self, payload: tuple[_Request, list[int], SamplingParams], now: float) -> None:
        req, token_ids, params = payload
        req.kv_transfer_end_s = now
        replica = req.decode
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

    def _kick(self, replica: Replica, now: float) -> None:
        """Start ``replica``'s next iteration at ``now`` if it is idle and has something to run."""
        if replica.busy:
            return
        core = replica.core
        if not core.has_work():
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
        self._emit_iteration(replica, values, execution.extra, t0 + now)
        heapq.heappush(self._heap, (end, _ITER_DONE, next(self._counter), (replica, batch, execution)))

    def _iteration_done(self, payload: tuple[Replica, Batch, Execution], now: float) -> None:
        replica, batch, execution = payload
        replica.busy = False
        replica.core.update(batch, execution)  # each token: _token
        self._kick(replica, now)

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

    def _hand_off(self, req: _Request, seq: Seq, now: float) -> None:
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

    def _finish(self, req: _Request, now: float) -> None:
        self._finished += 1
        for r in (req.prefill, req.decode):
            if r is not None:
                r.inflight.discard(req.request_id)
        self._states.pop(req.request_id, None)
        self._emit_request(req, now, "ok", "length", None)

    def _fail(self, req: _Request, message: str, now: float) -> None:
        self._failed += 1
        self._emit_request(req, now, "error", "error", message)

    def _emit_request(self, req: _Request, now: float, status: str, reason: str, error: str | None) -> None:
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


_gc_lock = threading.Lock()
_gc_pauses = 0  # runs under gc_paused now (in any thread); the collector is back on at 0


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector (reference counting goes on) for the block; it is
    back on when the last of the blocks that paused it ends, if it was on before the first.

    What the block leaves alive (a run's estimate cache, its results) goes straight to the oldest
    generation then (``gc.freeze`` and ``unfreeze``, O(1), unless something else froze objects):
    left in the youngest, it would be walked by the next two collections (0.1 s after 10 minutes
    of the hour on 8 GPUs)."""
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                if gc.get_freeze_count() == 0:
                    gc.freeze()
                    gc.unfreeze()
                gc.enable()


_gc_was_enabled = True


def _load(replica: Replica) -> tuple[int, float]:
    # Replica.load without its two hops: once per replica of a role per arrival (32 x 155k in the
    # 64-GPU hour)
    return len(replica.inflight), replica.blocks.usage


def virtual_start_s(requests: Sequence[TraceRequest], *, end_at_s: float | None = None) -> float:
    """A start time such that the trace's last arrival falls at ``end_at_s`` (default: now)."""
    end = time.time() if end_at_s is None else end_at_s
    span = max((r.arrival_s for r in requests), default=0.0)
    return math.floor(end - span)
