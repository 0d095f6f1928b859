"""Engine request/output contracts (DESIGN §3): the values that cross the engine boundary.

msgspec Structs so the same values travel over the wire in later (multi-process) layers.
"""

from __future__ import annotations

import enum
from typing import NewType

import msgspec

from armature.protocols.guide import Guide
from armature.protocols.kv_events import KvTier
from armature.protocols.kv_transfer import KvHandle

__all__ = [
    "EngineLoad",
    "EngineOutput",
    "EngineRequest",
    "EngineStats",
    "FinishReason",
    "KvTierStats",
    "RequestId",
    "SamplingParams",
    "StepRecord",
    "TokenLogprob",
    "coalesce_outputs",
    "merge_outputs",
]

RequestId = NewType("RequestId", str)


class FinishReason(enum.StrEnum):
    STOP = "stop"  # EOS, a stop token id, or a stop string
    LENGTH = "length"  # max_tokens or the context limit
    ABORT = "abort"  # cancelled by the caller
    ERROR = "error"  # the engine failed this request
    TRANSFER = "transfer"  # prefill done; continue on a decode worker from the output's kv_handle


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """How to pick tokens. Validated at the edge (frontend); the engine trusts these values.

    temperature 0 means greedy. top_k 0 means disabled. min_p (vLLM's) drops the tokens whose
    probability, after temperature, is below min_p times the most likely one's (0: off).
    logprobs None means none returned;
    an int n >= 0 returns the sampled token's logprob and the n most likely alternatives.
    prompt_logprobs n >= 0 returns, with the first output, each prompt token's logprob (all
    but the first token's) and the n most likely alternatives there, from the model's raw
    logits: the whole prompt is computed (no prefix-cache or lower-tier hits; a remote
    prefill computes them, a resumed request with output asks for none).
    Penalties (0, 0, 1 and no bias: off) change the logits that pick the token, never the
    logprobs reported: presence and frequency penalties (OpenAI) are subtracted from the
    logits of tokens already generated, once and once per occurrence; the repetition penalty
    (vLLM, transformers) divides the positive and multiplies the negative logits of tokens in
    the prompt or the output; logit_bias adds (token id, bias) pairs, sorted by token id.
    A guide masks every token that would leave its grammar, and the request finishes (STOP)
    once the grammar is complete; the logprobs reported are those of the masked logits.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    guide: Guide | None = None  # structured output: what the output must match (guide.py)

    @property
    def uses_penalties(self) -> bool:
        """Whether any penalty or bias changes the logits."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
        )


class EngineRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One generation request. `output_token_ids` resumes a request (migration, recompute):
    the engine treats prompt + output so far as context and continues after them."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    output_token_ids: list[int] = msgspec.field(default_factory=list)
    # disaggregation: this leg computes the prompt and the first token, then pins the prompt's
    # blocks and finishes with FinishReason.TRANSFER and a kv_handle (unless already finished)
    remote_prefill: bool = False
    # disaggregation: the prompt's blocks may be pulled from this handle before computing
    kv_handle: KvHandle | None = None
    # the LoRA adapter to run with, by name (None: the base model); it salts the block hashes
    lora_name: str | None = None

    @property
    def computes_whole_prompt(self) -> bool:
        """Whether every prompt position is computed, no cached prefix serving it: its
        prompt's logprobs are wanted (a resumed leg gave them already, and hits the cache)."""
        return self.sampling.prompt_logprobs is not None and not self.output_token_ids


class TokenLogprob(msgspec.Struct, frozen=True):
    """Log-probability of one generated token, with the top alternatives (token id, logprob)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


class EngineOutput(msgspec.Struct, kw_only=True):
    """Tokens produced for one request by one engine step (usually one token)."""

    request_id: str
    new_token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    # with the first output of a request that asked for them: prompt tokens 1.. (the first
    # has no logprob), in order (None: not asked for, or an engine that does not compute them)
    prompt_logprobs: list[TokenLogprob] | None = None
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    error: str | None = None
    kv_handle: KvHandle | None = None  # with FinishReason.TRANSFER
    # with `error`: the request's field the engine could not follow (a guide past the
    # structured-output library's limits): the request's fault, a 400; None: the engine's
    error_param: str | None = None


class EngineLoad(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of an engine's load, for routers and planners.

    The last three fields feed tier-aware routing (docs/architecture.md, "Tier-aware routing")
    and default to "not measured" so that loads from older senders decode: the measured
    seconds one prefill block costs (wall time of prefill-only steps over the blocks they
    computed), the measured seconds one block costs to load back from each lower tier, and
    each lower tier's capacity in blocks (a tier absent has no capacity: the engine lacks it).
    """

    num_active_blocks: int
    num_total_blocks: int
    num_waiting: int
    num_running: int
    num_prefill_tokens_queued: int
    num_steps: int = 0  # engine steps run so far: a worker with work whose count stalls is hung
    prefill_s_per_block: float | None = None
    onboard_s_per_block: dict[KvTier, float] = msgspec.field(default_factory=dict)
    num_tier_total_blocks: dict[KvTier, int] = msgspec.field(default_factory=dict)

    @classmethod
    def idle(cls, num_total_blocks: int) -> EngineLoad:
        """The load of an engine with `num_total_blocks` and nothing to do."""
        return cls(
            num_active_blocks=0,
            num_total_blocks=num_total_blocks,
            num_waiting=0,
            num_running=0,
            num_prefill_tokens_queued=0,
        )


class KvTierStats(msgspec.Struct, frozen=True, kw_only=True):
    """What an engine's lower KV tiers (G2 host, G3 disk, G4 shared store) did since start.
    Paths are "g1->g2" style (g1: the engine's own KV memory); tiers are KvTier values."""

    bytes_per_block: int
    blocks_offloaded: dict[str, int]  # path -> blocks copied down
    blocks_onboarded: dict[str, int]  # path (gN->g1) -> blocks loaded back
    blocks_refused: dict[str, int]  # reason (corrupt, truncated, missing, ...) -> blocks
    write_failures: dict[str, int]  # tier -> failed writes (the first disables the tier)
    num_lookup_blocks: int  # prompt blocks looked up below G1
    hit_blocks: dict[str, int]  # tier -> lookups it answered
    tier_blocks: dict[str, int]  # tier -> blocks it holds now
    tier_capacity_blocks: dict[str, int]
    onboard_latency_buckets_s: list[float]  # upper bounds
    onboard_latency_counts: list[int]  # per bucket (not cumulative), then one for +Inf
    onboard_latency_sum_s: float


class EngineStats(msgspec.Struct, frozen=True, kw_only=True):
    """An engine's counters for metrics: KV transfers into it (decode side), the blocks it
    holds for others (prefill side) and its lower KV tiers (None: it has none)."""

    num_kv_pulls_by_backend: dict[str, int] = msgspec.field(default_factory=dict)
    num_kv_pull_failures: int = 0
    num_kv_blocks_pulled: int = 0
    num_kv_pinned_blocks: int = 0
    num_kv_expired_pins: int = 0
    tiers: KvTierStats | None = None


class StepRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What one engine step did (DESIGN §6: the planner fits its performance model from these
    and publishes nothing itself; workers send them on the event plane in `WorkerUpdate`).

    Scheduled counts are the step's batch: a prefill is any chunk that is not a single decode
    token (a prompt chunk, a recompute after preemption); decode KV tokens are the context
    lengths the decode requests attend over (their new token included). KV tokens used are
    the engine's blocks in use while the step ran, in tokens (whole blocks). Queued counts are
    what is left to prefill after the step (waiting requests, unfinished prompt chunks). An
    engine that cannot observe a field reports 0 (each adapter documents which); every field
    has a default so that records from older or newer senders decode.
    """

    num_scheduled_prefill_requests: int = 0
    num_scheduled_prefill_tokens: int = 0
    num_queued_prefill_requests: int = 0
    num_queued_prefill_tokens: int = 0
    num_decode_requests: int = 0
    num_decode_kv_tokens: int = 0
    num_kv_tokens_used: int = 0
    step_wall_s: float = 0.0  # the mocker's: its modeled step time (on its clock)
    # each prefill chunk's new tokens times the tokens before it (a prefix-cache hit, earlier
    # chunks), summed: the attention over earlier context a fresh prompt does not pay
    num_prefill_context_pairs: int = 0


def coalesce_outputs(outputs: list[EngineOutput]) -> list[EngineOutput]:
    """Consecutive outputs of one request, merged into as few as keep their meaning: one, or
    the tokens' output and then the failed output that ends them (a failure never carries
    the tokens before it, which were good)."""
    if len(outputs) > 1 and outputs[-1].finish_reason is FinishReason.ERROR:
        return [*coalesce_outputs(outputs[:-1]), outputs[-1]]
    return outputs if len(outputs) == 1 else [merge_outputs(outputs)]


def merge_outputs(outputs: list[EngineOutput]) -> EngineOutput:
    """Consecutive outputs of one request as one: tokens and logprobs concatenated, the first
    output's prompt counts, the last one's finish reason and error."""
    first, last = outputs[0], outputs[-1]
    if any(o.request_id != first.request_id for o in outputs):
        raise ValueError("outputs of different requests cannot be merged")
    has_logprobs = all(o.logprobs is not None for o in outputs if o.new_token_ids)
    return EngineOutput(
        request_id=first.request_id,
        new_token_ids=[t for o in outputs for t in o.new_token_ids],
        logprobs=[lp for o in outputs for lp in (o.logprobs or [])] if has_logprobs else None,
        prompt_logprobs=first.prompt_logprobs,
        finish_reason=last.finish_reason,
        num_prompt_tokens=first.num_prompt_tokens,
        num_cached_tokens=first.num_cached_tokens,
        error=last.error,
        kv_handle=last.kv_handle,
    )
