"""Scheduler + Sequence: continuous batching, admission control, chunked prefill, preemption (torch-free)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from serving.config import EngineConfig, SamplingParams
from serving.scheduler import AdmissionError, ScheduledSeq, Scheduler, SchedulerOutput
from serving.sequence import SeqStatus, Sequence


def _cfg(**kw) -> EngineConfig:
    base = {"block_size": 4, "num_blocks": 64, "max_model_len": 1024}
    return EngineConfig(**{**base, **kw})


def _seq(rid: str, prompt_len: int, max_tokens: int = 4) -> Sequence:
    return Sequence(rid, [i % 200 for i in range(prompt_len)], prompt_len, SamplingParams(max_tokens), 0.0)


def _ids(items) -> list[str]:
    return [i.seq.request_id if isinstance(i, ScheduledSeq) else i.request_id for i in items]


def _step(sched: Scheduler, out: SchedulerOutput) -> list[Sequence]:
    """Play the engine: compute the scheduled tokens, sample one where a prompt/decode completes."""
    finished = []
    for item in out.items:
        seq = item.seq
        completes = item.completes_prompt
        seq.num_computed += item.num_new_tokens
        if completes:
            seq.token_ids.append(1000 + seq.num_output_tokens)
            if seq.num_output_tokens >= seq.params.max_tokens:
                sched.finish(seq)
                finished.append(seq)
    return finished


def _run(sched: Scheduler, max_iters: int = 10_000) -> int:
    n = 0
    while sched.has_work():
        out = sched.schedule()
        assert out.items, "scheduler made no progress while it has work"
        _step(sched, out)
        n += 1
        assert n < max_iters
    return n


# -- configuration and admission checks ---------------------------------------------------------


def test_requires_resolved_config() -> None:
    with pytest.raises(ValueError, match="resolved"):
        Scheduler(EngineConfig())
    with pytest.raises(ValueError, match="resolved"):
        Scheduler(EngineConfig(num_blocks=8))


def test_check_admissible_too_long_for_context() -> None:
    sched = Scheduler(_cfg(max_model_len=100))
    sched.check_admissible(90, 10)  # exactly the context: fine
    with pytest.raises(AdmissionError) as e:
        sched.check_admissible(90, 11)
    msg = str(e.value)
    for number in ("90", "11", "101", "100"):
        assert number in msg
    assert "context" in msg


def test_check_admissible_larger_than_whole_cache() -> None:
    sched = Scheduler(_cfg(num_blocks=4, block_size=4))
    sched.check_admissible(10, 6)  # 16 tokens = 4 blocks = the whole cache: fine
    with pytest.raises(AdmissionError, match=r"needs 5 KV blocks, the cache holds 4"):
        sched.check_admissible(10, 7)


def test_add_rejects_inadmissible_without_queueing() -> None:
    sched = Scheduler(_cfg(num_blocks=2, block_size=4))
    with pytest.raises(AdmissionError):
        sched.add(_seq("big", 8, max_tokens=4))
    assert not sched.has_work()
    assert isinstance(AdmissionError("x"), ValueError)


# -- admission ------------------------------------------------------------------------------------


def test_fcfs_admission_order() -> None:
    sched = Scheduler(_cfg())
    for i in range(4):
        sched.add(_seq(f"r{i}", 3 + i))
    out = sched.schedule()
    assert _ids(out.items) == ["r0", "r1", "r2", "r3"]
    assert [i.num_new_tokens for i in out.items] == [3, 4, 5, 6]
    assert _ids(sched.running) == ["r0", "r1", "r2", "r3"]
    assert all(s.status is SeqStatus.RUNNING for s in sched.running)
    assert not sched.waiting
    assert out.phase == "prefill"
    assert out.prefill_tokens == 18
    assert out.decode_seqs == 0


def test_admission_waits_for_blocks_then_admits_when_freed() -> None:
    # 5 blocks of 4 tokens; each request needs 2 blocks for its prompt
    sched = Scheduler(_cfg(num_blocks=5, block_size=4))
    for i in range(3):
        sched.add(_seq(f"r{i}", 6, max_tokens=2))
    sched.add(_seq("small", 2, max_tokens=2))  # would fit in the last block, but FCFS: it waits
    out = sched.schedule()
    assert _ids(out.items) == ["r0", "r1"]
    assert _ids(sched.waiting) == ["r2", "small"]
    assert sched.blocks.num_free == 1
    assert all(s.block_table == [] and s.status is SeqStatus.WAITING for s in sched.waiting)
    _step(sched, out)
    out = sched.schedule()  # decodes only; the queue still waits, nothing crashes
    assert _ids(out.items) == ["r0", "r1"]
    assert all(i.num_new_tokens == 1 for i in out.items)
    assert _ids(sched.waiting) == ["r2", "small"]
    finished = _step(sched, out)
    assert _ids(finished) == ["r0", "r1"]
    assert sched.blocks.num_free == 5
    out = sched.schedule()
    assert _ids(out.items) == ["r2", "small"]
    assert _run(sched) > 0
    assert sched.blocks.num_free == 5


def test_max_num_seqs_respected() -> None:
    sched = Scheduler(_cfg(max_num_seqs=2))
    for i in range(5):
        sched.add(_seq(f"r{i}", 3, max_tokens=2))
    out = sched.schedule()
    assert _ids(out.items) == ["r0", "r1"]
    assert len(sched.waiting) == 3
    while sched.has_work():
        out = sched.schedule()
        assert len(sched.running) <= 2
        assert len(out.items) <= 2
        _step(sched, out)


def test_max_num_batched_tokens_budget() -> None:
    sched = Scheduler(_cfg(max_num_batched_tokens=10))
    for i in range(3):
        sched.add(_seq(f"r{i}", 4))
    out = sched.schedule()
    assert _ids(out.items) == ["r0", "r1"]  # 4 + 4; 4 more would exceed 10
    assert sum(i.num_new_tokens for i in out.items) <= 10
    assert _ids(sched.waiting) == ["r2"]
    _step(sched, out)
    out = sched.schedule()  # two decodes (2 tokens) leave room for r2's 4
    assert _ids(out.items) == ["r0", "r1", "r2"]
    assert [i.num_new_tokens for i in out.items] == [1, 1, 4]
    assert out.phase == "mixed"


def test_without_chunking_a_long_prompt_runs_alone_and_whole() -> None:
    sched = Scheduler(_cfg(max_num_batched_tokens=16))
    sched.add(_seq("short", 4, max_tokens=3))
    sched.add(_seq("long", 50, max_tokens=2))
    out = sched.schedule()
    assert _ids(out.items) == ["short"]
    assert _ids(sched.waiting) == ["long"]
    _step(sched, out)
    seen_long = None
    while sched.has_work():
        out = sched.schedule()
        if "long" in _ids(out.items) and seen_long is None:
            seen_long = ([(i.seq.request_id, i.num_new_tokens) for i in out.items], out.phase)
        _step(sched, out)
    # alone, and whole although over the budget
    assert seen_long == ([("long", 50)], "prefill")


def test_chunked_prefill_splits_long_prompt_into_chunks() -> None:
    sched = Scheduler(_cfg(max_num_batched_tokens=16, chunked_prefill=True))
    seq = _seq("long", 50, max_tokens=2)
    sched.add(seq)
    chunks = []
    for _ in range(4):
        out = sched.schedule()
        assert len(out.items) == 1
        item = out.items[0]
        assert item.seq is seq
        chunks.append(item.num_new_tokens)
        last = item.completes_prompt
        assert out.phase == "prefill"
        _step(sched, out)
        assert seq.num_computed == sum(chunks)
        assert len(seq.block_table) * 4 >= seq.num_computed
        assert seq.status is SeqStatus.RUNNING  # stays running between chunks
    assert chunks == [16, 16, 16, 2]
    assert sum(chunks) == 50
    assert last  # the final chunk samples the first token
    assert seq.num_output_tokens == 1
    out = sched.schedule()
    assert [i.num_new_tokens for i in out.items] == [1]
    assert out.phase == "decode"


def test_chunked_prefill_fills_budget_left_by_decodes() -> None:
    sched = Scheduler(_cfg(max_num_batched_tokens=8, chunked_prefill=True))
    sched.add(_seq("a", 3, max_tokens=8))
    sched.add(_seq("b", 20, max_tokens=2))
    out = sched.schedule()
    assert [(i.seq.request_id, i.num_new_tokens) for i in out.items] == [("a", 3), ("b", 5)]
    _step(sched, out)
    out = sched.schedule()
    assert [(i.seq.request_id, i.num_new_tokens) for i in out.items] == [("a", 1), ("b", 7)]
    assert out.phase == "mixed"
    assert out.prefill_tokens == 7
    assert out.decode_seqs == 1


def test_decodes_are_scheduled_before_prompt_chunks() -> None:
    sched = Scheduler(_cfg(max_num_batched_tokens=8, chunked_prefill=True))
    sched.add(_seq("p", 30))
    _step(sched, sched.schedule())  # p: first chunk of 8
    d = _seq("d", 5)
    d.token_ids.append(42)  # a KV hand-off: prompt computed elsewhere, first token sampled
    d.num_computed = 5
    assert sched.add_running(d)
    assert _ids(sched.running) == ["p", "d"]
    out = sched.schedule()
    assert [(i.seq.request_id, i.num_new_tokens) for i in out.items] == [("d", 1), ("p", 7)]


def test_preemption_when_a_decode_cannot_grow() -> None:
    # 4 blocks of 4 tokens; a and b take 2 blocks each for their 8-token prompts
    sched = Scheduler(_cfg(num_blocks=4, block_size=4))
    a, b = _seq("a", 8, max_tokens=8), _seq("b", 8, max_tokens=8)
    sched.add(a)
    sched.add(b)
    _step(sched, sched.schedule())
    assert sched.blocks.num_free == 0
    c = _seq("c", 2, max_tokens=2)
    sched.add(c)
    b_blocks = list(b.block_table)
    out = sched.schedule()  # a's 9th token needs a 3rd block: b (the most recent) is preempted
    assert out.preempted == [b]
    assert _ids(out.items) == ["a"]
    assert b.status is SeqStatus.WAITING
    assert b.block_table == []
    assert b.num_computed == 0
    assert b.num_preemptions == 1
    assert b.token_ids[-1] == 1000  # its sampled token is kept, to be recomputed
    assert _ids(sched.waiting) == ["b", "c"]  # at the front of the queue
    assert _ids(sched.running) == ["a"]
    assert set(b_blocks) & set(a.block_table)  # a got one of b's blocks
    assert len(a.block_table) == 3
    # b is recomputed later: prompt + its one sampled token, in one prefill
    recompute = None
    while sched.has_work():
        out = sched.schedule()
        for item in out.items:
            if item.seq is b and recompute is None:
                recompute = (item.num_new_tokens, item.seq.in_prefill, item.completes_prompt)
        _step(sched, out)
    assert recompute == (9, True, True)
    assert b.num_output_tokens == 8
    assert b.token_ids[8:] == [1000 + i for i in range(8)]
    assert b.status is SeqStatus.FINISHED
    assert sched.blocks.num_free == 4


def test_preemption_victim_is_most_recent() -> None:
    sched = Scheduler(_cfg(num_blocks=6, block_size=4))
    seqs = [_seq(f"r{i}", 8, max_tokens=8) for i in range(3)]
    for s in seqs:
        sched.add(s)
    _step(sched, sched.schedule())
    out = sched.schedule()
    assert _ids(out.preempted) == ["r2"]
    assert _ids(out.items) == ["r0", "r1"]
    assert seqs[2].num_preemptions == 1 and seqs[0].num_preemptions == seqs[1].num_preemptions == 0


def test_phase_property() -> None:
    fresh = _seq("p", 5)
    dec = _seq("d", 5)
    dec.token_ids.append(1)
    dec.num_computed = 5
    assert fresh.in_prefill and not dec.in_prefill
    assert SchedulerOutput().phase == "idle"
    assert SchedulerOutput([ScheduledSeq(fresh, 5)]).phase == "prefill"
    assert SchedulerOutput([ScheduledSeq(dec, 1)]).phase == "decode"
    mixed = SchedulerOutput([ScheduledSeq(dec, 1), ScheduledSeq(fresh, 3)])
    assert mixed.phase == "mixed"
    assert mixed.prefill_tokens == 3
    assert mixed.decode_seqs == 1
    one = _seq("one", 1)  # a 1-token prompt is still a prefill
    assert SchedulerOutput([ScheduledSeq(one, 1)]).phase == "prefill"


def test_add_running_without_blocks_changes_nothing() -> None:
    sched = Scheduler(_cfg(num_blocks=4, block_size=4))
    sched.add(_seq("a", 8))
    _step(sched, sched.schedule())
    free_before = sched.blocks.num_free
    h = _seq("h", 12)
    h.token_ids.append(7)
    h.num_computed = 12  # 13 tokens: 4 blocks, only 2 free
    assert not sched.add_running(h)
    assert h.block_table == []
    assert h.status is SeqStatus.WAITING
    assert h not in sched.running
    assert sched.blocks.num_free == free_before
    assert h.num_computed == 12


def test_add_running_respects_max_num_seqs_and_admits_as_decode() -> None:
    sched = Scheduler(_cfg(max_num_seqs=1))
    h1, h2 = _seq("h1", 6), _seq("h2", 6)
    for h in (h1, h2):
        h.token_ids.append(7)
        h.num_computed = 6
    assert sched.add_running(h1)
    assert h1.status is SeqStatus.RUNNING
    assert len(h1.block_table) == 2  # covers the 7 tokens
    assert not sched.add_running(h2)
    assert h2.block_table == []
    out = sched.schedule()
    assert [(i.seq.request_id, i.num_new_tokens) for i in out.items] == [("h1", 1)]
    assert out.phase == "decode"


def test_finish_frees_waiting_and_running() -> None:
    sched = Scheduler(_cfg(num_blocks=2, block_size=4, max_num_seqs=1))
    a, b = _seq("a", 4), _seq("b", 4)
    sched.add(a)
    sched.add(b)
    sched.schedule()
    sched.finish(b)  # aborted while waiting
    assert not sched.waiting
    sched.finish(a)
    assert not sched.running
    assert sched.blocks.num_free == 2
    assert a.status is SeqStatus.FINISHED and b.status is SeqStatus.FINISHED
    assert not sched.has_work()


# -- randomized property test -------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_random_workload_completes_consistently(seed: int) -> None:
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 8])
    max_prompt, max_out = 30, 12
    need = -(-(max_prompt + max_out) // block_size)
    cfg = _cfg(
        block_size=block_size,
        num_blocks=need + rng.randint(0, need),
        max_num_seqs=rng.randint(1, 6),
        max_num_batched_tokens=rng.randint(4, 48),
        chunked_prefill=rng.random() < 0.5,
    )
    sched = Scheduler(cfg)
    pending: list[tuple[int, Sequence, bool]] = []  # (arrival iteration, seq, is a hand-off)
    for i in range(rng.randint(5, 25)):
        handoff = rng.random() < 0.2
        seq = _seq(f"r{i}", rng.randint(1, max_prompt), rng.randint(1 + handoff, max_out))
        if handoff:
            seq.token_ids.append(999)
            seq.num_computed = seq.num_prompt_tokens
        pending.append((rng.randint(0, 30), seq, handoff))
    pending.sort(key=lambda p: p[0])
    all_seqs = [p[1] for p in pending]
    start_computed = {s.request_id: s.num_computed for s in all_seqs}
    scheduled_tokens: Counter[str] = Counter()
    wasted: Counter[str] = Counter()  # tokens computed, then thrown away by a preemption
    preemptions: Counter[str] = Counter()
    imports: list[Sequence] = []
    done: list[Sequence] = []
    it = 0
    while pending or imports or sched.has_work():
        while pending and pending[0][0] <= it:
            _, seq, handoff = pending.pop(0)
            if handoff:
                imports.append(seq)
            else:
                sched.add(seq)
        imports = [s for s in imports if not sched.add_running(s)]
        computed_before = {id(s): s.num_computed for s in sched.running}
        out = sched.schedule()
        assert bool(out.items) == sched.has_work(), "scheduler stalled while it has work"
        # invariants on the plan
        assert len(sched.running) <= cfg.max_num_seqs
        total = sum(i.num_new_tokens for i in out.items)
        if len(out.items) > 1 or cfg.chunked_prefill:
            assert total <= cfg.max_num_batched_tokens
        assert len({id(i.seq) for i in out.items}) == len(out.items)
        # the first `decodes` are decode steps (what the engine's update takes in its fast loop), and
        # the tally counted while choosing is the one counted from the plan
        lead = out.items[: out.decodes]
        assert all(i.num_new_tokens == 1 and not i.seq.in_prefill for i in lead)
        rest = out.items[out.decodes :]
        assert not rest or rest[0].seq.in_prefill  # no decode step left out of the count
        assert out.work == SchedulerOutput(out.items).tally()
        for victim in out.preempted:
            preemptions[victim.request_id] += 1
            wasted[victim.request_id] += computed_before.get(id(victim), 0)
            assert victim.num_computed == 0
            if victim in sched.waiting:
                assert victim.status is SeqStatus.WAITING and victim.block_table == []
            else:  # re-admitted at once (e.g. a first chunk of its recomputation), from scratch
                assert victim in [i.seq for i in out.items]
        for item in out.items:
            seq = item.seq
            assert seq.status is SeqStatus.RUNNING
            assert 1 <= item.num_new_tokens <= seq.num_pending
            assert len(seq.block_table) * block_size >= item.context_len
            scheduled_tokens[seq.request_id] += item.num_new_tokens
        held = [b for s in sched.running for b in s.block_table]
        assert len(held) == len(set(held)), "a block is shared between two running sequences"
        assert len(held) + sched.blocks.num_free == cfg.num_blocks
        assert all(s.block_table == [] for s in sched.waiting)
        assert out.phase in ("prefill", "decode", "mixed", "idle")
        assert (out.phase == "idle") == (not out.items)
        done += _step(sched, out)
        it += 1
        assert it < 5000, "did not finish"
    assert sorted(s.request_id for s in done) == sorted(s.request_id for s in all_seqs)
    assert sched.blocks.num_free == cfg.num_blocks
    for seq in all_seqs:
        rid = seq.request_id
        assert seq.status is SeqStatus.FINISHED
        assert seq.num_output_tokens == seq.params.max_tokens
        assert seq.num_preemptions == preemptions[rid]
        # every token but the last sampled one went through the model once, plus recomputation
        expected = seq.num_tokens - 1 - start_computed[rid] + wasted[rid]
        assert scheduled_tokens[rid] == expected
        assert seq.num_computed == seq.num_tokens - 1
