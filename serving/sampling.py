"""Token sampling: greedy, temperature and top-p, reproducible per request seed."""

from __future__ import annotations

import torch

from serving.config import SamplingParams


class Sampler:
    """Samples one token per row of logits; keeps a generator per seeded request."""

    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, requests: list[tuple[str, SamplingParams]]) -> list[int]:
        """`logits` is [N, vocab] float32; row i belongs to requests[i]."""
        greedy = logits.argmax(dim=-1).tolist()
        out = []
        for i, (rid, params) in enumerate(requests):
            if params.temperature == 0:
                out.append(greedy[i])
            else:
                out.append(self._sample_row(logits[i].cpu(), rid, params))
        return out

    def _sample_row(self, row: torch.Tensor, rid: str, params: SamplingParams) -> int:
        gen = self._generators.get(rid)
        if gen is None:
            gen = torch.Generator()
            if params.seed is not None:
                gen.manual_seed(params.seed)
            else:
                gen.seed()
            self._generators[rid] = gen
        probs = torch.softmax(row / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_p, idx = probs.sort(descending=True)
            keep = sorted_p.cumsum(0) - sorted_p < params.top_p  # always keeps the top token
            sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
            choice = torch.multinomial(sorted_p / sorted_p.sum(), 1, generator=gen)
            return int(idx[choice])
        return int(torch.multinomial(probs, 1, generator=gen))
