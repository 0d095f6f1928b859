"""Whether a discovered worker runs what the planner's timing profile was measured on: its
plans assume the profiled model, block size and KV pool, so a worker that differs (started
with other flags, or another model) makes them wrong without any error. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from armature.protocols.worker import WorkerCard

__all__ = ["ProfiledWorker", "get_card_mismatches"]


@dataclass(frozen=True)
class ProfiledWorker:
    """The worker a timing profile describes: the served model, its KV block size and the
    number of KV blocks in its pool."""

    model_name: str
    block_size_tokens: int
    num_kv_blocks: int


def get_card_mismatches(card: WorkerCard, profiled: ProfiledWorker) -> list[str]:
    """What `card` runs that differs from `profiled`, one phrase each (empty: it matches)."""
    mismatches = []
    if card.model_name != profiled.model_name:
        mismatches.append(f"model {card.model_name!r} (profiled {profiled.model_name!r})")
    if card.block_size != profiled.block_size_tokens:
        mismatches.append(
            f"block size {card.block_size} tokens (profiled {profiled.block_size_tokens})"
        )
    if card.num_kv_blocks != profiled.num_kv_blocks:
        mismatches.append(f"{card.num_kv_blocks} KV blocks (profiled {profiled.num_kv_blocks})")
    return mismatches
