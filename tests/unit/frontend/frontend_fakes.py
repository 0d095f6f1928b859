"""Engines for frontend tests at the Engine seam: everything but `generate`, idle; and one
whose `generate` emits the token ids of chosen outputs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from armature.frontend.preprocess import Preprocessor
from armature.protocols.engine import EngineLoad, EngineOutput, EngineRequest, FinishReason


class IdleEngine:
    """An engine with no load and no KV events; subclasses say what `generate` does."""

    is_alive = True

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    def validate(self, request: EngineRequest) -> None: ...

    def get_load(self) -> EngineLoad:
        return EngineLoad.idle(1)

    def take_kv_events(self) -> list:  # type: ignore[type-arg]
        return []

    async def wait_for_update(self, timeout_s: float) -> bool:
        await asyncio.sleep(timeout_s)  # never any news
        return False

    def get_lora_adapters(self) -> list:  # type: ignore[type-arg]
        return []


class ScriptedEngine(IdleEngine):
    """Emits the token ids of the next output queued, a few per step, then stops."""

    def __init__(self, preprocessor: Preprocessor) -> None:
        self.preprocessor = preprocessor
        self.outputs: list[str] = []
        self.prompts: list[list[int]] = []
        self.requests: list[EngineRequest] = []

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        self.prompts.append(request.prompt_token_ids)
        self.requests.append(request)
        ids = self.preprocessor.encode(self.outputs.pop(0), add_special_tokens=False)
        steps, at = [], 0
        while at < len(ids):  # 1, 2, 3, 1, 2, 3... tokens per step
            steps.append(ids[at : at + 1 + len(steps) % 3])
            at += len(steps[-1])
        for i, step in enumerate(steps):
            last = i == len(steps) - 1
            yield EngineOutput(
                request_id=request.request_id,
                new_token_ids=step,
                num_prompt_tokens=len(request.prompt_token_ids) if i == 0 else 0,
                finish_reason=FinishReason.STOP if last else None,
            )
