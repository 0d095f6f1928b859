"""Wiring an engine core to a KV transfer agent (disaggregated serving)."""

from __future__ import annotations

from armature.engines.native.core import EngineCore
from armature.transfer.agent import KvTransferAgent

__all__ = ["start_transfer_agent"]


def start_transfer_agent(
    core: EngineCore,
    *,
    worker_id: str,
    backends: tuple[str, ...] = ("shm", "tcp"),
    host: str = "127.0.0.1",
    port: int = 0,
    secret: str | None = None,
) -> KvTransferAgent:
    """Serve `core`'s pinned blocks and let it pull a peer's; its KV handles name the agent's
    endpoints. Shared memory is offered only when the cache lives in shared memory."""
    store = core.kv_store
    agent = KvTransferAgent(
        store,
        core.pins,
        backends=backends,
        host=host,
        port=port,
        shm_path=store.shm_path,
        num_blocks=core.pool.num_blocks,
        name=worker_id,
        secret=secret,
    )
    core.worker_id = worker_id
    core.kv_endpoints = agent.start()
    return agent
