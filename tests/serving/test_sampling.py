"""Sampler: greedy, seeded temperature sampling keyed on (seed, token index), top-p, numeric safety."""

from __future__ import annotations

import pytest
import torch

from serving.config import ConfigError, SamplingParams
from serving.sampling import (
    GREEDY_TEMPERATURE,
    Sampler,
    SamplingError,
    apply_penalties,
    sample_row,
    seeded_uniform,
)

VOCAB = 64


def _logits(rows: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed))


def _draws(sampler: Sampler, params: SamplingParams, n: int, logits: torch.Tensor) -> list[int]:
    """Tokens 0..n-1 of one request whose every step sees `logits`."""
    return [sampler.sample(logits, [(params, k)])[0] for k in range(n)]


def test_greedy_is_argmax_per_row() -> None:
    logits = _logits(5)
    greedy = SamplingParams(temperature=0.0)
    out = Sampler().sample(logits, [(greedy, 0)] * 5)
    assert out == logits.argmax(-1).tolist()
    assert all(isinstance(t, int) for t in out)


def test_greedy_ignores_seed() -> None:
    logits = _logits()
    assert _draws(Sampler(), SamplingParams(temperature=0.0, seed=5), 3, logits) == [int(logits.argmax())] * 3


def test_mixed_batch_rows_go_to_their_requests() -> None:
    logits = torch.full((2, VOCAB), -1e4)
    logits[0, 7] = 0.0
    logits[1, 42] = 0.0
    out = Sampler().sample(logits, [(SamplingParams(temperature=0.0), 0), (SamplingParams(1.0, seed=1), 0)])
    assert out == [7, 42]


def test_seeded_sampling_is_reproducible_and_seed_dependent() -> None:
    logits = _logits()
    p = SamplingParams(temperature=1.5, seed=1234)
    a = _draws(Sampler(), p, 30, logits)
    assert a == _draws(Sampler(), p, 30, logits)
    assert len(set(a)) > 3  # it really samples (near-flat distribution at T=1.5)
    assert _draws(Sampler(), SamplingParams(temperature=1.5, seed=99), 30, logits) != a


def test_seeded_draw_depends_only_on_seed_and_token_index() -> None:
    """What a decode worker needs after a hand-off: token k's draw, without tokens 0..k-1's."""
    logits = _logits()
    p = SamplingParams(temperature=1.5, seed=7)
    whole = _draws(Sampler(), p, 20, logits)
    fresh = [Sampler().sample(logits, [(p, k)])[0] for k in range(20)]  # a new sampler per token
    assert fresh == whole
    assert whole[1] != whole[0] or whole[2] != whole[1]  # token k does not reuse token 0's draw
    s = Sampler()
    pairs = [s.sample(torch.cat([logits, logits]), [(p, k), (p, k)]) for k in range(20)]
    assert [a for a, _ in pairs] == whole and [b for _, b in pairs] == whole  # batch-independent


def test_seeded_uniform_is_in_unit_interval_and_spread() -> None:
    us = [seeded_uniform(s, k) for s in (0, 1, -1, 2**63) for k in range(256)]
    assert all(0.0 <= u < 1.0 for u in us)
    assert len(set(us)) == len(us)
    assert 0.4 < sum(us) / len(us) < 0.6


def test_unseeded_requests_differ() -> None:
    logits = torch.zeros(1, VOCAB)  # uniform
    p = SamplingParams(temperature=1.0)
    s = Sampler()
    assert _draws(s, p, 20, logits) != _draws(s, p, 20, logits)


def test_tiny_top_p_keeps_only_the_top_token() -> None:
    logits = _logits(seed=3)
    top = int(logits.argmax())
    draws = _draws(Sampler(), SamplingParams(temperature=2.0, top_p=1e-6, seed=0), 50, logits)
    assert set(draws) == {top}


def test_top_p_restricts_to_nucleus() -> None:
    logits = torch.full((1, VOCAB), -1e4)
    logits[0, [3, 9, 20]] = torch.tensor([2.0, 1.9, 1.8])  # three tokens hold ~all the mass
    draws = _draws(Sampler(), SamplingParams(temperature=1.0, top_p=0.5, seed=0), 200, logits)
    assert set(draws) == {3, 9}


def test_sampling_follows_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    p = SamplingParams(temperature=1.0, seed=3)
    draws = _draws(Sampler(), p, 3000, logits)
    freq = [draws.count(i) / len(draws) for i in range(3)]
    assert freq == pytest.approx([0.7, 0.2, 0.1], abs=0.03)


@pytest.mark.parametrize("temperature", [1e-44, 1e-30, GREEDY_TEMPERATURE / 2])
def test_tiny_temperatures_are_greedy(temperature: float) -> None:
    logits = _logits(4, seed=5)
    out = Sampler().sample(logits, [(SamplingParams(temperature=temperature, seed=1), 0)] * 4)
    assert out == logits.argmax(-1).tolist()


@pytest.mark.parametrize("temperature", [GREEDY_TEMPERATURE, 1e-4, 1e6, 1e300])
def test_extreme_temperatures_sample_valid_tokens(temperature: float) -> None:
    logits = _logits(seed=6) * 1e4  # large logits: exp would overflow without the max shift
    draws = _draws(Sampler(), SamplingParams(temperature=temperature, seed=2), 20, logits)
    assert all(0 <= t < VOCAB for t in draws)
    if temperature <= 1e-4:
        assert set(draws) == {int(logits.argmax())}


def test_nan_and_inf_logits_are_safe() -> None:
    row = torch.full((VOCAB,), float("nan"))
    row[[4, 8]] = torch.tensor([1.0, 0.5])
    p = SamplingParams(temperature=1.0, seed=0)
    assert {sample_row(row, p, u) for u in (0.0, 0.3, 0.6, 0.99)} <= {4, 8}  # NaN never chosen
    row = torch.randn(VOCAB)
    row[[10, 20]] = float("inf")
    assert {sample_row(row, p, u) for u in (0.0, 0.49, 0.51, 0.999)} == {10, 20}  # +inf shares the mass
    row = torch.full((VOCAB,), float("-inf"))
    row[5] = 3.0
    assert sample_row(row, SamplingParams(temperature=0.5, top_p=0.1, seed=0), 0.999) == 5


def test_a_row_without_finite_logits_fails_only_that_row() -> None:
    logits = _logits(3)
    logits[1] = float("nan")
    for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=1)):
        out = Sampler().sample(logits, [(params, 0)] * 3)
        assert isinstance(out[1], SamplingError) and "no finite logit" in str(out[1])
        assert isinstance(out[0], int) and isinstance(out[2], int)


@pytest.mark.parametrize(
    "kw",
    [
        {"temperature": float("nan")},
        {"temperature": float("inf")},
        {"temperature": -1.0},
        {"top_p": float("nan")},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"max_tokens": 0},
        {"presence_penalty": 2.5},
        {"frequency_penalty": float("nan")},
    ],
)
def test_sampling_params_reject_invalid_values(kw: dict) -> None:
    with pytest.raises(ConfigError):
        SamplingParams(**kw)


def test_penalties_follow_openai_definition() -> None:
    row = torch.zeros(VOCAB, dtype=torch.float64)
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_penalties(row, p, [3, 3, 3, 7])
    assert out[3] == -(0.5 + 3 * 0.25) and out[7] == -(0.5 + 0.25)
    assert out[0] == 0 and int((out != 0).sum()) == 2
    assert apply_penalties(row, SamplingParams(), [3]) is row  # no penalties: untouched


def test_penalties_steer_greedy_and_sampled_rows() -> None:
    logits = torch.zeros(2, VOCAB)
    logits[:, 5] = 1.0  # token 5 leads by 1
    plain = SamplingParams(temperature=0.0)
    pen = SamplingParams(temperature=0.0, presence_penalty=1.5)
    assert Sampler().sample(logits, [(plain, 1, [5]), (pen, 1, [5])]) == [5, 0]  # 5 pushed below 0s
    sampled = SamplingParams(temperature=1e-3, frequency_penalty=2.0, seed=1)
    assert Sampler().sample(logits[:1], [(sampled, 1, [5])])[0] != 5
