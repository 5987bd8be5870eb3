"""Token sampling: greedy, temperature and top-p; seeded draws that do not depend on the worker.

Each sampled token uses one uniform number u in [0, 1) and inverse-CDF sampling over the
(temperature-scaled, top-p-truncated) distribution, computed in float64. For a seeded request, u is
a counter-based hash of (seed, output token index), so token k of a request gets the same draw on
whichever worker samples it: a prefill worker (token 0) and a decode worker after the KV hand-off
(tokens 1..) reproduce an aggregated run exactly. Unseeded requests draw u from a per-process
generator seeded from the OS. The sampler keeps no per-request state.

Presence/frequency penalties (OpenAI's definition, over the request's output tokens) are applied to
the logits first. Temperatures below `GREEDY_TEMPERATURE` sample greedily (dividing by them would
overflow). NaN logits are never chosen; +inf logits share the whole probability; a row with no
usable logit raises `SamplingError` for that row only.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from typing import Any

import torch

from serving.config import SamplingParams

GREEDY_TEMPERATURE = 1e-5
_MASK64 = (1 << 64) - 1


class SamplingError(ValueError):
    """One row of logits could not be sampled (e.g. all NaN); fails only that row's request."""


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def seeded_uniform(seed: int, index: int) -> float:
    """The uniform draw in [0, 1) of output token `index` of a request seeded with `seed`."""
    return (_splitmix64(_splitmix64(seed & _MASK64) ^ (index & _MASK64)) >> 11) * 2.0**-53


def apply_penalties(row: torch.Tensor, params: SamplingParams, output_ids: Sequence[int]) -> torch.Tensor:
    """OpenAI's presence and frequency penalties on one row: logit[j] -= frequency * count[j] +
    presence * (count[j] > 0), counting token j among the request's output tokens so far."""
    if not params.penalized or not output_ids:
        return row
    counts = torch.bincount(torch.tensor(list(output_ids)), minlength=row.numel())[: row.numel()]
    counts = counts.to(row.device, row.dtype)
    return row - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).to(row.dtype)


def sample_row(row: torch.Tensor, params: SamplingParams, u: float) -> int:
    """One token from one row of logits: greedy below `GREEDY_TEMPERATURE`, else inverse-CDF sampling
    at `params.temperature` and `params.top_p` with the uniform draw `u`, in float64."""
    x = row.detach().to("cpu", torch.float64)
    x = torch.where(torch.isnan(x), float("-inf"), x)
    posinf = torch.isposinf(x)
    if bool(posinf.any()):  # these dominate every finite logit: share the mass among them
        x = torch.where(posinf, 0.0, float("-inf"))
    top = float(x.max())
    if top == float("-inf"):
        raise SamplingError("the model produced no finite logit (all NaN or -inf) for this request")
    if params.temperature < GREEDY_TEMPERATURE:
        return int(x.argmax())
    probs = torch.exp((x - top) / params.temperature)  # max is exactly 1: no overflow, no all-zero row
    if params.top_p < 1.0:
        probs, order = probs.sort(descending=True)
        keep = probs.cumsum(0) - probs < params.top_p * probs.sum()  # always keeps the top token
        probs = torch.where(keep, probs, 0.0)
    else:
        order = None
    cdf = probs.cumsum(0)
    target = torch.tensor([u * float(cdf[-1])], dtype=torch.float64)
    i = min(int(torch.searchsorted(cdf, target, right=True)), len(cdf) - 1)
    return int(order[i]) if order is not None else i


class Sampler:
    """Samples one token per row of logits (greedy or random); stateless across requests."""

    def __init__(self) -> None:
        self._rng = random.Random(os.urandom(16))

    def sample(self, logits: torch.Tensor, rows: list[tuple[Any, ...]]) -> list[int | SamplingError]:
        """`logits` is [N, vocab]; rows[i] = (params, output token index[, output ids so far]) of row i.

        The output ids are needed only for presence/frequency penalties. A row that cannot be
        sampled gives its `SamplingError` instead of a token, so one bad request does not fail the
        others in the batch.
        """
        clean = torch.where(torch.isnan(logits), float("-inf"), logits)
        greedy = clean.argmax(dim=-1).tolist()
        usable = (clean.amax(dim=-1) > float("-inf")).tolist()
        per_row = [i for i, (p, *_) in enumerate(rows) if p.temperature >= GREEDY_TEMPERATURE or p.penalized]
        on_host: dict[int, torch.Tensor] = {}  # one device-to-host copy for all rows sampled one by one
        if per_row:
            host = logits[per_row].detach().to("cpu", torch.float64)
            on_host = {i: host[k] for k, i in enumerate(per_row)}
        out: list[int | SamplingError] = []
        for i, (params, index, *history) in enumerate(rows):
            try:
                if i not in on_host:
                    if not usable[i]:
                        raise SamplingError("the model produced no finite logit (all NaN or -inf)")
                    out.append(int(greedy[i]))
                    continue
                row = apply_penalties(on_host[i], params, history[0] if history else ())
                u = seeded_uniform(params.seed, index) if params.seed is not None else self._rng.random()
                out.append(sample_row(row, params, u))
            except SamplingError as e:
                out.append(e)
            except Exception as e:  # a bug or bad values in one row must not fail the batch
                out.append(SamplingError(f"sampling failed: {type(e).__name__}: {e}"))
        return out
