"""Build a worker's KV tier manager from its `KvTierConfig`: sizes in blocks, the host buffer,
the disk and remote stores, and what those stores already hold (a warm restart)."""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import unquote, urlsplit

import torch

from armature.config import KvTierConfig
from armature.errors import ConfigError
from armature.kv.event_log import KvEventLog
from armature.kv.tier_policy import TierPolicy
from armature.protocols.kv_events import KvTier
from armature.protocols.kv_transfer import KvLayout
from armature.tiers.block_file import layout_namespace
from armature.tiers.disk_store import DiskStore
from armature.tiers.errors import StoreError
from armature.tiers.host import HostBlocks
from armature.tiers.journal import JournaledStore
from armature.tiers.manager import KvTierManager
from armature.tiers.mover import BlockMover
from armature.tiers.policy_config import tier_policy_config
from armature.tiers.remote_store import open_remote_store
from armature.tiers.store import BlockStore

__all__ = ["build_tier_manager"]

log = logging.getLogger(__name__)


def build_tier_manager(
    config: KvTierConfig,
    event_log: KvEventLog,
    g1: tuple[torch.Tensor, torch.Tensor],
    layout: KvLayout,
    *,
    model_name: str,
    weights: str,
) -> KvTierManager:
    """The tiers of one engine whose KV cache is `g1` (k, v) of `layout`. Blocks already in
    the disk directory or the shared store are known at once (announced as Stored events).
    `model_name` and `weights` (the weights' fingerprint) name the blocks' namespace."""
    policy_config = tier_policy_config(config, layout.bytes_per_block)
    g1_k, g1_v = g1
    host = None
    if policy_config.num_host_blocks:
        pin = g1_k.device.type == "cuda"
        host = HostBlocks(layout, policy_config.num_host_blocks, g1_k.dtype, pin=pin)
    namespace = layout_namespace(model_name, layout, weights)
    stores: dict[KvTier, BlockStore] = {}
    if config.kv_disk_dir is not None and config.kv_remote is not None:
        _check_apart(config.kv_disk_dir, config.kv_remote)
    if config.kv_disk_dir is not None:
        stores[KvTier.DISK] = _open_disk(Path(config.kv_disk_dir), namespace)
    if config.kv_remote is not None:
        endpoint = config.kv_remote_endpoint
        stores[KvTier.EXTERNAL] = JournaledStore(
            open_remote_store(config.kv_remote, endpoint=endpoint, namespace=namespace)
        )
    manager = KvTierManager(
        TierPolicy(policy_config, event_log),
        BlockMover(g1_k, g1_v, layout, host),
        stores,
        max_inflight_bytes=config.kv_onboard_max_inflight_bytes,
        remote_refresh_s=config.kv_remote_refresh_s,
    )
    for tier, store in stores.items():
        try:
            keys = store.list_keys()
        except StoreError as exc:
            log.warning(
                "KV %s tier: cannot list %s (%s); starting empty", tier, store.describe(), exc
            )
            continue
        manager.add_existing(tier, keys)
        if keys:
            log.info("KV %s tier: found %d blocks in %s", tier, len(keys), store.describe())
    return manager


def _check_apart(disk_dir: str, remote_url: str) -> None:
    """ConfigError when the disk tier's directory and a file:// shared store's overlap: the
    disk tier deletes the files of the blocks it evicts, the shared store's among them."""
    if urlsplit(remote_url).scheme != "file":
        return
    local = Path(disk_dir).resolve()
    shared = Path(unquote(urlsplit(remote_url).path)).resolve()
    if local == shared or shared in local.parents or local in shared.parents:
        raise ConfigError(
            f"--kv-disk-dir {disk_dir} and --kv-remote {remote_url} overlap: the disk tier "
            "would delete the shared store's blocks as it evicts its own; give each a "
            "directory of its own"
        )


def _open_disk(root: Path, namespace: str) -> DiskStore:
    try:
        root.mkdir(parents=True, exist_ok=True)
        return DiskStore(root, namespace)
    except (OSError, StoreError) as exc:
        raise ConfigError(f"cannot use --kv-disk-dir {root}: {exc}") from None
