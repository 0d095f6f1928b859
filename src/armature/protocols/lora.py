"""LoRA adapters as engines, workers and frontends name them (msgspec, on the wire).

An engine serves adapters over its one base model; a request picks one by name
(`EngineRequest.lora_name`). Each adapter's `salt` seeds the KV block hashes of the requests
that use it (`armature.kv.hashing.hash_seed_for_salt`), so no prefix is shared across adapters
and a router that hashes a prompt with the same salt finds the same blocks.
"""

from __future__ import annotations

import msgspec

from armature.errors import InvalidRequestError

__all__ = [
    "LoadLora",
    "LoraAdapter",
    "LoraNotFoundError",
    "LoraState",
    "UnloadLora",
    "lora_unsupported",
]


class LoraAdapter(msgspec.Struct, frozen=True):
    """An adapter an engine serves: its name (what clients pass as `model`) and the salt of
    its KV block hashes (the native engine's: name and a digest of its weights, so a reload
    with other weights never meets the old KV; the mocker's: the name)."""

    name: str
    salt: str


class LoraState(msgspec.Struct, frozen=True):
    """The adapters a worker serves now. `version` grows by one with each load or unload on
    the worker, so a frontend keeps the newest of the states it hears (an update sent before
    a load may arrive after the load's answer)."""

    version: int
    adapters: list[LoraAdapter]


class LoadLora(msgspec.Struct, frozen=True):
    """Load the adapter in directory `path` (PEFT layout) under `name`."""

    name: str
    path: str


class UnloadLora(msgspec.Struct, frozen=True):
    """Stop serving adapter `name` (requests already running finish with it)."""

    name: str


class LoraNotFoundError(InvalidRequestError):
    """A request or an unload named an adapter the engine does not hold (the edge answers
    404)."""


def lora_unsupported(engine: str) -> InvalidRequestError:
    """The error of an engine that serves no LoRA adapters (the edge answers 400)."""
    return InvalidRequestError(
        f"the {engine} engine serves no LoRA adapters; serve them with --engine torch (or mocker)",
        param="model",
    )
