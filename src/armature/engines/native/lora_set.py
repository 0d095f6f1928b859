"""The LoRA adapters one native engine (or mocker) serves, by name.

The event loop adds and removes adapters while the engine thread resolves requests' names,
so every access takes the lock. A request holds its `ServedLora` from admission to the end:
an adapter removed meanwhile stays alive for the requests already using it.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from armature.kv.hashing import hash_seed_for_salt
from armature.model.arch import ModelArch
from armature.model.lora import LoraError, LoraWeights, load_lora
from armature.protocols.lora import LoraAdapter

__all__ = ["LoraSet", "ServedLora", "check_lora_name", "read_served_lora", "served_lora_name"]

# the name is what clients pass as `model`: printable, no spaces, bounded
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")


@dataclass(frozen=True)
class ServedLora:
    """An adapter as the engine serves it: its advertised form, the seed of its requests'
    block hashes and its weights (None in the mocker, which serves names only)."""

    adapter: LoraAdapter
    hash_seed: int
    weights: LoraWeights | None


def check_lora_name(name: str) -> None:
    """LoraError unless `name` can be a model name (letters, digits, ._:/@+-; at most 128)."""
    if not _NAME.fullmatch(name):
        raise LoraError(
            f"adapter name {name!r} must start with a letter or digit and hold only letters, "
            "digits and ._:/@+- (at most 128 characters)"
        )


def read_served_lora(
    name: str, path: Path, arch: ModelArch, dtype: torch.dtype, device: torch.device
) -> ServedLora:
    """Read and check the adapter in `path` (LoraError when it cannot be served). Its salt is
    its name and its files' digest: the same files under the same name on any worker give the
    same block hashes, and a reload with other weights never meets the old KV blocks."""
    check_lora_name(name)
    weights = load_lora(path, arch, dtype, device)
    salt = f"{name}@{weights.digest}"
    return ServedLora(LoraAdapter(name, salt), hash_seed_for_salt(salt), weights)


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
                raise LoraError(f"an adapter named {name!r} is already loaded; unload it first")
            self._by_name[name] = served

    def remove(self, name: str) -> bool:
        """Stop serving `name`; False if it was not served."""
        with self._lock:
            return self._by_name.pop(name, None) is not None

    def get_adapters(self) -> list[LoraAdapter]:
        """The adapters served, by name."""
        with self._lock:
            return sorted((a.adapter for a in self._by_name.values()), key=lambda a: a.name)
