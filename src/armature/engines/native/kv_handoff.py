"""KV handoff between disaggregated workers, on an engine core's block pool: a prefill leg's
prompt blocks pinned under a KV handle for a decode worker to pull (freed once the handle is
released or expires), and the blocks a decode leg pulled checked against its prompt and cached
as its prefix. The core's disaggregation methods are these, on its pool and pin table."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.lora_set import LoraSet
from armature.engines.native.request import RequestState
from armature.kv.block_pool import BlockPool
from armature.kv.hashing import DEFAULT_HASH_SEED, compute_block_hashes
from armature.protocols.engine import EngineRequest
from armature.protocols.kv_transfer import KvHandle, NativeTransfer
from armature.protocols.lora import LoraNotFoundError
from armature.transfer.blocks import KvBlocks, KvBlockStore
from armature.transfer.pins import PinTable
from armature.transfer.wire import TransferError

__all__ = ["free_unpinned", "import_kv", "pin_prompt", "plan_import"]


def pin_prompt(
    req: RequestState,
    pool: BlockPool,
    pins: PinTable,
    config: NativeEngineConfig,
    kv_store: KvBlockStore,
    *,
    worker_id: str,
    endpoints: dict[str, str],
) -> KvHandle:
    """Keep the prompt's full blocks after `req` finishes, for a decode worker to pull."""
    bs = config.block_size
    num_blocks = req.num_prompt_tokens // bs
    hashes = req.update_block_hashes(bs)[:num_blocks]
    block_ids = req.block_ids[:num_blocks]
    handle_id = f"{req.request_id}/{uuid.uuid4().hex[:12]}"
    if block_ids:
        pool.touch(block_ids)
        ttl_s = config.kv_pin_ttl_s
        pins.add(handle_id, block_ids, time.monotonic() + ttl_s, req.request_id)
    return KvHandle(
        handle_id=handle_id,
        worker_id=worker_id,
        layout=kv_store.layout,
        seq_hashes=[h for h, _ in hashes],
        transfer=NativeTransfer(endpoints=endpoints),
        ttl_s=config.kv_pin_ttl_s,
    )


def free_unpinned(pool: BlockPool, pins: PinTable, now_s: float | None = None) -> int:
    """Free the blocks of released and expired handles; returns how many."""
    freed = 0
    for block_ids in pins.take_freeable(time.monotonic() if now_s is None else now_s):
        pool.free(list(reversed(block_ids)))
        freed += len(block_ids)
    return freed


def plan_import(
    request: EngineRequest, pool: BlockPool, config: NativeEngineConfig, loras: LoraSet
) -> tuple[Sequence[tuple[int, int]], int]:
    """(hashes of the prompt blocks `request.kv_handle` offers, how many of them `pool`
    already caches as a prefix). Refuses (TransferError) a handle whose hashes are not this
    prompt's. Safe from another thread: the cached count is a hint, checked again by
    `import_kv`."""
    handle = request.kv_handle
    assert handle is not None
    bs = config.block_size
    num_tokens = len(request.prompt_token_ids) + len(request.output_token_ids)
    num_blocks = min(len(handle.seq_hashes), (num_tokens - 1) // bs)
    tokens = request.prompt_token_ids[: num_blocks * bs]
    hashes = compute_block_hashes(tokens, bs, _hash_seed(request, loras), None)
    if [h for h, _ in hashes] != handle.seq_hashes[:num_blocks]:
        raise TransferError("the KV handle's block hashes do not match this prompt")
    if not config.enable_prefix_caching:
        return hashes, num_blocks  # nothing can be imported: recompute
    return hashes, len(pool.find_prefix([h for h, _ in hashes]))


def _hash_seed(request: EngineRequest, loras: LoraSet) -> int:
    """The seed of `request`'s block hashes: its adapter's (InvalidRequestError if that is not
    served)."""
    if request.lora_name is None:
        return DEFAULT_HASH_SEED
    lora = loras.get(request.lora_name)
    if lora is None:
        raise LoraNotFoundError(f"LoRA adapter {request.lora_name!r} is not loaded")
    return lora.hash_seed


def import_kv(
    pool: BlockPool,
    kv_store: KvBlockStore,
    config: NativeEngineConfig,
    hashes: Sequence[tuple[int, int]],
    start: int,
    blocks: KvBlocks,
) -> list[int]:
    """Cache `blocks` as the prompt blocks `start..` (under `hashes[start:]`) on top of the
    cached prefix `hashes[:start]`: write them to `kv_store` and register them in `pool`.
    Returns the ids of the whole prefix with one reference each; [] (nothing changed) when the
    prefix was evicted meanwhile or the pool is too full."""
    if not config.enable_prefix_caching:
        return []
    num_new = min(blocks.num_blocks, len(hashes) - start)
    if num_new < blocks.num_blocks:
        blocks = KvBlocks(blocks.block_ids[:num_new], blocks.k, blocks.v)
    prefix = pool.find_prefix([h for h, _ in hashes[:start]])
    if len(prefix) < start or num_new <= 0:
        return []
    pool.touch(prefix)
    if num_new > pool.get_num_free_blocks():
        pool.free(list(reversed(prefix)))
        return []
    new_ids = pool.allocate(num_new)
    kv_store.write_blocks(new_ids, blocks)
    parent = hashes[start - 1][0] if start > 0 else None
    pool.cache_blocks(new_ids, hashes[start : start + num_new], parent)
    return prefix + new_ids
