"""One engine step, shared by the live engine and the simulator (torch-free).

The loop of an engine, live or simulated, is::

    def step(self):
        batch = self.begin(self.clock())           # admit hand-offs, schedule, stamp
        if batch is None:
            return StepResult()
        execution = self.executor.execute(batch)    # the model (live) or the GPU model's timing
        result = self.update(batch, execution)      # tokens, finishes, hand-offs
        self.emit_iteration(batch, execution)       # the iteration event
        return result

What differs is only the executor: :class:`serving.engine.Engine` runs the torch model and samples
(`serving.engine.TorchExecutor`); the simulator (:mod:`serving.sim.simulator`) uses
:class:`serving.sim.executor.GpuModelExecutor`, which returns the GPU model's time for the batch and
the token 0 for every sampling sequence. Admission, hand-off admission (:func:`admit_handoffs`),
preemption (the :class:`~serving.scheduler.Scheduler`), token bookkeeping, finish reasons and the
iteration event (:func:`iteration_event`) exist here once. The simulator starts an iteration with
:meth:`EngineCore.begin` and completes it with :meth:`EngineCore.update` at its end in virtual time;
nothing between the two touches the batch's sequences.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from serving.config import EngineConfig, SamplingParams
from serving.decode_run import DecodeRun
from serving.scheduler import IterationTally, Scheduler, SchedulerOutput
from serving.sequence import Sequence
from serving.telemetry import TelemetryEmitter
from serving.telemetry_columns import iteration_event_of


@dataclass(slots=True)
class TokenOutput:
    """A token produced for a request in one iteration."""

    request_id: str
    token_id: int
    ts_s: float
    finish_reason: str | None = None  # "stop" | "length" | None while running
    meta: dict[str, Any] | None = None  # timings, sent with a request's first token from this worker


@dataclass(slots=True)
class Handoff:
    """A prefilled request leaving this engine for a decode worker, with its KV."""

    request_id: str
    token_ids: list[int]  # prompt + first token
    num_prompt_tokens: int
    params: SamplingParams
    kv: Any  # live: torch.Tensor [2, layers, prompt tokens, kv_heads, head_dim]; None without a KV cache
    meta: dict[str, Any]


@dataclass(slots=True)
class StepResult:
    outputs: list[TokenOutput] = field(default_factory=list)
    handoffs: list[Handoff] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (request id, message): dropped requests
    phase: str = "idle"
    end_s: float | None = None  # when the iteration ended (on the engine's clock); None: nothing ran


class Batch(NamedTuple):
    """One iteration, as scheduled: what the executor runs. (Tuples, this and :class:`Execution`:
    the simulator makes one of each per iteration, with ``tuple.__new__`` rather than a Python
    ``__init__``.)"""

    sched: SchedulerOutput
    work: IterationTally
    start_s: float  # on the engine's clock
    kv_blocks_used: int  # after the iteration's blocks were allocated


class Execution(NamedTuple):
    """What an executor reports for a batch."""

    end_s: float  # on the engine's clock
    tokens: list[Any] | None  # one per sampling sequence, in batch order (an Exception fails that
    # request); None: token 0 for each (a timing executor: no model, lengths from max_tokens)
    compute_s: float
    pacing_s: float = 0.0
    modeled_s: float | None = None
    lag_s: float | None = None
    extra: dict[str, Any] | None = None  # iteration-event fields beyond the live engine's (host_s, tp)
    estimate: Any = None  # a timing executor's IterationEstimate (the simulator's busy intervals)
    flops: float | None = None  # the iteration's FLOPs and HBM bytes on one GPU (roofline count)
    hbm_bytes: float | None = None
    busy: Any = None  # and the row of what the simulator's busy intervals keep of it (sim.records.BusyTable)


_new_tuple = tuple.__new__


class Executor(Protocol):
    """Runs a scheduled batch: the model's forward pass and sampling, or a model of its time."""

    def execute(self, batch: Batch) -> Execution: ...


class VirtualClock:
    """A clock that moves only when told (an engine driven in virtual time)."""

    __slots__ = ("now_s",)

    def __init__(self, now_s: float = 0.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def admit_handoffs(scheduler: Scheduler, pending: list[Any], key: Callable[[Any], Sequence]) -> list[Any]:
    """Admit handed-off sequences (their KV arrived) in arrival order, skipping past any whose blocks
    are not free yet (it waits; a smaller one behind it does not: no head-of-line blocking).
    Returns the admitted entries and removes them from ``pending``."""
    admitted, still = [], []
    room = scheduler.cfg.max_num_seqs - len(scheduler.running)
    blocks = scheduler.blocks
    block_size, free = blocks.block_size, blocks.num_free
    for entry in pending:
        seq = key(entry)
        # the blocks it lacks, counted here first: an overloaded decode engine has many waiting
        if (
            room > 0
            and -(-len(seq.token_ids) // block_size) - len(seq.block_table) <= free
            and scheduler.add_running(seq)
        ):
            admitted.append(entry)
            room -= 1
            free = blocks.num_free
        else:
            still.append(entry)
    pending[:] = still
    return admitted


def iteration_values(
    batch: Batch, execution: Execution, kv_blocks_total: int, time_offset_s: float = 0.0
) -> tuple[Any, ...]:
    """The iteration's values of its ``iteration`` events (``ITERATION_VALUE_FIELDS``, in order)."""
    work = batch.work
    return (
        time_offset_s + batch.start_s,
        time_offset_s + execution.end_s,
        work.phase,
        work.batch_size,
        work.prefill_tokens,
        work.decode_seqs,
        work.context_tokens,
        batch.kv_blocks_used,
        kv_blocks_total,
        len(batch.sched.preempted),
        execution.compute_s,
        execution.pacing_s,
        execution.modeled_s,
        execution.lag_s,
        execution.flops,
        execution.hbm_bytes,
    )


def iteration_event(
    worker: str,
    device: str,
    gpu_uuid: str,
    gpu_index: int,
    batch: Batch,
    execution: Execution,
    kv_blocks_total: int,
    time_offset_s: float = 0.0,
) -> dict[str, Any]:
    """The ``iteration`` telemetry event of one GPU (docs/TELEMETRY.md)."""
    values = iteration_values(batch, execution, kv_blocks_total, time_offset_s)
    return iteration_event_of(worker, device, gpu_uuid, gpu_index, values, execution.extra)


class EngineCore:
    """A continuous-batching engine's bookkeeping around a pluggable executor (see the module).

    Requests come in with :meth:`add_request` (from a client) or :meth:`add_prefilled` (a KV
    hand-off from a prefill engine); ``while core.has_work(): core.step()``. ``gpus`` are the
    (uuid, index) of the GPUs the engine runs on (one iteration event each); ``device`` names the
    device kind in those events; ``time_offset_s`` is added to the times in them (a virtual clock
    running from 0 keeps full precision; the events carry epoch seconds); ``stop_token_ids`` are the
    model's end-of-sequence ids (a request stops at one unless it ignores EOS).
    """

    _collects_outputs = True  # a subclass that takes every token in _on_token builds no StepResult

    def __init__(
        self,
        cfg: EngineConfig,
        executor: Executor,
        *,
        worker_id: str = "worker-0",
        device: str = "",
        gpus: Iterable[tuple[str, int]] = (),
        telemetry: TelemetryEmitter | None = None,
        stop_token_ids: Iterable[int] = (),
        clock: Callable[[], float] = time.time,
        time_offset_s: float = 0.0,
    ) -> None:
        self.cfg = cfg
        self.executor = executor
        self.worker_id = worker_id
        self.device_name = device
        self.gpus = list(gpus)
        self.telemetry = telemetry
        self.clock = clock
        self.time_offset_s = time_offset_s
        self.scheduler = Scheduler(cfg)
        self._stop_ids = frozenset(stop_token_ids)
        self._seqs: dict[str, Sequence] = {}
        self._pending_imports: list[tuple[Sequence, Any, dict[str, Any]]] = []  # (seq, kv, meta)
        self._pending_min_blocks = math.inf  # a lower bound on the blocks any pending hand-off needs
        self._result: StepResult | None = None
        # admitted hand-offs that may not have been scheduled yet (a preempted or aborted one stays
        # counted: then begin looks at every decode step, as it would without the count)
        self._unstamped_imports = 0
        self.iterations = 0

    # -- requests in -------------------------------------------------------------------------

    def check_admissible(self, num_prompt_tokens: int, max_tokens: int) -> None:
        self.scheduler.check_admissible(num_prompt_tokens, max_tokens)

    def add_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        arrival_s: float | None = None,
        handoff: bool = False,
        token_times: list[float] | None = None,
    ) -> Sequence:
        """Queue a new request; `handoff` stops it after the first token and hands it off;
        ``token_times``: where its plain tokens' times go (see :meth:`update`)."""
        if request_id in self._seqs:
            raise ValueError(f"request id {request_id!r} is already in this engine")
        seq = Sequence(
            request_id,
            list(prompt_ids),
            len(prompt_ids),
            params,
            self.clock() if arrival_s is None else arrival_s,
            handoff,
        )
        seq.token_times = token_times
        self._set_limits(seq)
        self.scheduler.add(seq)
        self._seqs[request_id] = seq
        return seq

    def queue_prefilled(
        self,
        request_id: str,
        token_ids: list[int],
        num_prompt_tokens: int,
        params: SamplingParams,
        num_computed: int,
        *,
        kv: Any = None,
        meta: dict[str, Any] | None = None,
        arrival_s: float | None = None,
        token_times: list[float] | None = None,
    ) -> Sequence:
        """Queue a request whose first ``num_computed`` tokens' KV was computed elsewhere; it joins
        the running batch at the next step whose blocks allow (:func:`admit_handoffs`)."""
        self.scheduler.check_admissible(num_prompt_tokens, params.max_tokens)
        seq = Sequence(
            request_id,
            list(token_ids),
            num_prompt_tokens,
            params,
            self.clock() if arrival_s is None else arrival_s,
        )
        seq.num_computed = num_computed
        seq.token_times = token_times
        self._set_limits(seq)
        self._seqs[request_id] = seq
        self._pending_imports.append((seq, kv, meta or {}))
        need = self.scheduler.blocks.blocks_for(len(seq.token_ids))
        if need < self._pending_min_blocks:
            self._pending_min_blocks = need
        return seq

    def _set_limits(self, seq: Sequence) -> None:
        """The tokens that stop ``seq`` and the length at which it stops (read by :meth:`update`)."""
        params = seq.params
        stop = frozenset(params.stop_token_ids)
        seq.stop_ids = stop if params.ignore_eos else stop | self._stop_ids
        seq.max_len = min(seq.num_prompt_tokens + params.max_tokens, self.cfg.max_model_len)

    def admit_imports(self) -> None:
        """Admit the pending hand-offs that fit now (:func:`admit_handoffs`)."""
        s = self.scheduler
        if len(s.running) >= s.cfg.max_num_seqs or s.blocks.num_free < self._pending_min_blocks:
            return  # none can fit: the common case of a saturated decode engine, in O(1)
        for seq, kv, _meta in admit_handoffs(s, self._pending_imports, _entry_seq):
            self._unstamped_imports += seq.first_scheduled_s is None
            self._imported(seq, kv)
        # Each hand-off left needed more blocks than were free when it was tried, and the free
        # count only fell during the pass: none fits until blocks are freed (unless the seats ran
        # out first and some were not tried).
        seats_left = len(s.running) < s.cfg.max_num_seqs
        self._pending_min_blocks = s.blocks.num_free + 1 if seats_left else 0

    def _imported(self, seq: Sequence, kv: Any) -> None:
        """A hand-off was admitted (its blocks allocated): the live engine copies its KV in."""

    def abort(self, request_id: str) -> bool:
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return False
        self._pending_imports = [p for p in self._pending_imports if p[0] is not seq]
        self.scheduler.finish(seq)
        return True

    # -- state ---------------------------------------------------------------------------------

    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self._pending_imports)

    @property
    def num_pending_imports(self) -> int:
        return len(self._pending_imports)

    # -- one iteration ---------------------------------------------------------------------------

    def step(self) -> StepResult:
        """Run one iteration: schedule, execute, update, report."""
        batch = self.begin(self.clock())
        if batch is None:
            return StepResult()
        execution = self.executor.execute(batch)
        result = self.update(batch, execution)
        self.emit_iteration(batch, execution)
        return result

    def begin(self, now_s: float) -> Batch | None:
        """Admit hand-offs, schedule the next iteration and stamp its sequences; None: nothing to run."""
        if self._pending_imports:
            self.admit_imports()
        sched = self.scheduler.schedule()
        seqs = sched.seqs
        if not seqs:
            return None
        k = sched.decodes
        if k:  # decode steps, past their prompts: only a hand-off's first step is its first schedule
            if self._unstamped_imports:
                for seq in seqs[:k]:
                    if seq.first_scheduled_s is None:
                        seq.first_scheduled_s = now_s
                        self._unstamped_imports -= 1
            seqs = seqs[k:]
        for seq in seqs:
            if seq.first_scheduled_s is None:
                seq.first_scheduled_s = now_s
            if seq.prefill_start_s is None and (
                seq.num_computed < len(seq.token_ids) - 1 or seq.num_computed < seq.num_prompt_tokens
            ):
                seq.prefill_start_s = now_s
        blocks = self.scheduler.blocks
        return _new_tuple(Batch, (sched, sched.tally(), now_s, blocks.num_blocks - blocks.num_free))

    def update(self, batch: Batch, execution: Execution) -> StepResult | None:
        """Advance the batch's sequences by the iteration: each whose prompt or step completed gets
        its token and, from it, its finish reason: "stop" (a stop token, or the model's EOS unless
        ignored), "length" (max_tokens or the model's context reached) or None (it goes on). A
        finished sequence is released, a hand-off one handed off (:meth:`_on_token`). A sequence
        given ``token_times`` (the simulator's) has a token that is neither its first, last nor a
        hand-off's recorded there as its time alone; the hook sees every other token.

        Once per token in the simulator: written for speed (locals, no per-token method but the hook).
        """
        result = None
        if self._collects_outputs:
            result = self._result = StepResult(phase=batch.work.phase, end_s=execution.end_s)
        ts_s = execution.end_s
        tokens = execution.tokens
        on_token = self._on_token
        k = 0
        token = 0  # a timing executor's token (tokens is None)
        sched = batch.sched
        seqs, num_new, decodes = sched.seqs, sched.num_new, sched.decodes
        if decodes:
            # The decode steps first (Scheduler.schedule puts them there): one new token each, never
            # a sequence's first; the same bookkeeping as the general loop below, less its prefill
            # cases (the hot loop of a simulation: ~90 % of its tokens).
            for seq in seqs[:decodes]:
                token_ids = seq.token_ids
                n = len(token_ids)
                computed = seq.num_computed = seq.num_computed + 1
                if computed != n:
                    continue
                if tokens is not None:
                    token = tokens[k]
                    k += 1
                    if isinstance(token, Exception):
                        result.errors.append((seq.request_id, str(token)))
                        self._failed(seq)
                        self.release(seq)
                        continue
                token_ids.append(token)
                n += 1
                if token in seq.stop_ids:
                    reason = "stop"
                elif n >= seq.max_len:
                    reason = "length"
                else:
                    reason = None
                if reason is not None or seq.handoff:
                    on_token(seq, token, ts_s, reason, False)
                    self.release(seq)
                elif (times := seq.token_times) is None:
                    on_token(seq, token, ts_s, reason, False)
                else:
                    times.append(ts_s)
            seqs, num_new = seqs[decodes:], num_new[decodes:]
        for seq, new in zip(seqs, num_new, strict=True):
            token_ids = seq.token_ids
            n = len(token_ids)
            computed = seq.num_computed
            was_prefill = computed < n - 1 or computed < seq.num_prompt_tokens
            computed = seq.num_computed = computed + new
            if computed != n:
                continue  # a prompt chunk
            if tokens is not None:
                token = tokens[k]
                k += 1
                if isinstance(token, Exception):  # fail this request only; the batch goes on
                    result.errors.append((seq.request_id, str(token)))
                    self._failed(seq)
                    self.release(seq)
                    continue
            token_ids.append(token)
            n += 1
            first = was_prefill and seq.prefill_end_s is None
            if first:
                seq.prefill_end_s = ts_s
            if token in seq.stop_ids:  # its stop ids, and the EOS unless ignored (_set_limits)
                reason = "stop"
            elif n >= seq.max_len:  # max_tokens or the model's context reached
                reason = "length"
            else:
                reason = None
            if reason is not None or seq.handoff:
                on_token(seq, token, ts_s, reason, first)
                self.release(seq)
            elif first or (times := seq.token_times) is None:
                on_token(seq, token, ts_s, reason, first)
            else:  # a sequence that records its token times: a plain token is just its time
                times.append(ts_s)
        self.iterations += 1
        self._result = None
        return result

    def decode_run(self, max_iters: int) -> DecodeRun | None:
        """The next iterations, up to ``max_iters``, when at least two of them are plain decode steps
        of the running sequences that a timing executor (token 0 for each) would run one by one:
        nothing waiting or handed off pending, none preempted, each sequence recording its token
        times (``token_times``), none stopping at token 0 or handed off, and none reaching its
        length limit before the last (``DecodeRun.last_finishes``: some do in the last); None
        otherwise. Nothing is changed until :meth:`commit_decode_run`."""
        s = self.scheduler
        if self._pending_imports or self._unstamped_imports or s.waiting:
            return None
        k = max_iters + 1  # (the least of the sequences' iterations left)
        context = 0
        for seq in s.running:
            n = len(seq.token_ids)
            if seq.handoff or seq.token_times is None or 0 in seq.stop_ids:
                return None
            left = seq.max_len - n  # iterations up to the one whose token ends it
            if left < k:
                k = left
            context += n
        last_finishes = k <= max_iters
        if not last_finishes:
            k = max_iters
        if k < 2:
            return None
        k_blocks, grows = s.decode_run(k)
        if k_blocks < 2:
            return None
        if k_blocks < k:
            k, last_finishes = k_blocks, False
        seqs = list(s.running)
        b = len(seqs)
        # each iteration: b decode steps attending their contexts, one token longer each time
        works = [
            _new_tuple(IterationTally, ("decode", 0, b, c, b, c, b))
            for c in range(context, context + k * b, b)
        ]
        free, left_free = [], s.blocks.num_free
        for grown in grows:
            left_free -= len(grown)
            free.append(left_free)
        return DecodeRun(seqs, works, free, grows, s.blocks.num_blocks, last_finishes)

    def commit_decode_run(self, run: DecodeRun, begun: int, updated: int) -> None:
        """Apply ``run``'s first iterations as :meth:`begin` and :meth:`update` would: the KV blocks
        granted when each of the first ``begun`` is scheduled, then each sequence's tokens (0) and
        their times (``run.ends``) of the first ``updated`` (an iteration where a sequence finishes
        is left to :meth:`update`)."""
        blocks = self.scheduler.blocks
        block_size = blocks.block_size
        for j in range(begun):
            for seq in run.grows[j]:
                blocks.grow(seq, len(seq.block_table) * block_size + 1)
        if updated <= 0:
            return
        tokens = [0] * updated
        times = run.ends[:updated]
        for seq in run.seqs:
            seq.num_computed += updated
            seq.token_ids += tokens
            seq.token_times.extend(times)
        self.iterations += updated

    def run_batch(self, run: DecodeRun, j: int) -> Batch:
        """Iteration ``j`` of ``run`` as the :class:`Batch` :meth:`begin` makes (for :meth:`update`)."""
        sched = SchedulerOutput()
        b = len(run.seqs)
        sched.seqs, sched.num_new, sched.decodes, sched.work = run.seqs, [1] * b, b, run.works[j]
        start = run.ends[j - 1] if j else run.start_s
        return _new_tuple(Batch, (sched, run.works[j], start, run.num_blocks - run.free[j]))

    def _on_token(self, seq: Sequence, token: int, ts_s: float, reason: str | None, first: bool) -> None:
        """A sequence got ``token`` at ``ts_s`` (its first from this engine if ``first``): the token
        output with its timings (sent with a request's first token from this engine, and with the
        last when it was preempted), and the hand-off of a prefill-only request."""
        result = self._result
        meta = None
        if first:
            meta = {
                "worker": self.worker_id,
                "arrival_s": seq.arrival_s,
                "first_scheduled_s": seq.first_scheduled_s,
                "prefill_start_s": seq.prefill_start_s,
                "prefill_end_s": ts_s,
                "num_preemptions": seq.num_preemptions,
            }
        if reason is not None and seq.num_preemptions:
            meta = {**(meta or {}), "num_preemptions": seq.num_preemptions}
        result.outputs.append(TokenOutput(seq.request_id, token, ts_s, reason, meta))
        if reason is None and seq.handoff:
            result.handoffs.append(self._export(seq, meta or {}))

    def _export(self, seq: Sequence, meta: dict[str, Any]) -> Handoff:
        """The hand-off of ``seq`` (before its blocks are released); the live engine adds the KV."""
        return Handoff(seq.request_id, list(seq.token_ids), seq.num_prompt_tokens, seq.params, None, meta)

    def _failed(self, seq: Sequence) -> None:
        """A sequence's sampling failed (before its blocks are released)."""

    def release(self, seq: Sequence) -> None:
        """Drop a finished, handed-off or failed sequence and free its blocks."""
        self.scheduler.finish(seq)
        self._seqs.pop(seq.request_id, None)

    def emit_iteration(self, batch: Batch, execution: Execution) -> None:
        """Emit the iteration event of each of the engine's GPUs."""
        if self.telemetry is None:
            return
        total = self.scheduler.blocks.num_blocks
        for uuid, index in self.gpus:
            self.telemetry.put(
                iteration_event(
                    self.worker_id,
                    self.device_name,
                    uuid,
                    index,
                    batch,
                    execution,
                    total,
                    self.time_offset_s,
                )
            )


def _entry_seq(entry: tuple[Sequence, Any, dict[str, Any]]) -> Sequence:
    return entry[0]
