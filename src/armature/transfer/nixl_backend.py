"""The NIXL KV transfer backend (optional: `pip install 'armature[nixl]'`, the `nixl-cu12`
wheel; its UCX backend moves CPU memory between processes and hosts).

The prefill worker registers its whole K and V cache with a NIXL agent; decode workers fetch
the agent's metadata and the caches' base addresses once per peer (the `nixl` op of the TCP
control channel), look up a handle's pinned block ids, and READ them with one descriptor per
run of consecutive blocks per layer into a registered staging tensor.
"""

from __future__ import annotations

import importlib
import time
from types import ModuleType
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from armature.protocols.kv_transfer import KvLayout
from armature.transfer.blocks import KvBlocks, block_runs
from armature.transfer.wire import TransferError

if TYPE_CHECKING:
    import torch

__all__ = ["NixlPeerInfo", "NixlPuller", "NixlSource", "load_nixl"]

INSTALL_HINT = "NIXL is not installed: pip install 'armature[nixl]' (the nixl-cu12 wheel)"


def load_nixl() -> ModuleType:
    """The NIXL Python API module, or TransferError saying how to install it."""
    for name in ("nixl_cu12._api", "nixl._api"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise TransferError(INSTALL_HINT)


class NixlPeerInfo(msgspec.Struct, frozen=True, kw_only=True):
    agent_name: str
    metadata: bytes
    k_addr: int
    v_addr: int
    num_blocks: int


def _nixl_errors() -> tuple[type[Exception], ...]:
    """The NIXL bindings' error types (each derives from Exception alone)."""
    for name in ("nixl_cu12._bindings", "nixl._bindings"):
        try:
            bindings = importlib.import_module(name)
        except ImportError:
            continue
        return tuple(
            getattr(bindings, n)
            for n in dir(bindings)
            if n.startswith("nixl") and n.endswith("Error")
        )
    return ()


def _agent(name: str) -> Any:
    """An agent with NIXL's progress thread, which the remote side of a read needs; note that
    it polls without sleeping, so it keeps one core busy (NIXL is opt-in for that reason)."""
    api = load_nixl()
    return api.nixl_agent(name, api.nixl_agent_config(backends=["UCX"]))


class NixlSource:
    """The prefill side: its KV cache registered with its own agent."""

    def __init__(self, name: str, k: torch.Tensor, v: torch.Tensor):
        if k.device.type != "cpu":
            raise TransferError("the NIXL backend here moves CPU memory only")
        self.agent = _agent(name)
        self.agent.register_memory([k, v])
        self.info = NixlPeerInfo(
            agent_name=name,
            metadata=self.agent.get_agent_metadata(),
            k_addr=k.data_ptr(),
            v_addr=v.data_ptr(),
            num_blocks=k.shape[1],
        )

    def encoded_info(self) -> bytes:
        return msgspec.msgpack.encode(self.info)


class NixlPuller:
    """The decode side: one agent, peers added on first use."""

    def __init__(self, name: str, timeout_s: float = 30.0):
        self.agent = _agent(name)
        self.timeout_s = timeout_s
        self._peers: dict[str, NixlPeerInfo] = {}
        self._errors = _nixl_errors()

    def knows(self, peer_key: str) -> bool:
        return peer_key in self._peers

    def add_peer(self, peer_key: str, encoded_info: bytes) -> None:
        try:
            info = msgspec.msgpack.decode(encoded_info, type=NixlPeerInfo)
        except msgspec.DecodeError as exc:
            raise TransferError(f"bad NIXL peer info: {exc}") from None
        self.agent.add_remote_agent(info.metadata)
        self._peers[peer_key] = info

    def forget(self, peer_key: str) -> None:
        info = self._peers.pop(peer_key, None)
        if info is not None:
            self.agent.remove_remote_agent(info.agent_name)

    def read(self, peer_key: str, block_ids: list[int], layout: KvLayout) -> KvBlocks:
        """READ the peer's `block_ids` into a fresh staging tensor."""
        import torch  # only where data moves: a mocker's agent never loads it

        from armature.model.dtypes import torch_dtype

        info = self._peers[peer_key]
        n = len(block_ids)
        shape = (2, layout.num_layers, n, layout.block_size, layout.num_kv_heads, layout.head_dim)
        staging = torch.empty(shape, dtype=torch_dtype(layout.dtype))
        block_bytes = staging[0, 0, 0].numel() * staging.element_size()
        local_rows: list[tuple[int, int, int]] = []
        remote_rows: list[tuple[int, int, int]] = []
        offset = 0
        runs = []
        for start, length in block_runs(block_ids):
            runs.append((start, length, offset))
            offset += length
        for kv, base in enumerate((info.k_addr, info.v_addr)):
            for layer in range(layout.num_layers):
                for start, length, dst in runs:
                    remote = base + (layer * info.num_blocks + start) * block_bytes
                    local = staging[kv, layer, dst].data_ptr()
                    remote_rows.append((remote, length * block_bytes, 0))
                    local_rows.append((local, length * block_bytes, 0))
        try:
            self._read_into(staging, local_rows, remote_rows, info.agent_name)
        except self._errors as exc:  # NIXL's own failure: the caller falls back to tcp
            raise TransferError(f"NIXL read from {info.agent_name} failed: {exc!r}") from None
        return KvBlocks(list(range(n)), staging[0], staging[1])

    def _read_into(
        self,
        staging: torch.Tensor,
        local_rows: list[tuple[int, int, int]],
        remote_rows: list[tuple[int, int, int]],
        agent_name: str,
    ) -> None:
        registered = self.agent.register_memory(staging)
        try:
            local = np.array(local_rows, dtype=np.uint64)
            remote = np.array(remote_rows, dtype=np.uint64)
            local_descs = self.agent.get_xfer_descs(local, "DRAM")
            remote_descs = self.agent.get_xfer_descs(remote, "DRAM")
            handle = self.agent.initialize_xfer("READ", local_descs, remote_descs, agent_name)
            try:
                state = self.agent.transfer(handle)
                deadline = time.monotonic() + self.timeout_s
                while state not in ("DONE", "ERR"):
                    if time.monotonic() > deadline:
                        raise TransferError(f"NIXL read from {agent_name} timed out")
                    time.sleep(0.0002)
                    state = self.agent.check_xfer_state(handle)
                if state == "ERR":
                    raise TransferError(f"NIXL read from {agent_name} failed")
            finally:
                self.agent.release_xfer_handle(handle)
        finally:
            self.agent.deregister_memory(registered)
