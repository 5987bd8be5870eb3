"""Engine in-process on the CPU: batching, stopping, preemption, chunked prefill, KV hand-off, telemetry."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from serving.config import BYTE_EOS, BYTE_VOCAB, EngineConfig, ModelConfig, SamplingParams, preset
from serving.devices import CpuDevice, Device, EmulatedDevice
from serving.engine import Engine, Handoff
from serving.model import LlamaForCausalLM
from serving.scheduler import AdmissionError
from serving.telemetry import TelemetryEmitter

CFG = ModelConfig(
    name="test-engine",
    vocab_size=BYTE_VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    max_position=512,
    rope_theta=10_000.0,
    eos_token_ids=(BYTE_EOS,),
)
BLOCK = 4
MAX_TOKENS = 10


def _model(cfg: ModelConfig = CFG) -> LlamaForCausalLM:
    # std 0.2: logits spread enough that greedy choices are not near-ties across batch shapes
    return LlamaForCausalLM(cfg).init_random(0, std=0.2).eval()


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """The matrices are tiny: one intra-op thread is fastest and immune to a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return _model()


def _engine(model: LlamaForCausalLM, telemetry: TelemetryEmitter | None = None, **kw) -> Engine:
    cfg = EngineConfig(**{"block_size": BLOCK, "num_blocks": 256, "max_model_len": 512, **kw})
    return Engine(model, cfg, CpuDevice(), telemetry=telemetry)


def _prompts(n: int, seed: int = 0, lo: int = 2, hi: int = 24) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.randint(0, 256, (k,), generator=g).tolist() for k in lens]


def _params(max_tokens: int = MAX_TOKENS, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=kw.pop("ignore_eos", True), **kw)


def _drain(engine: Engine, max_steps: int = 10_000) -> tuple[dict[str, list], list[Handoff]]:
    """Step until idle; return each request's [(token, finish_reason, meta)] and all hand-offs."""
    outs: dict[str, list] = {}
    handoffs: list[Handoff] = []
    steps = 0
    while engine.has_work():
        res = engine.step()
        for o in res.outputs:
            outs.setdefault(o.request_id, []).append((o.token_id, o.finish_reason, o.meta))
        handoffs += res.handoffs
        steps += 1
        assert steps < max_steps, "engine did not finish"
    return outs, handoffs


def _tokens(outs: dict[str, list]) -> dict[str, list[int]]:
    return {rid: [t for t, _, _ in v] for rid, v in outs.items()}


def _run(engine: Engine, prompts: list[list[int]], params: SamplingParams | None = None) -> dict[str, list]:
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params or _params())
    outs, handoffs = _drain(engine)
    assert handoffs == []
    return outs


def _alone(model: LlamaForCausalLM, prompt: list[int], params: SamplingParams | None = None) -> list[int]:
    return _tokens(_run(_engine(model), [prompt], params))["r0"]


def _assert_idle(engine: Engine) -> None:
    stats = engine.stats()
    assert stats["running"] == 0 and stats["waiting"] == 0
    assert stats["kv_blocks_used"] == 0
    assert not engine.has_work()


# -- correctness of batching ---------------------------------------------------------------------------


def test_batched_greedy_equals_each_request_alone(model) -> None:
    prompts = _prompts(6)
    eng = _engine(model)
    outs = _run(eng, prompts)
    got = _tokens(outs)
    for i, p in enumerate(prompts):
        assert got[f"r{i}"] == _alone(model, p), f"request r{i} differs when batched"
        assert len(got[f"r{i}"]) == MAX_TOKENS
    assert len({tuple(v) for v in got.values()}) > 1  # the requests really differ
    _assert_idle(eng)
    assert eng.iterations == MAX_TOKENS  # all prompts fit one iteration, then one decode per token


def test_max_tokens_gives_length_on_the_last_token_only(model) -> None:
    outs = _run(_engine(model), [[1, 2, 3]], _params(max_tokens=4))
    reasons = [r for _, r, _ in outs["r0"]]
    assert reasons == [None, None, None, "length"]


def test_single_token_request(model) -> None:
    outs = _run(_engine(model), [[5, 6, 7]], _params(max_tokens=1))
    assert [r for _, r, _ in outs["r0"]] == ["length"]


def test_max_model_len_gives_length(model) -> None:
    eng = _engine(model, max_model_len=12)
    eng.add_request("r", list(range(8)), _params(max_tokens=4))
    outs, _ = _drain(eng)
    assert [r for _, r, _ in outs["r"]] == [None, None, None, "length"]
    with pytest.raises(AdmissionError, match="context of 12 tokens"):
        eng.add_request("too-long", list(range(8)), _params(max_tokens=5))


def _stop_candidate(tokens: list[int]) -> tuple[int, int]:
    """A token of a greedy run and the index of its first occurrence (not the first token)."""
    for i, t in enumerate(tokens[1:], start=1):
        if t not in tokens[:i]:
            return t, i
    raise AssertionError(f"no usable stop token in {tokens}")


def test_stop_token_ids_stop_even_with_ignore_eos(model) -> None:
    """As in vLLM: `ignore_eos` ignores only the model's EOS ids, never the request's stop_token_ids."""
    prompt = _prompts(1, seed=3)[0]
    full = _alone(model, prompt)
    stop, idx = _stop_candidate(full)
    for ignore_eos in (False, True):
        outs = _run(_engine(model), [prompt], _params(ignore_eos=ignore_eos, stop_token_ids=(stop,)))
        assert [t for t, _, _ in outs["r0"]] == full[: idx + 1]  # the stop token is emitted, then it stops
        assert outs["r0"][-1][1] == "stop"
        assert all(r is None for _, r, _ in outs["r0"][:-1])


def test_model_eos_stops_unless_ignore_eos(model) -> None:
    prompt = _prompts(1, seed=4)[0]
    full = _alone(model, prompt)
    eos, idx = _stop_candidate(full)
    # the same weights (same shapes, same seed) with that token as the model's EOS
    eos_model = _model(dataclasses.replace(CFG, eos_token_ids=(eos,)))
    outs = _run(_engine(eos_model), [prompt], _params(ignore_eos=False))
    assert [t for t, _, _ in outs["r0"]] == full[: idx + 1]
    assert outs["r0"][-1][1] == "stop"
    outs = _run(_engine(eos_model), [prompt], _params(ignore_eos=True))
    assert [t for t, _, _ in outs["r0"]] == full
    assert outs["r0"][-1][1] == "length"


def test_duplicate_request_id_rejected(model) -> None:
    eng = _engine(model)
    eng.add_request("a", [1, 2], _params())
    with pytest.raises(ValueError, match="already"):
        eng.add_request("a", [3], _params())


# -- memory pressure and chunking -----------------------------------------------------------------------


def test_tiny_kv_cache_completes_all_with_same_outputs(model) -> None:
    prompts = _prompts(8, seed=1)
    big = _tokens(_run(_engine(model), prompts))
    events: list[dict] = []
    tel = TelemetryEmitter("w", lambda b: events.extend(b["events"]), max_batch_events=1)
    need = -(-(max(len(p) for p in prompts) + MAX_TOKENS) // BLOCK)
    eng = _engine(model, tel, num_blocks=need)  # room for about one request at a time
    small = _tokens(_run(eng, prompts))
    assert small == big
    assert sum(e["preempted"] for e in events) > 0  # the test really exercised preemption
    assert max(e["kv_blocks_used"] for e in events) <= need
    _assert_idle(eng)


@pytest.mark.parametrize("budget", [3, 8])
def test_chunked_prefill_gives_same_outputs(model, budget) -> None:
    prompts = _prompts(5, seed=2, lo=10, hi=40)
    plain = _tokens(_run(_engine(model), prompts))
    events: list[dict] = []
    tel = TelemetryEmitter("w", lambda b: events.extend(b["events"]), max_batch_events=1)
    eng = _engine(model, tel, chunked_prefill=True, max_num_batched_tokens=budget)
    assert _tokens(_run(eng, prompts)) == plain
    assert all(e["prefill_tokens"] + e["decode_seqs"] <= budget for e in events)
    assert any(e["phase"] == "mixed" for e in events)


def test_chunked_prefill_with_tiny_cache(model) -> None:
    prompts = _prompts(6, seed=5, lo=10, hi=30)
    plain = _tokens(_run(_engine(model), prompts))
    need = -(-(max(len(p) for p in prompts) + MAX_TOKENS) // BLOCK)
    eng = _engine(model, chunked_prefill=True, max_num_batched_tokens=6, num_blocks=need + 1)
    assert _tokens(_run(eng, prompts)) == plain
    _assert_idle(eng)


# -- disaggregation: KV hand-off ----------------------------------------------------------------------------


def test_handoff_then_decode_elsewhere_equals_one_engine(model) -> None:
    prompts = _prompts(4, seed=6)
    single = _tokens(_run(_engine(model), prompts))
    prefill = _engine(model)
    for i, p in enumerate(prompts):
        prefill.add_request(f"r{i}", p, _params(), handoff=True)
    first, handoffs = _drain(prefill)
    _assert_idle(prefill)  # the prompt KV left with the hand-off
    assert sorted(h.request_id for h in handoffs) == sorted(single)
    need = -(-(max(len(p) for p in prompts) + MAX_TOKENS) // BLOCK)
    decode = _engine(model, num_blocks=need + 1)  # too small for all: imports wait their turn
    for h in handoffs:
        i = int(h.request_id[1:])
        prompt = prompts[i]
        assert len(first[h.request_id]) == 1
        token, reason, meta = first[h.request_id][0]
        assert reason is None
        assert h.token_ids == [*prompt, token]
        assert h.num_prompt_tokens == len(prompt)
        assert h.params == _params()
        assert h.kv.shape == (2, CFG.num_layers, len(prompt), CFG.num_kv_heads, CFG.head_dim)
        assert meta is not None and h.meta == meta
        assert meta["worker"] == "worker-0"
        assert meta["prefill_start_s"] <= meta["prefill_end_s"]
        decode.add_prefilled(h.request_id, h.token_ids, h.num_prompt_tokens, h.params, h.kv, h.meta)
    assert decode.stats()["waiting"] > 0
    rest, more = _drain(decode)
    assert more == []
    for rid, tokens in single.items():
        assert [first[rid][0][0]] + [t for t, _, _ in rest[rid]] == tokens, rid
        assert rest[rid][-1][1] == "length"
    _assert_idle(decode)


def test_seeded_sampling_after_handoff_equals_one_engine(model) -> None:
    """Token k of a seeded request uses the same draw on whichever engine samples it."""
    prompts = _prompts(3, seed=11)
    params = _params(max_tokens=16, temperature=0.8, seed=1234)
    single = _tokens(_run(_engine(model), prompts, params))
    assert len({t for toks in single.values() for t in toks}) > 8  # it really samples
    prefill, decode = _engine(model), _engine(model)
    for i, p in enumerate(prompts):
        prefill.add_request(f"r{i}", p, params, handoff=True)
    first, handoffs = _drain(prefill)
    for h in handoffs:
        decode.add_prefilled(h.request_id, h.token_ids, h.num_prompt_tokens, h.params, h.kv, h.meta)
    rest, _ = _drain(decode)
    for rid, tokens in single.items():
        assert [first[rid][0][0]] + [t for t, _, _ in rest[rid]] == tokens, rid
    unseeded = _params(max_tokens=16, temperature=0.8)
    runs = [_tokens(_run(_engine(model), prompts[:1], unseeded))["r0"] for _ in range(2)]
    assert runs[0] != runs[1]  # without a seed, requests stay random


def test_penalties_match_a_from_scratch_reference_and_survive_the_handoff(model) -> None:
    """Greedy with presence/frequency penalties equals argmax of the penalized full-sequence logits."""
    prompt = _prompts(1, seed=13)[0]
    params = _params(max_tokens=12, presence_penalty=1.0, frequency_penalty=0.5)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(12):
            logits = model.full_logits(prompt + out)[-1].double()
            for t in set(out):
                logits[t] -= 1.0 + 0.5 * out.count(t)
            out.append(int(logits.argmax()))
    got = _alone(model, prompt, params)
    assert got == out
    assert got != _alone(model, prompt, _params(max_tokens=12))  # the penalties changed the output
    prefill, decode = _engine(model), _engine(model)
    prefill.add_request("r", prompt, params, handoff=True)
    first, (h,) = _drain(prefill)
    decode.add_prefilled(h.request_id, h.token_ids, h.num_prompt_tokens, h.params, h.kv, h.meta)
    rest, _ = _drain(decode)
    assert [first["r"][0][0]] + [t for t, _, _ in rest["r"]] == out


def test_nan_logits_fail_only_that_request(model) -> None:
    """A request whose logits are all NaN is dropped with an error; the batch and engine go on."""
    prompts = _prompts(3, seed=12, lo=4)
    runs = {t: [_alone(model, p, _params(temperature=t, seed=5)) for p in prompts] for t in (0.0, 0.7)}
    used = {t for p in prompts for t in p} | {t for r in runs.values() for out in r for t in out}
    poison = next(t for t in range(256) if t not in used)  # only the bad request ever embeds it
    poisoned = _model()
    with torch.no_grad():
        poisoned.model.embed_tokens.weight[poison] = float("nan")
    for temperature, alone in runs.items():
        eng = _engine(poisoned)
        params = _params(temperature=temperature, seed=5)
        for i, p in enumerate(prompts):
            eng.add_request(f"r{i}", p, params)
        eng.add_request("bad", [1, poison, 2], params)
        outs: dict[str, list[int]] = {}
        errors = []
        while eng.has_work():
            res = eng.step()
            errors += res.errors
            for o in res.outputs:
                outs.setdefault(o.request_id, []).append(o.token_id)
        assert [rid for rid, _ in errors] == ["bad"]
        assert "no finite logit" in errors[0][1]
        assert "bad" not in outs
        assert [outs[f"r{i}"] for i in range(len(prompts))] == alone
        _assert_idle(eng)


def test_handoff_kv_equals_the_prompt_kv_of_a_full_run(model) -> None:
    prompt = _prompts(1, seed=7)[0]
    eng = _engine(model)
    eng.add_request("r", prompt, _params(), handoff=True)
    _, handoffs = _drain(eng)
    (h,) = handoffs
    # recompute the prompt's K/V in a fresh engine and export it directly
    ref = _engine(model)
    ref.add_request("x", prompt, _params())
    ref.step()
    seq = ref.scheduler.running[0]
    assert torch.equal(h.kv, ref.cache.export(seq.block_table, len(prompt)))


def test_handoff_that_finishes_on_first_token_is_not_handed_off(model) -> None:
    eng = _engine(model)
    eng.add_request("r", [1, 2, 3], _params(max_tokens=1), handoff=True)
    outs, handoffs = _drain(eng)
    assert handoffs == []
    assert outs["r"][0][1] == "length"


# -- abort ------------------------------------------------------------------------------------------------


def test_abort_frees_blocks(model) -> None:
    eng = _engine(model)
    for i, p in enumerate(_prompts(3, seed=8)):
        eng.add_request(f"r{i}", p, _params())
    eng.step()
    used = eng.stats()["kv_blocks_used"]
    assert used > 0
    blocks_r1 = len(next(s for s in eng.scheduler.running if s.request_id == "r1").block_table)
    assert eng.abort("r1")
    assert eng.stats()["kv_blocks_used"] == used - blocks_r1
    assert not eng.abort("r1")
    assert not eng.abort("nope")
    assert eng.abort("r0") and eng.abort("r2")
    _assert_idle(eng)
    assert eng.step().outputs == []


def test_abort_waiting_and_pending_import(model) -> None:
    eng = _engine(model, num_blocks=4, max_num_seqs=1)
    eng.add_request("run", [1, 2, 3], _params(max_tokens=4))
    eng.add_request("wait", [4, 5, 6], _params(max_tokens=4))
    eng.step()
    kv = torch.zeros(2, CFG.num_layers, 3, CFG.num_kv_heads, CFG.head_dim)
    eng.add_prefilled("imp", [7, 8, 9, 10], 3, _params(max_tokens=4), kv)
    assert eng.stats()["waiting"] == 2  # one queued request, one import waiting for a slot
    assert eng.abort("wait") and eng.abort("imp")
    outs, _ = _drain(eng)
    assert set(outs) == {"run"}
    _assert_idle(eng)


# -- telemetry ----------------------------------------------------------------------------------------------

FIELDS = {
    "type",
    "worker",
    "device",
    "start_s",
    "end_s",
    "phase",
    "batch_size",
    "prefill_tokens",
    "decode_seqs",
    "context_tokens",
    "kv_blocks_used",
    "kv_blocks_total",
}


def _telemetry_run(model, prompts, device: Device | None = None, **kw) -> tuple[Engine, list[dict]]:
    batches: list[dict] = []
    tel = TelemetryEmitter("worker-7", batches.append, max_batch_events=1000)
    eng = Engine(
        model,
        EngineConfig(block_size=BLOCK, num_blocks=64, max_model_len=512, **kw),
        device if device is not None else CpuDevice(),
        worker_id="worker-7",
        telemetry=tel,
    )
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, _params(max_tokens=3))
    _drain(eng)
    tel.flush()
    assert [b["seq"] for b in batches] == list(range(len(batches)))
    return eng, [e for b in batches for e in b["events"]]


def test_iteration_telemetry_fields(model) -> None:
    prompts = [[1, 2, 3, 4, 5], [6, 7]]
    eng, events = _telemetry_run(model, prompts)
    assert len(events) == eng.iterations == 3
    for e in events:
        assert e["type"] == "iteration"
        assert set(e) >= FIELDS
        assert e["worker"] == "worker-7" and e["device"] == "cpu"
        assert e["start_s"] <= e["end_s"]
        assert e["kv_blocks_total"] == 64
        assert 0 <= e["kv_blocks_used"] <= 64
        assert e["batch_size"] == 2
    assert [e["phase"] for e in events] == ["prefill", "decode", "decode"]
    assert [e["prefill_tokens"] for e in events] == [7, 0, 0]
    assert [e["decode_seqs"] for e in events] == [0, 2, 2]
    assert [e["context_tokens"] for e in events] == [7, 9, 11]
    assert events[0]["kv_blocks_used"] == 3  # 5 tokens -> 2 blocks, 2 tokens -> 1 block
    assert all(a["end_s"] <= b["start_s"] for a, b in itertools.pairwise(events))
    assert all(e["modeled_s"] is None and e["lag_s"] is None for e in events)  # measured, not modeled


def test_iteration_telemetry_carries_modeled_time_and_lag_on_an_emulated_device(model) -> None:
    """Each iteration says how long the modeled GPU took and how far the host ran past it (0 when
    paced); the events add up to the device's lag counters."""
    dev = EmulatedDevice("h100-sxm", model_shape=preset("llama-3.1-8b"))
    eng, events = _telemetry_run(model, [[1, 2, 3, 4, 5], [6, 7]], device=dev)
    stats = dev.stats()
    assert len(events) == stats.iterations == 3
    assert all(e["device"] == "emulated:h100-sxm" and e["modeled_s"] > 0.001 for e in events)
    assert sum(e["modeled_s"] for e in events) == pytest.approx(stats.modeled_s_total)
    lagged = [e for e in events if e["lag_s"] > 0]
    assert len(lagged) == stats.lagged_iterations
    assert sum(e["lag_s"] for e in events) == pytest.approx(stats.lag_s_total)
    assert all(e["pacing_s"] == 0 for e in lagged)
    assert all(e["lag_s"] == 0 and e["pacing_s"] > 0 for e in events if e not in lagged)
    assert eng.stats()["emulation"]["iterations"] == 3


def test_iteration_telemetry_mixed_phase(model) -> None:
    _, events = _telemetry_run(
        model, [list(range(12)), list(range(20))], chunked_prefill=True, max_num_batched_tokens=16
    )
    assert [e["phase"] for e in events][:3] == ["prefill", "mixed", "mixed"]
    assert events[1]["decode_seqs"] == 1 and events[1]["prefill_tokens"] == 15


def test_iteration_telemetry_kv_blocks_cover_the_attended_context(model) -> None:
    _, events = _telemetry_run(model, [[1, 2, 3, 4, 5]])
    for e in events:
        assert e["kv_blocks_used"] * BLOCK >= e["context_tokens"], e


def test_meta_only_on_first_token_even_after_preemption(model) -> None:
    prompts = _prompts(8, seed=1)
    events: list[dict] = []
    tel = TelemetryEmitter("w", lambda b: events.extend(b["events"]), max_batch_events=1)
    need = -(-(max(len(p) for p in prompts) + MAX_TOKENS) // BLOCK)
    outs = _run(_engine(model, tel, num_blocks=need), prompts)
    assert sum(e["preempted"] for e in events) > 0
    for rid, items in outs.items():
        assert items[0][2] is not None, rid
        timing = {"first_scheduled_s", "prefill_start_s", "prefill_end_s"}
        assert all(meta is None or not timing & set(meta) for _, _, meta in items[1:]), rid
