"""LoRA adapters at runtime: vLLM's admin endpoints, answered by the frontend for its fleet.

    POST /v1/load_lora_adapter    {"lora_name": NAME, "lora_path": DIR}
    POST /v1/unload_lora_adapter  {"lora_name": NAME}

The frontend forwards a load to every live worker of task generate (both pools when
disaggregated) over the request plane, and an unload to every worker that holds the adapter.
One call reaches the whole fleet, behind the same API keys as the rest of the API, and the
router's view of who serves what changes with each worker's answer (before any update on the
event plane). A load is all or nothing: when a worker refuses it (a bad directory: 400 naming
the problem), the workers that took it unload it again. A worker that joins later serves the
adapters of its own --lora flags.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from armature.engines.api import Engine, EngineDeadError, InvalidRequestError
from armature.frontend.compose import FrontendParts
from armature.frontend.errors import ApiError, error_responses
from armature.model.lora_names import LoraError, check_lora_name
from armature.protocols.lora import LoraAdapter
from armature.router.disagg import DisaggRouter

__all__ = ["LoraAdmin", "add_lora_routes"]

log = logging.getLogger(__name__)


class LoadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    lora_name: str = Field(min_length=1, max_length=128)
    lora_path: str = Field(min_length=1, max_length=4096)


class UnloadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    lora_name: str = Field(min_length=1, max_length=128)


class LoraAdmin:
    """Loads and unloads adapters on every generate worker a router routes to."""

    def __init__(
        self, router: DisaggRouter, base_name: str, has_embed_workers: Callable[[], bool]
    ) -> None:
        """`has_embed_workers`: whether workers of task embed serve the model (they take no
        adapters)."""
        self.router = router
        self.base_name = base_name
        self.has_embed_workers = has_embed_workers
        self._loading: set[str] = set()  # names whose load is under way

    def _engines(self) -> dict[str, Engine]:
        pools = {**self.router.prefill.engines, **self.router.engines}
        return {w: e for w, e in pools.items() if e.is_alive}

    async def load(self, name: str, path: str) -> LoraAdapter:
        """Load on every live worker, or on none (ApiError: 400 for a refusal, 503 when no
        worker could be reached)."""
        if name == self.base_name:
            raise ApiError(f"{name!r} is the base model's name", param="lora_name")
        try:
            check_lora_name(name)
        except LoraError as exc:
            raise ApiError(str(exc), param="lora_name", code="invalid_lora_adapter") from None
        if name in self.router.get_lora_adapters() or name in self._loading:
            # a load of the same name under way counts as loaded: the workers would refuse
            # the second as a bad directory
            raise ApiError(
                f"the LoRA adapter {name!r} is already loaded; unload it first",
                param="lora_name",
                code="lora_adapter_exists",
            )
        engines = self._engines()
        if not engines and self.has_embed_workers():
            raise ApiError(
                f"the workers serving {self.base_name!r} compute embeddings: they take no "
                "LoRA adapters",
                param="lora_name",
            )
        if not engines:
            raise ApiError("no worker is serving", status_code=503, type="service_unavailable")
        self._loading.add(name)
        try:
            return await self._load_on(engines, name, path)
        finally:
            self._loading.discard(name)

    async def _load_on(self, engines: dict[str, Engine], name: str, path: str) -> LoraAdapter:
        results = await asyncio.gather(
            *(e.load_lora(name, path) for e in engines.values()), return_exceptions=True
        )
        loaded = [
            e for e, r in zip(engines.values(), results, strict=True) if isinstance(r, LoraAdapter)
        ]
        failures = [r for r in results if isinstance(r, BaseException)]
        if not failures:
            log.info("LoRA adapter %r loaded from %r on %d workers", name, path, len(engines))
            return next(r for r in results if isinstance(r, LoraAdapter))
        await asyncio.gather(*(e.unload_lora(name) for e in loaded), return_exceptions=True)
        for failure in failures:
            if isinstance(failure, InvalidRequestError):
                raise ApiError(str(failure), param="lora_path", code="invalid_lora_adapter")
        for failure in failures:
            if not isinstance(failure, EngineDeadError):
                raise failure
        raise ApiError(
            f"the LoRA adapter could not be loaded: {failures[0]}",
            status_code=503,
            type="service_unavailable",
        )

    async def unload(self, name: str) -> None:
        """Unload from every worker that holds it (ApiError 404 when none does)."""
        holders = [
            e
            for e in self._engines().values()
            if any(a.name == name for a in e.get_lora_adapters())
        ]
        if not holders:
            raise ApiError(
                f"no LoRA adapter named {name!r} is loaded",
                status_code=404,
                type="not_found_error",
                param="lora_name",
                code="model_not_found",
            )
        results = await asyncio.gather(
            *(e.unload_lora(name) for e in holders), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException) and not isinstance(
                result, InvalidRequestError | EngineDeadError
            ):
                raise result
            if result is not None:
                log.warning("unloading LoRA adapter %r: %s", name, result)
        log.info("LoRA adapter %r unloaded from %d workers", name, len(holders))


def add_lora_routes(app: FastAPI, parts: FrontendParts) -> None:
    admin = LoraAdmin(parts.router, parts.model.name, lambda: bool(parts.embedder.engines))

    @app.post("/v1/load_lora_adapter", responses=error_responses(400, 401, 413, 503))
    async def load_lora_adapter(body: LoadLoraAdapterRequest) -> dict[str, Any]:
        """Serve the adapter in `lora_path` (PEFT layout, on the workers' hosts) as model
        `lora_name` on every worker."""
        adapter = await admin.load(body.lora_name, body.lora_path)
        return {
            "id": adapter.name,
            "object": "model",
            "parent": parts.model.name,
            "message": f"Success: LoRA adapter '{adapter.name}' added successfully.",
        }

    @app.post("/v1/unload_lora_adapter", responses=error_responses(400, 401, 404, 413, 503))
    async def unload_lora_adapter(body: UnloadLoraAdapterRequest) -> dict[str, Any]:
        """Stop serving the adapter (requests running with it finish)."""
        await admin.unload(body.lora_name)
        return {
            "id": body.lora_name,
            "object": "model",
            "deleted": True,
            "message": f"Success: LoRA adapter '{body.lora_name}' removed successfully.",
        }
