"""The shared-memory KV transfer backend (one host): a prefill worker keeps its KV cache in a
memfd segment (see `shared_tensor`); a decode worker on the same host maps it and copies the
pinned blocks straight into its own cache, with no staging copy and no socket.

    url: shm://<boot id>/proc/<pid>/fd/<fd>?blocks=<num_blocks>
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from armature.protocols.kv_transfer import KvLayout
from armature.transfer.wire import TransferError

if TYPE_CHECKING:
    import torch

__all__ = ["SharedCacheMaps", "host_boot_id", "shm_url"]


def host_boot_id() -> str:
    """This host's boot id: two processes may share memory only if theirs are equal."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def shm_url(path: str, num_blocks: int) -> str:
    return f"shm://{host_boot_id()}{path}?blocks={num_blocks}"


class SharedCacheMaps:
    """Peers' caches mapped into this process, by url (bounded: the oldest map goes)."""

    def __init__(self, max_maps: int = 64):
        self.max_maps = max_maps
        self._maps: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def usable(self, url: str) -> bool:
        return url.startswith("shm://") and urlsplit(url).netloc == host_boot_id()

    def get(self, url: str, layout: KvLayout) -> tuple[torch.Tensor, torch.Tensor]:
        """The peer's K and V caches [layers, blocks, block_size, kv_heads, head_dim]."""
        import torch  # only where data moves: a mocker's agent never loads it

        from armature.model.dtypes import torch_dtype

        cached = self._maps.get(url)
        if cached is not None:
            return cached
        parts = urlsplit(url)
        try:
            num_blocks = int(parse_qs(parts.query)["blocks"][0])
        except (KeyError, ValueError):
            raise TransferError(f"bad shared-memory url {url!r}") from None
        shape = (
            2,
            layout.num_layers,
            num_blocks,
            layout.block_size,
            layout.num_kv_heads,
            layout.head_dim,
        )
        numel = 1
        for dim in shape:
            numel *= dim
        try:
            flat = torch.from_file(
                parts.path, shared=True, size=numel, dtype=torch_dtype(layout.dtype)
            )
        except (OSError, RuntimeError) as exc:
            raise TransferError(f"cannot map the peer's KV cache {parts.path}: {exc}") from None
        both = flat.view(shape)
        if len(self._maps) >= self.max_maps:
            self._maps.pop(next(iter(self._maps)))
        self._maps[url] = (both[0], both[1])
        return self._maps[url]

    def forget(self, url: str) -> None:
        self._maps.pop(url, None)
