"""The LoRA adapters one native engine (or mocker) serves, by name.

The event loop adds and removes adapters while the engine thread resolves requests' names,
so every access takes the lock. A request holds its `ServedLora` from admission to the end:
an adapter removed meanwhile stays alive for the requests already using it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from armature.kv.hashing import hash_seed_for_salt
from armature.model.lora_names import LoraError, check_lora_name
from armature.protocols.lora import LoraAdapter

if TYPE_CHECKING:
    from armature.model.lora import LoraWeights

__all__ = ["LoraSet", "ServedLora", "served_lora_name"]


@dataclass(frozen=True)
class ServedLora:
    """An adapter as the engine serves it: its advertised form, the seed of its requests'
    block hashes and its weights (None in the mocker, which serves names only)."""

    adapter: LoraAdapter
    hash_seed: int
    weights: LoraWeights | None


def served_lora_name(name: str) -> ServedLora:
    """An adapter known by name only (the mocker): salted by its name."""
    check_lora_name(name)
    return ServedLora(LoraAdapter(name, name), hash_seed_for_salt(name), None)


class LoraSet:
    """Adapters by name; thread-safe."""

    def __init__(self, adapters: list[ServedLora] | None = None) -> None:
        self._lock = threading.Lock()
        self._by_name: dict[str, ServedLora] = {a.adapter.name: a for a in adapters or []}

    def get(self, name: str) -> ServedLora | None:
        with self._lock:
            return self._by_name.get(name)

    def add(self, served: ServedLora) -> None:
        """Serve `served` (LoraError if its name is taken: unload it first)."""
        with self._lock:
            name = served.adapter.name
            if name in self._by_name:
                raise LoraError(f"the LoRA adapter {name!r} is already loaded; unload it first")
            self._by_name[name] = served

    def remove(self, name: str) -> bool:
        """Stop serving `name`; False if it was not served."""
        with self._lock:
            return self._by_name.pop(name, None) is not None

    def get_adapters(self) -> list[LoraAdapter]:
        """The adapters served, by name."""
        with self._lock:
            return sorted((a.adapter for a in self._by_name.values()), key=lambda a: a.name)
