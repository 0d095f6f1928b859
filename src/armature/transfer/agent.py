"""A worker's KV transfer agent: serves its pinned blocks (prefill side) and pulls a peer's
blocks (decode side), choosing the best backend both sides support.

Backends, best first: `shm` (same host: map the peer's cache, copy straight into ours), `nixl`
(optional: NIXL's UCX reads, any host), `tcp` (any host). The TCP server also carries every
backend's control messages (lookup, release, NIXL metadata). A handle whose blocks a
third-party engine's connector holds (`ConnectorTransfer`) is not ours to pull or release.
"""

from __future__ import annotations

import logging
import threading

from armature.protocols.kv_transfer import KvHandle, NativeTransfer, layout_mismatch
from armature.transfer.blocks import KvBlocks, KvBlockStore
from armature.transfer.nixl_backend import NixlPuller, NixlSource
from armature.transfer.pins import PinTable
from armature.transfer.shm import SharedCacheMaps, shm_url
from armature.transfer.tcp import TcpTransferClient, TcpTransferServer
from armature.transfer.wire import TransferError

__all__ = ["BACKENDS", "KvTransferAgent"]

log = logging.getLogger(__name__)

BACKENDS = ("shm", "nixl", "tcp")


class KvTransferAgent:
    def __init__(
        self,
        store: KvBlockStore,
        pins: PinTable,
        *,
        backends: tuple[str, ...] = BACKENDS,
        host: str = "127.0.0.1",
        port: int = 0,
        shm_path: str | None = None,
        num_blocks: int = 0,
        timeout_s: float = 30.0,
        name: str = "armature",
        secret: str | None = None,
    ):
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown or "tcp" not in backends:
            raise ValueError(
                f"KV transfer backends must include tcp and be among {', '.join(BACKENDS)}"
            )
        self.store = store
        self.layout = store.layout
        self.backends = backends
        self.server = TcpTransferServer(pins, store, host, port, timeout_s, secret)
        self.client = TcpTransferClient(timeout_s, secret)
        self.maps = SharedCacheMaps()
        self.shm_path = shm_path
        self.num_blocks = num_blocks
        self.endpoints: dict[str, str] = {}
        self.num_pulls: dict[str, int] = {b: 0 for b in BACKENDS}
        self.nixl: NixlPuller | None = None
        self._nixl_lock = threading.Lock()
        self.nixl_source: NixlSource | None = None  # its agent must live as long as we serve
        if "nixl" in backends:  # TransferError when NIXL is missing or cannot serve this cache
            tensors = store.kv_tensors()
            if tensors is not None:
                self.nixl_source = NixlSource(name, *tensors)
                self.server.nixl_info = self.nixl_source.encoded_info()
            self.nixl = NixlPuller(f"{name}/pull", timeout_s)

    def start(self) -> dict[str, str]:
        """Start serving; returns the endpoints to put in KV handles' `NativeTransfer`."""
        self.endpoints = {"tcp": self.server.start()}
        if "shm" in self.backends and self.shm_path is not None:
            self.endpoints["shm"] = shm_url(self.shm_path, self.num_blocks)
        if self.server.nixl_info is not None:
            self.endpoints["nixl"] = "nixl:"
        return self.endpoints

    def stop(self) -> None:
        self.server.stop()

    # ---- decode side (blocking: call from a worker thread) -----------------------------
    def pull(self, handle: KvHandle, start_block: int) -> KvBlocks:
        """Blocks `start_block..` of `handle`. Raises TransferError when no backend can, and
        for a handle whose blocks a third-party connector holds."""
        if not isinstance(handle.transfer, NativeTransfer):
            raise TransferError(
                f"KV handle {handle.handle_id} is held by the {handle.transfer.connector!r} "
                "connector; a native engine cannot pull it"
            )
        endpoints = handle.transfer.endpoints
        mismatch = layout_mismatch(self.layout, handle.layout)
        if mismatch is not None:
            raise TransferError(mismatch)
        control = endpoints.get("tcp")
        if control is None:
            raise TransferError(f"KV handle {handle.handle_id} names no tcp endpoint")
        shm = endpoints.get("shm")
        if "shm" in self.backends and shm is not None and self.maps.usable(shm):
            try:
                k, v = self.maps.get(shm, handle.layout)
            except TransferError as exc:
                log.warning("shared-memory transfer unavailable, using tcp: %s", exc)
            else:
                block_ids = self.client.lookup(control, handle, start_block, self.layout)
                self.num_pulls["shm"] += 1
                return KvBlocks(block_ids, k, v)
        if self.nixl is not None and "nixl" in endpoints:
            try:
                blocks = self._pull_nixl(control, handle, start_block)
            except TransferError as exc:
                log.warning("NIXL transfer failed, using tcp: %s", exc)
            else:
                self.num_pulls["nixl"] += 1
                return blocks
        blocks = self.client.pull(control, handle, start_block, self.layout)
        self.num_pulls["tcp"] += 1
        return blocks

    def _pull_nixl(self, control: str, handle: KvHandle, start_block: int) -> KvBlocks:
        """One NIXL read at a time: a NIXL agent is not safe for concurrent use from several
        threads (concurrent pulls raced in createXferReq and later aborted the process)."""
        with self._nixl_lock:
            return self._pull_nixl_locked(control, handle, start_block)

    def _pull_nixl_locked(self, control: str, handle: KvHandle, start_block: int) -> KvBlocks:
        assert self.nixl is not None
        peer = f"{handle.worker_id}@{control}"
        if not self.nixl.knows(peer):
            self.nixl.add_peer(peer, self.client.nixl_info(control, self.layout))
        block_ids = self.client.lookup(control, handle, start_block, self.layout)
        try:
            return self.nixl.read(peer, block_ids, self.layout)
        except TransferError:
            self.nixl.forget(peer)  # a restarted peer gets fresh metadata next time
            raise

    def release(self, handle: KvHandle) -> None:
        """Tell the prefill worker it may free the handle's blocks (best effort; nothing to do
        for a handle a third-party connector holds: that engine frees its blocks itself)."""
        if not isinstance(handle.transfer, NativeTransfer):
            return
        control = handle.transfer.endpoints.get("tcp")
        if control is None:
            return
        try:
            self.client.release(control, handle, self.layout)
        except TransferError as exc:  # it frees them at the handle's deadline anyway
            log.warning("could not release KV handle %s: %s", handle.handle_id, exc)
