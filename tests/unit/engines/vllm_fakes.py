"""Plain stand-ins for the vLLM output objects the adapter reads (see engines/vllm/outputs.py),
and a VllmEngine over a fake AsyncLLM."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from armature.engines.vllm.engine import VllmEngine, VllmEngineInfo, VllmTransfer
from armature.engines.vllm.load import LoadTracker


@dataclass
class FakeLogprob:
    logprob: float
    rank: int | None


@dataclass
class FakeCompletion:
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[dict[int, FakeLogprob]] | None = None


@dataclass
class FakeOutput:
    outputs: list[FakeCompletion] = field(default_factory=list)
    num_cached_tokens: int | None = 0
    kv_transfer_params: dict[str, object] | None = None
    prompt_logprobs: list[dict[int, FakeLogprob] | None] | None = None


def make_engine(
    llm: Any,
    info: VllmEngineInfo,
    *,
    transfer: VllmTransfer | None = None,
    client_errors: tuple[type[Exception], ...] = (),
) -> VllmEngine:
    """A started VllmEngine over a fake AsyncLLM (prompts and sampling passed through as is)."""
    engine = VllmEngine(
        llm,
        info,
        make_sampling=lambda s: s,
        make_prompt=lambda ids: ids,
        subscriber=None,
        load=LoadTracker(num_total_blocks=info.num_kv_blocks),
        client_errors=client_errors,
        transfer=transfer,
    )
    engine.start()
    return engine
