"""The lower KV tiers' policy settings from the configuration, checked: the one rule that
the engine's tiers (`tiers.factory`) and the mocker's modeled tiers (`sim.modeled_tiers`)
share."""

from __future__ import annotations

from armature.config import KvTierConfig
from armature.errors import ConfigError
from armature.kv.tier_policy import DiskOffload, OffloadMode, RemoteOffload, TierPolicyConfig

__all__ = ["tier_policy_config"]


def tier_policy_config(config: KvTierConfig, bytes_per_block: int) -> TierPolicyConfig:
    num_host = config.get_num_host_blocks(bytes_per_block)
    if (config.kv_host_bytes or config.kv_host_blocks) and num_host == 0:
        raise ConfigError(f"--kv-host-bytes is below one KV block ({bytes_per_block} bytes)")
    num_disk = config.get_num_disk_blocks(bytes_per_block)
    if config.has_disk_tier and num_disk == 0:
        raise ConfigError(f"--kv-disk-bytes is below one KV block ({bytes_per_block} bytes)")
    return TierPolicyConfig(
        num_host_blocks=num_host,
        num_disk_blocks=num_disk,
        has_remote=config.kv_remote is not None,
        offload=OffloadMode(config.kv_offload),
        disk_offload=DiskOffload(config.kv_disk_offload),
        remote_offload=RemoteOffload(config.kv_remote_offload),
    )
