"""KV-cache transfer contracts (disaggregated serving): what a prefill worker hands a decode
worker so that it can pull the prompt's KV blocks.

A prefill worker computes the prompt, samples the first token and pins the prompt's full
blocks under a `KvHandle`. The decode worker pulls the blocks it lacks (by position in
`seq_hashes`) through the handle's `transfer`, then releases the handle; the prefill worker
frees the blocks on release or when the handle expires.

`transfer` says who can move the blocks: our own transfer agents (`NativeTransfer`: the
backend -> address map of the prefill worker's agent), or a third-party engine's connector
(`ConnectorTransfer`: its parameters as bytes, read only by that engine's adapter). A worker
that cannot use a handle's transfer computes the prompt itself.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "ConnectorTransfer",
    "KvHandle",
    "KvLayout",
    "KvTransfer",
    "NativeTransfer",
    "layout_mismatch",
]

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class KvLayout(msgspec.Struct, frozen=True, kw_only=True):
    """The shape of one KV block on a worker; both sides of a transfer must agree."""

    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # "float32" | "bfloat16" | "float16"

    @property
    def bytes_per_block(self) -> int:
        """K and V of every layer for one block."""
        per_token = 2 * self.num_layers * self.num_kv_heads * self.head_dim
        return per_token * self.block_size * DTYPE_BYTES[self.dtype]


def layout_mismatch(ours: KvLayout, theirs: KvLayout) -> str | None:
    """Why blocks of layout `theirs` cannot be used with `ours` (None when they can)."""
    diffs = [
        f"{name} {getattr(theirs, name)} != {getattr(ours, name)}"
        for name in ("num_layers", "block_size", "num_kv_heads", "head_dim", "dtype")
        if getattr(theirs, name) != getattr(ours, name)
    ]
    if not diffs:
        return None
    return "KV layout mismatch (peer vs local): " + ", ".join(diffs)


class NativeTransfer(msgspec.Struct, tag="native", frozen=True, kw_only=True):
    """Blocks our transfer agents serve: the prefill worker's agent by backend."""

    endpoints: dict[str, str]  # backend ("tcp", "shm", "nixl") -> its address


class ConnectorTransfer(msgspec.Struct, tag="connector", frozen=True, kw_only=True):
    """Blocks a third-party engine's connector serves (e.g. vLLM's NIXL connector)."""

    connector: str  # which adapter reads `params` (e.g. "vllm-nixl")
    params: bytes  # that connector's own parameters, encoded and decoded by its adapter only


KvTransfer = NativeTransfer | ConnectorTransfer


class KvHandle(msgspec.Struct, frozen=True, kw_only=True):
    """Pinned prompt blocks on a prefill worker."""

    handle_id: str
    worker_id: str
    layout: KvLayout
    seq_hashes: list[int]  # the pinned full blocks of the prompt, in order
    transfer: KvTransfer  # how a decode worker gets them
    ttl_s: float = 30.0  # the blocks are freed this long after pinning if not released
