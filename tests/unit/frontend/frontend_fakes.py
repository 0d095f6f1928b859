"""Engines for frontend tests at the Engine seam: everything but `generate`, idle; and one
whose `generate` emits the token ids of chosen outputs (with made-up logprobs where asked
for: SCRIPTED_LOGPROB for each output token, SCRIPTED_PROMPT_LOGPROB for each prompt token
after the first, each its own top alternative unless none are asked for); and the whole
frontend over one of them, with the official openai client in front."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import openai

from armature.config import RouterConfig
from armature.frontend.app import ServedModel, build_app
from armature.frontend.compose import FrontendParts, compose_frontend
from armature.frontend.parsing import OutputParsers
from armature.frontend.preprocess import Preprocessor
from armature.protocols.engine import (
    EngineLoad,
    EngineOutput,
    EngineRequest,
    FinishReason,
    TokenLogprob,
)

SCRIPTED_LOGPROB = -0.25
SCRIPTED_PROMPT_LOGPROB = -0.5


class IdleEngine:
    """An engine with no load and no KV events; subclasses say what `generate` does."""

    is_alive = True

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    def validate(self, request: EngineRequest) -> None: ...

    def get_load(self) -> EngineLoad:
        return EngineLoad.idle(1 << 20)  # blocks: the router routes to a cache that holds it

    def take_kv_events(self) -> list:  # type: ignore[type-arg]
        return []

    async def wait_for_update(self, timeout_s: float) -> bool:
        await asyncio.sleep(timeout_s)  # never any news
        return False

    def get_lora_adapters(self) -> list:  # type: ignore[type-arg]
        return []


class ScriptedEngine(IdleEngine):
    """Emits the token ids of the next output queued, a few per step, then stops (at
    max_tokens, as an engine does: finish_reason length)."""

    def __init__(self, preprocessor: Preprocessor) -> None:
        self.preprocessor = preprocessor
        self.outputs: list[str] = []
        self.prompts: list[list[int]] = []
        self.requests: list[EngineRequest] = []

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        self.prompts.append(request.prompt_token_ids)
        self.requests.append(request)
        ids = self.preprocessor.encode(self.outputs.pop(0), add_special_tokens=False)
        cut = len(ids) > request.sampling.max_tokens
        ids = ids[: request.sampling.max_tokens]
        end = FinishReason.LENGTH if cut else FinishReason.STOP
        steps, at = [], 0
        while at < len(ids):  # 1, 2, 3, 1, 2, 3... tokens per step
            steps.append(ids[at : at + 1 + len(steps) % 3])
            at += len(steps[-1])
        sampling = request.sampling
        for i, step in enumerate(steps):
            last = i == len(steps) - 1
            prompt_logprobs = None
            if i == 0 and sampling.prompt_logprobs is not None:
                prompt_logprobs = [
                    TokenLogprob(
                        t,
                        SCRIPTED_PROMPT_LOGPROB,
                        [(t, SCRIPTED_PROMPT_LOGPROB)][: sampling.prompt_logprobs],
                    )
                    for t in request.prompt_token_ids[1:]
                ]
            logprobs = None
            if sampling.logprobs is not None:
                logprobs = [
                    TokenLogprob(t, SCRIPTED_LOGPROB, [(t, SCRIPTED_LOGPROB)][: sampling.logprobs])
                    for t in step
                ]
            yield EngineOutput(
                request_id=request.request_id,
                new_token_ids=step,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
                num_prompt_tokens=len(request.prompt_token_ids) if i == 0 else 0,
                finish_reason=end if last else None,
            )


def one_engine_frontend(
    engine: ScriptedEngine, parsers: OutputParsers | None = None, model: str = "m"
) -> FrontendParts:
    """The whole frontend over `engine` alone (its preprocessor's model, served as `model`
    with a context of 2048 tokens), its output read with `parsers`."""
    return compose_frontend(
        engines={"w0": engine},  # type: ignore[dict-item]
        router_config=RouterConfig(),
        preprocessor=engine.preprocessor,
        model=ServedModel(model, 2048, 0),
        parsers=parsers,
    )


def openai_client(parts: FrontendParts) -> openai.AsyncOpenAI:
    """The official client over `parts`' app, in process (no retries)."""
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(parts)))
    return openai.AsyncOpenAI(
        base_url="http://test/v1", api_key="unused", http_client=http, max_retries=0
    )
