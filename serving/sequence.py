"""Per-request state inside one engine (torch-free)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from serving.config import SamplingParams


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """One request's tokens and its place in the paged KV cache.

    `num_computed` counts the tokens whose K/V are in the cache; the tokens after it are what the
    next iteration must compute (the whole prompt, a prompt chunk, or the last sampled token).
    """

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    arrival_s: float
    handoff: bool = False  # prefill-only: hand the KV to a decode worker after the first token
    status: SeqStatus = SeqStatus.WAITING
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    num_preemptions: int = 0
    first_scheduled_s: float | None = None
    prefill_start_s: float | None = None
    prefill_end_s: float | None = None
    token_times: list[float] | None = None  # where the engine records plain tokens' times (the simulator:
    # an array("d"))
    # set by its engine when it is added (EngineCore.add_request, queue_prefilled): the tokens that stop
    # it (its stop ids, and the model's EOS unless it ignores them) and the length at which it stops
    # (its prompt + max_tokens, or the model's context); read once per token
    stop_ids: frozenset[int] | None = None
    max_len: int | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_pending(self) -> int:
        """Tokens the next iteration must run through the model for this sequence."""
        return len(self.token_ids) - self.num_computed

    @property
    def in_prefill(self) -> bool:
        """More than one token pending (a prompt, a chunk, a recompute), or the prompt unfinished."""
        return self.num_computed < len(self.token_ids) - 1 or self.num_computed < self.num_prompt_tokens
