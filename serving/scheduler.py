"""Iteration-level continuous batching with admission control (torch-free)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from serving.block_manager import BlockManager
from serving.config import EngineConfig
from serving.sequence import SeqStatus, Sequence


class AdmissionError(ValueError):
    """A request can never run on this engine (too long for the context or the whole KV cache)."""


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int

    @property
    def context_len(self) -> int:
        return self.seq.num_computed + self.num_new_tokens

    @property
    def completes_prompt(self) -> bool:
        """After this iteration the sequence has all its pending tokens computed and samples one."""
        return self.context_len == self.seq.num_tokens


def _phase(prefill_tokens: int, decode_seqs: int) -> str:
    if prefill_tokens and decode_seqs:
        return "mixed"
    return "prefill" if prefill_tokens else "decode" if decode_seqs else "idle"


class IterationTally(NamedTuple):
    """What an iteration computes, in the field order of ``serving.devices.IterationWork``."""

    phase: str
    prefill_tokens: int
    decode_seqs: int
    context_tokens: int  # sum of the context lengths attended
    batch_size: int
    attention_pairs: int  # (query token, key token) pairs attended, causal within a new chunk
    sampled_seqs: int  # sequences that sample a token (their prompt or chunk is complete)


_new_tuple = tuple.__new__
_new_output = object.__new__


class SchedulerOutput:
    """The sequences of an iteration and their new tokens (``seqs[i]`` runs ``num_new[i]``), the
    sequences preempted to make room, and the iteration's tally. ``items`` is the same as
    :class:`ScheduledSeq` objects (the live engine's model input reads those; the simulator's
    per-token loops read the two lists). The first ``decodes`` sequences are decode steps (one new
    token each, past their prompt), as :meth:`Scheduler.schedule` orders them; 0 when not known."""

    __slots__ = ("decodes", "num_new", "preempted", "seqs", "work")

    def __init__(
        self,
        items: list[ScheduledSeq] | None = None,
        preempted: list[Sequence] | None = None,
        work: IterationTally | None = None,
    ) -> None:
        self.seqs: list[Sequence] = [i.seq for i in items] if items else []
        self.num_new: list[int] = [i.num_new_tokens for i in items] if items else []
        self.preempted: list[Sequence] = [] if preempted is None else preempted
        self.work = work  # the tally, counted by `Scheduler.schedule` as it chose
        self.decodes = 0

    @property
    def items(self) -> list[ScheduledSeq]:
        return [ScheduledSeq(seq, n) for seq, n in zip(self.seqs, self.num_new, strict=True)]

    @property
    def prefill_tokens(self) -> int:
        return sum(n for seq, n in zip(self.seqs, self.num_new, strict=True) if seq.in_prefill)

    @property
    def decode_seqs(self) -> int:
        return sum(1 for seq in self.seqs if not seq.in_prefill)

    @property
    def phase(self) -> str:
        return _phase(self.prefill_tokens, self.decode_seqs)

    def tally(self) -> IterationTally:
        """The iteration's work (what a device model needs to time it); valid until the iteration's
        update advances its sequences."""
        if self.work is not None:
            return self.work
        prefill = decode = context = pairs = sampled = 0
        for seq, n in zip(self.seqs, self.num_new, strict=True):
            ctx = seq.num_computed + n
            context += ctx
            pairs += n * ctx - n * (n - 1) // 2
            if ctx == seq.num_tokens:
                sampled += 1
            if seq.in_prefill:
                prefill += n
            else:
                decode += 1
        return IterationTally(
            _phase(prefill, decode), prefill, decode, context, len(self.seqs), pairs, sampled
        )


class Scheduler:
    """FCFS scheduler: running sequences first (decode, then unfinished prompt chunks), then admissions.

    A request is admitted only when its prompt's blocks are free; when a running sequence cannot
    grow by one token, the most recently admitted sequence is preempted (its blocks freed and its
    tokens recomputed later). The engine never crashes for lack of blocks: requests wait.
    """

    def __init__(self, cfg: EngineConfig) -> None:
        if not cfg.num_blocks or not cfg.max_model_len:
            raise ValueError("EngineConfig must be resolved (num_blocks, max_model_len) first")
        self.cfg = cfg
        self.blocks = BlockManager(cfg.num_blocks, cfg.block_size)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def check_admissible(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """Raise AdmissionError when a request of this size can never be served here."""
        total = num_prompt_tokens + max_tokens
        if total > self.cfg.max_model_len:
            raise AdmissionError(
                f"prompt ({num_prompt_tokens} tokens) + max_tokens ({max_tokens}) = {total} exceeds "
                f"the model's context of {self.cfg.max_model_len} tokens"
            )
        if self.blocks.blocks_for(total) > self.cfg.num_blocks:
            raise AdmissionError(
                f"request needs {self.blocks.blocks_for(total)} KV blocks, the cache holds {self.cfg.num_blocks}"
            )

    def add(self, seq: Sequence) -> None:
        self.check_admissible(seq.num_prompt_tokens, seq.params.max_tokens)
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> bool:
        """Admit a sequence whose first `num_computed` tokens arrive pre-computed (a KV hand-off).

        Returns False, changing nothing, when its blocks are not free yet.
        """
        if len(self.running) >= self.cfg.max_num_seqs or not self.blocks.can_grow(seq, seq.num_tokens):
            return False
        self.blocks.grow(seq, seq.num_tokens)
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)
        return True

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence and free its blocks."""
        seq.status = SeqStatus.FINISHED
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq)

    def _preempt_last(self, out: SchedulerOutput) -> Sequence:
        victim = self.running.pop()
        self.blocks.free(victim)
        victim.num_computed = 0
        victim.num_preemptions += 1
        victim.status = SeqStatus.WAITING
        self.waiting.appendleft(victim)
        out.preempted.append(victim)
        return victim

    def decode_run(self, max_iters: int) -> tuple[int, list[list[Sequence]]]:
        """How many of the next iterations, up to ``max_iters``, :meth:`schedule` makes of the running
        sequences alone, each one decode step of every one of them in running order (nothing
        waiting, no prompt chunk, the token budget enough, no preemption), when each sequence gains
        one token per iteration; and for each of those iterations the sequences that cross into a
        new KV block when it is scheduled, in the order :meth:`schedule` grants them. ``(0, [])``
        when the next iteration is not such a step. Nothing is changed (the engine's
        :meth:`~serving.engine_core.EngineCore.commit_decode_run` grants the blocks)."""
        running = self.running
        if self.waiting or not running or len(running) > self.cfg.max_num_batched_tokens:
            return 0, []
        block_size = self.blocks.block_size
        k = max_iters
        grows: list[list[Sequence]] = [[] for _ in range(k)]
        for seq in running:
            n = len(seq.token_ids)
            computed = seq.num_computed
            if computed < n - 1 or computed < seq.num_prompt_tokens:  # a prompt chunk
                return 0, []
            # iteration j (from 0) schedules it at n + j tokens: a new block when n + j passes the
            # table's end, first at j = first, then every block_size iterations
            first = len(seq.block_table) * block_size - n + 1
            if first < 0:  # more than one block short: not a plain decode step
                return 0, []
            for j in range(first, k, block_size):
                grows[j].append(seq)
        # a preemption happens where a crossing finds no free block: stop before that iteration
        free, granted = self.blocks.num_free, 0
        for j in range(k):
            granted += len(grows[j])
            if granted > free:
                k = j
                break
        return k, grows[:k]

    def schedule(self) -> SchedulerOutput:
        """Choose the sequences and token counts of the next iteration, and tally its work.

        Hot in the simulator (once per simulated iteration): sequence state is read from its fields
        rather than through properties, the decodes take one pass over ``running`` and leave their
        counts to the end, and a decode looks for a block only when it crosses into a new one.
        """
        out = _new_output(SchedulerOutput)  # its fields set here, no __init__ call
        out.seqs = items = []
        out.preempted = []
        budget = self.cfg.max_num_batched_tokens
        blocks, running_status = self.blocks, SeqStatus.RUNNING
        block_size = blocks.block_size
        prefill = context = pairs = sampled = 0
        chunks: list[Sequence] = []  # running sequences part-way through a (chunked) prompt
        # Decodes first, in running order: each needs one token and possibly one more block. A
        # preemption pops the tail of ``running``, which this pass then never reaches (or the
        # sequence itself, which ends it); the chunks are kept for after.
        for seq in self.running:
            n = len(seq.token_ids)
            computed = seq.num_computed
            if computed < n - 1 or computed < seq.num_prompt_tokens:  # Sequence.in_prefill
                chunks.append(seq)
                continue
            if n > len(seq.block_table) * block_size:  # crosses into a new block
                while not blocks.can_grow(seq, n):
                    if self._preempt_last(out) is seq:
                        break
                if seq.status is not running_status or budget < 1:
                    continue
                blocks.grow(seq, n)
            elif budget < 1:
                continue
            items.append(seq)
            budget -= 1
            context += n
        # each decode: one new token, attending its n tokens, and sampling one
        decode = out.decodes = len(items)
        news = out.num_new = [1] * decode
        pairs = context
        sampled = decode
        # Running sequences part-way through a chunked prompt.
        for seq in chunks:
            if budget <= 0:
                break
            if seq.status is not running_status:  # preempted by a decode above
                continue
            computed, total = seq.num_computed, len(seq.token_ids)
            n = min(total - computed, budget)
            ctx = computed + n
            if blocks.can_grow(seq, ctx):
                blocks.grow(seq, ctx)
                items.append(seq)
                news.append(n)
                budget -= n
                prefill += n
                context += ctx
                pairs += n * ctx - n * (n - 1) // 2
                sampled += ctx == total
        # Admissions, in arrival order; stop at the first that does not fit.
        waiting, running = self.waiting, self.running
        max_seqs, chunked = self.cfg.max_num_seqs, self.cfg.chunked_prefill
        while waiting and budget > 0 and len(running) < max_seqs:
            seq = waiting[0]
            computed, total = seq.num_computed, len(seq.token_ids)
            n = total - computed
            if n > budget:
                if chunked:
                    n = budget
                elif items:  # without chunking a long prompt runs alone
                    break
            ctx = computed + n
            if not blocks.can_grow(seq, ctx):
                break
            in_prefill = computed < total - 1 or computed < seq.num_prompt_tokens
            waiting.popleft()
            blocks.grow(seq, ctx)
            seq.status = running_status
            running.append(seq)
            items.append(seq)
            news.append(n)
            budget -= n
            context += ctx
            pairs += n * ctx - n * (n - 1) // 2
            sampled += ctx == total
            if in_prefill:
                prefill += n
            else:
                decode += 1
        # tuple.__new__ straight: the NamedTuple's own __new__ is a Python call (once per iteration)
        out.work = _new_tuple(
            IterationTally, (_phase(prefill, decode), prefill, decode, context, len(items), pairs, sampled)
        )
        return out
