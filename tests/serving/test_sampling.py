"""Sampler: greedy, seeded temperature sampling per request, top-p."""

from __future__ import annotations

import torch

from serving.config import SamplingParams
from serving.sampling import Sampler

VOCAB = 64


def _logits(rows: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed))


def _draws(sampler: Sampler, rid: str, params: SamplingParams, n: int, logits: torch.Tensor) -> list[int]:
    return [sampler.sample(logits, [(rid, params)])[0] for _ in range(n)]


def test_greedy_is_argmax_per_row() -> None:
    logits = _logits(5)
    greedy = SamplingParams(temperature=0.0)
    out = Sampler().sample(logits, [(f"r{i}", greedy) for i in range(5)])
    assert out == logits.argmax(-1).tolist()
    assert all(isinstance(t, int) for t in out)


def test_greedy_ignores_seed_and_keeps_no_state() -> None:
    s = Sampler()
    logits = _logits()
    assert _draws(s, "r", SamplingParams(temperature=0.0, seed=5), 3, logits) == [int(logits.argmax())] * 3
    assert s._generators == {}


def test_mixed_batch_rows_go_to_their_requests() -> None:
    logits = torch.full((2, VOCAB), -1e4)
    logits[0, 7] = 0.0
    logits[1, 42] = 0.0
    out = Sampler().sample(
        logits, [("a", SamplingParams(temperature=0.0)), ("b", SamplingParams(1.0, seed=1))]
    )
    assert out == [7, 42]


def test_seeded_sampling_is_reproducible_per_request() -> None:
    logits = _logits()
    p = SamplingParams(temperature=1.5, seed=1234)
    a = _draws(Sampler(), "req", p, 30, logits)
    b = _draws(Sampler(), "req", p, 30, logits)
    assert a == b
    assert len(set(a)) > 3  # it really samples (near-flat distribution at T=1.5)
    c = _draws(Sampler(), "req", SamplingParams(temperature=1.5, seed=99), 30, logits)
    assert c != a


def test_requests_have_independent_generators() -> None:
    logits = _logits()
    p = SamplingParams(temperature=1.5, seed=7)
    alone = _draws(Sampler(), "x", p, 20, logits)
    s = Sampler()
    x, y = [], []
    for _ in range(20):  # interleaved, in one batch: y's draws must not disturb x's stream
        tx, ty = s.sample(torch.cat([logits, logits]), [("x", p), ("y", SamplingParams(1.5, seed=8))])
        x.append(tx)
        y.append(ty)
    assert x == alone
    # the same seed on another request id gives that request its own, identical stream
    s2 = Sampler()
    pairs = [s2.sample(torch.cat([logits, logits]), [("x", p), ("z", p)]) for _ in range(20)]
    assert [a for a, _ in pairs] == alone
    assert [b for _, b in pairs] == alone


def test_tiny_top_p_keeps_only_the_top_token() -> None:
    logits = _logits(seed=3)
    top = int(logits.argmax())
    s = Sampler()
    draws = _draws(s, "r", SamplingParams(temperature=2.0, top_p=1e-6, seed=0), 50, logits)
    assert set(draws) == {top}


def test_top_p_restricts_to_nucleus() -> None:
    logits = torch.full((1, VOCAB), -1e4)
    logits[0, [3, 9, 20]] = torch.tensor([2.0, 1.9, 1.8])  # three tokens hold ~all the mass
    s = Sampler()
    draws = _draws(s, "r", SamplingParams(temperature=1.0, top_p=0.5, seed=0), 200, logits)
    assert set(draws) <= {3, 9}
    assert set(draws) == {3, 9}


def test_forget_resets_the_request_stream() -> None:
    logits = _logits()
    p = SamplingParams(temperature=1.5, seed=42)
    s = Sampler()
    first = _draws(s, "r", p, 10, logits)
    assert "r" in s._generators
    s.forget("r")
    assert "r" not in s._generators
    assert _draws(s, "r", p, 10, logits) == first
    s.forget("never-seen")  # harmless


def test_unseeded_requests_differ() -> None:
    logits = torch.zeros(1, VOCAB)  # uniform
    p = SamplingParams(temperature=1.0)
    s = Sampler()
    a = _draws(s, "a", p, 20, logits)
    b = _draws(s, "b", p, 20, logits)
    assert a != b
