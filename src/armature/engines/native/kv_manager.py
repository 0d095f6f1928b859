"""Per-request block bookkeeping on top of the block pool: prefix-cache lookup, slot
allocation, registering full blocks, freeing. Pure; called by the scheduler only."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from armature.engines.native.request import FoundPrefix, RequestState
from armature.kv.block_key import BlockKey
from armature.kv.block_pool import BlockPool

__all__ = ["KvCacheManager"]


class KvCacheManager:
    def __init__(
        self,
        pool: BlockPool,
        on_blocks_written: Callable[[Sequence[tuple[int, BlockKey]]], None] | None = None,
    ):
        """`on_blocks_written` is told (block id, key) of each block newly registered in the
        prefix cache (a write-through KV tier copies them down). Each request's blocks are
        hashed with its own seed (its LoRA adapter's salt)."""
        self.pool = pool
        self.on_blocks_written = on_blocks_written
        self.block_size = pool.block_size

    def find_cached_prefix(self, request: RequestState) -> list[int]:
        """Blocks of the longest cached prefix of a request with nothing computed. At least
        the last token is always left to compute (its logits are needed); none for a request
        that wants its prompt's logprobs (every position's logits). A queue's head
        that does not fit is looked up again every step: where nothing left the cache since
        its last lookup, that prefix still holds, and only the blocks past it are looked up."""
        assert request.num_computed_tokens == 0 and not request.block_ids
        if request.prompt_logprobs is not None:  # every prompt position's logits are wanted
            return []
        hashes = request.update_block_hashes(self.block_size)
        max_blocks = (request.num_tokens - 1) // self.block_size
        pool = self.pool
        num_removals = pool.get_num_removals()
        last = request.found_prefix
        if (
            last is not None
            and last.pool is pool
            and last.num_removals == num_removals
            and last.max_blocks == max_blocks
        ):
            start = len(last.block_ids)
            found = [*last.block_ids, *pool.find_prefix_of_pairs(hashes, max_blocks, start)]
        else:
            found = pool.find_prefix_of_pairs(hashes, max_blocks)
        request.found_prefix = FoundPrefix(pool, num_removals, max_blocks, tuple(found))
        return found

    def allocate_slots(
        self, request: RequestState, num_new_tokens: int, cached_blocks: list[int] | None = None
    ) -> bool:
        """Give `request` blocks for `num_new_tokens` more tokens (after taking `cached_blocks`
        as its computed prefix). All or nothing: False leaves every state untouched."""
        if not cached_blocks:  # the common case (decodes, later prefill chunks): no lookups
            num_blocks_needed = -(
                -(request.num_computed_tokens + num_new_tokens) // self.block_size
            )
            num_new_blocks = num_blocks_needed - len(request.block_ids)
            if num_new_blocks <= 0:
                return True
            if num_new_blocks > self.pool.get_num_free_blocks():
                return False
            request.block_ids.extend(self.pool.allocate(num_new_blocks))
            return True
        cached = cached_blocks
        num_computed = request.num_computed_tokens + len(cached) * self.block_size
        num_blocks_needed = -(-(num_computed + num_new_tokens) // self.block_size)
        num_new_blocks = max(0, num_blocks_needed - len(request.block_ids) - len(cached))
        num_cached_free = self.pool.get_num_unreferenced(cached)
        if num_new_blocks + num_cached_free > self.pool.get_num_free_blocks():
            return False
        if cached:
            self.pool.touch(cached, is_hit=True)
            request.block_ids.extend(cached)
            request.num_computed_tokens = num_computed
            request.num_registered_blocks = len(request.block_ids)
        if num_new_blocks:
            request.block_ids.extend(self.pool.allocate(num_new_blocks))
        return True

    def register_full_blocks(self, request: RequestState) -> None:
        """Put every newly computed full block of `request` into the prefix cache."""
        num_full = request.num_computed_tokens // self.block_size
        start = request.num_registered_blocks
        if num_full <= start:
            return
        hashes = request.update_block_hashes(self.block_size)
        parent = hashes[start - 1][0] if start > 0 else None
        block_ids = request.block_ids[start:num_full]
        self.pool.cache_blocks(block_ids, hashes[start:num_full], parent)
        request.num_registered_blocks = num_full
        if self.on_blocks_written is not None:
            parents = [parent] + [h for h, _ in hashes[start : num_full - 1]]
            keys = [
                BlockKey(seq, local, p)
                for (seq, local), p in zip(hashes[start:num_full], parents, strict=True)
            ]
            self.on_blocks_written(list(zip(block_ids, keys, strict=True)))

    def release_held(self, request: RequestState) -> None:
        """Drop the references that kept `request`'s imported KV blocks from eviction until
        it was admitted (or finished first)."""
        if request.held_block_ids:
            self.pool.free(list(reversed(request.held_block_ids)))
            request.held_block_ids = []

    def free(self, request: RequestState) -> None:
        """Release all of `request`'s blocks, tail first, and reset its computed state."""
        self.release_held(request)
        self.pool.free(list(reversed(request.block_ids)))
        request.block_ids = []
        request.num_computed_tokens = 0
        request.num_registered_blocks = 0
