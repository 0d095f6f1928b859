"""Whether a request can ever be served by an engine of a given shape. Pure; shared by the
engine core and by a frontend's view of a remote worker (so both reject the same requests
with the same words)."""

from __future__ import annotations

from armature.engines.api import InvalidRequestError
from armature.kv.hashing import get_token_id_range
from armature.protocols.embedding import EmbedRequest
from armature.protocols.engine import EngineRequest

__all__ = [
    "check_structured_output",
    "fits_kv_cache",
    "get_num_kv_tokens",
    "validate_embed_request",
    "validate_request",
]


def validate_request(
    request: EngineRequest,
    *,
    vocab_size: int,
    max_model_len: int,
    block_size: int,
    num_kv_blocks: int,
) -> None:
    """Raise InvalidRequestError if `request` can never be served."""
    num_tokens = len(request.prompt_token_ids) + len(request.output_token_ids)
    if not request.prompt_token_ids:
        raise InvalidRequestError("the prompt is empty")
    low, high = get_token_id_range(request.prompt_token_ids)
    if low < 0 or high >= vocab_size:
        raise InvalidRequestError(f"prompt token ids must be in [0, {vocab_size})")
    if any(t < 0 or t >= vocab_size for t in request.sampling.stop_token_ids):
        raise InvalidRequestError(
            f"stop token ids must be in [0, {vocab_size})", param="stop_token_ids"
        )
    bad_bias = [t for t, _ in request.sampling.logit_bias if t < 0 or t >= vocab_size]
    if bad_bias:
        raise InvalidRequestError(
            f"logit_bias token ids must be in [0, {vocab_size}); got {bad_bias[0]}",
            param="logit_bias",
        )
    if request.sampling.max_tokens < 1:
        raise InvalidRequestError("max_tokens must be at least 1")
    total = get_num_kv_tokens(request)
    if total > max_model_len:
        raise InvalidRequestError(
            f"prompt ({num_tokens} tokens) plus max_tokens ({request.sampling.max_tokens}) "
            f"exceeds the context length of {max_model_len} tokens"
        )
    if not fits_kv_cache(request, block_size=block_size, num_kv_blocks=num_kv_blocks):
        raise InvalidRequestError(
            f"request needs {total} tokens of KV cache; this engine holds "
            f"{num_kv_blocks * block_size}"
        )


def get_num_kv_tokens(request: EngineRequest) -> int:
    """The tokens `request` may hold in KV cache at once: its prompt, its output so far
    (a migrated request's) and max_tokens more."""
    num_tokens = len(request.prompt_token_ids) + len(request.output_token_ids)
    return num_tokens + request.sampling.max_tokens


def fits_kv_cache(request: EngineRequest, *, block_size: int, num_kv_blocks: int) -> bool:
    """Whether a KV cache of `num_kv_blocks` blocks of `block_size` tokens holds `request`
    whole (the rule validation refuses by, and routing keeps to)."""
    return -(-get_num_kv_tokens(request) // block_size) <= num_kv_blocks


def check_structured_output(request: EngineRequest, *, engine: str, supported: bool) -> None:
    """InvalidRequestError naming the field (`response_format...`, `guided_regex`,
    `tool_choice`) of a guided request for an engine that does not enforce guides."""
    guide = request.sampling.guide
    if guide is None or supported:
        return
    raise InvalidRequestError(
        f"{guide.param} needs structured output (a token mask at each decoding step), which "
        f"the {engine} engine serving this model does not enforce",
        param=guide.param,
    )


def validate_embed_request(request: EmbedRequest, *, vocab_size: int, max_model_len: int) -> None:
    """Raise InvalidRequestError if an embedding request can never be served: no prompt, an
    empty one, one longer than the context, or a token id outside the vocabulary."""
    if not request.prompts:
        raise InvalidRequestError("no prompt to embed")
    for i, prompt in enumerate(request.prompts):
        if not prompt:
            raise InvalidRequestError(f"prompt {i} is empty")
        if len(prompt) > max_model_len:
            raise InvalidRequestError(
                f"prompt {i} has {len(prompt)} tokens; the context length is {max_model_len}"
            )
        if min(prompt) < 0 or max(prompt) >= vocab_size:
            raise InvalidRequestError(f"prompt {i}: token ids must be in [0, {vocab_size})")
