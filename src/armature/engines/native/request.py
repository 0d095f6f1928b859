"""A request's mutable state inside the engine (owned by the scheduler's thread)."""

from __future__ import annotations

import enum
from collections.abc import MutableSequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from armature.engines.native.lora_set import ServedLora
from armature.kv.hashing import DEFAULT_HASH_SEED, compute_block_hashes
from armature.protocols.engine import FinishReason, SamplingParams, TokenLogprob

if TYPE_CHECKING:
    import torch

    from armature.engines.native.grammar import RequestGrammar

__all__ = ["FoundPrefix", "RequestState", "RequestStatus"]


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    ONBOARDING = "onboarding"  # out of the queues while lower KV tiers load its prefix
    RUNNING = "running"
    FINISHED = "finished"


class FoundPrefix(NamedTuple):
    """The cached prefix `KvCacheManager.find_cached_prefix` last found for a waiting request
    in `pool`'s prefix cache, of at most `max_blocks` blocks: still cached, block for block,
    while the pool's `get_num_removals()` reads `num_removals` (it can only have grown)."""

    pool: object
    num_removals: int
    max_blocks: int
    block_ids: tuple[int, ...]


@dataclass(eq=False)
class RequestState:
    """token_ids = prompt + output. The first `num_computed_tokens` of them have K/V in
    `block_ids`; `block_hashes` covers the full blocks of token_ids (computed lazily)."""

    request_id: str
    # a list, or the simulator's array('I') of a prompt synthesized as one (take_prompt)
    token_ids: MutableSequence[int]
    num_prompt_tokens: int
    sampling: SamplingParams
    sampling_seed: int | None  # seeds `generator` (None: greedy, no generator)
    arrival_index: int
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache on first schedule
    num_output_at_start: int = 0  # output tokens carried in by a resumed request
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[tuple[int, int]] = field(default_factory=list)
    num_registered_blocks: int = 0  # leading blocks already registered in the prefix cache
    num_preemptions: int = 0
    remote_prefill: bool = False  # pin the prompt's blocks after the first token (disagg)
    held_block_ids: list[int] = field(default_factory=list)  # imported KV, held until admitted
    onboard_checked: bool = False  # lower KV tiers were asked for its prefix (until preempted)
    found_prefix: FoundPrefix | None = None  # its last prefix lookup while it waits
    finish_reason: FinishReason | None = None
    grammar: RequestGrammar | None = None  # structured output: advanced by each output token
    lora: ServedLora | None = None  # the adapter it runs with (None: the base model)
    hash_seed: int = DEFAULT_HASH_SEED  # of its block hashes: its adapter's salt
    # its random draws, seeded from `sampling_seed` and the position by the sampler (a runner
    # that picks its own tokens, the mocker's, never makes one)
    generator: torch.Generator | None = None
    # prompt logprobs asked for and not yet given: those of prompt tokens 1.. as far as the
    # runner has computed the prompt (entry i: token i + 1). While set, the whole prompt is
    # computed (no cached prefix), and a preemption computes it again. None once the first
    # output took them, or where none were asked for (or the request resumes with output)
    prompt_logprobs: list[TokenLogprob] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return list(self.token_ids[self.num_prompt_tokens :])

    def update_block_hashes(self, block_size: int) -> list[tuple[int, int]]:
        """Extend `block_hashes` to every full block of token_ids (seeded by `hash_seed`);
        returns all of them."""
        num_full = len(self.token_ids) // block_size
        have = len(self.block_hashes)
        if num_full > have:
            parent = self.block_hashes[-1][0] if self.block_hashes else None
            self.block_hashes.extend(
                compute_block_hashes(
                    self.token_ids, block_size, self.hash_seed, parent, start=have * block_size
                )
            )
        return self.block_hashes
