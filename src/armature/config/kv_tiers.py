"""A worker's lower KV tiers (the KV block manager): host memory (G2), local disk (G3) and a
store shared by every worker (G4). None of them is on by default.

The mocker (and `armature replay`) runs the same tier policy with no bytes: its disk and
remote tiers hold no files (a size alone makes a disk tier; `--kv-disk-dir` is not needed and
`--kv-remote` is not opened), and a load takes blocks x bytes per block / the tier's
`--kv-*-bandwidth-gbps`. Those bandwidths are for the mocker only; the torch engine's copies
take the time they take."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from armature.config.settings import setting
from armature.config.values import (
    MAX_KV_BLOCKS,
    float_at_most,
    non_empty,
    parse_bytes,
    positive_float,
    tier_blocks,
)
from armature.errors import ConfigError

__all__ = [
    "DEFAULT_DISK_BANDWIDTH_GBPS",
    "DEFAULT_HOST_BANDWIDTH_GBPS",
    "DEFAULT_ONBOARD_MAX_INFLIGHT_BYTES",
    "DEFAULT_REMOTE_BANDWIDTH_GBPS",
    "KvTierConfig",
]

DEFAULT_ONBOARD_MAX_INFLIGHT_BYTES = 1 << 30
# the mocker's load bandwidths, GB/s (1e9 bytes/s; docs/architecture.md, sim/, says why)
DEFAULT_HOST_BANDWIDTH_GBPS = 25.0  # PCIe Gen4 x16 (32 GB/s) at ~80%: pinned block copies
DEFAULT_DISK_BANDWIDTH_GBPS = 5.0  # one NVMe Gen4 SSD (~7 GB/s sequential), a file per block
DEFAULT_REMOTE_BANDWIDTH_GBPS = 2.5  # one worker's share of a network store (~20 Gb/s)
MAX_REMOTE_REFRESH_S = 86_400.0  # a listing a day: longer is a typo (and past a wait's range)


@dataclass(frozen=True, kw_only=True)
class KvTierConfig:
    """Where KV blocks go when the engine's cache evicts them, and where they come back from."""

    kv_host_bytes: int | None = setting(
        None,
        "G2: host memory for KV blocks the engine's cache evicts (e.g. 8GiB)",
        parse=parse_bytes,
    )
    kv_host_blocks: int | None = setting(
        None, "G2 capacity in blocks (overrides --kv-host-bytes)", parse=tier_blocks
    )
    kv_disk_dir: str | None = setting(
        None,
        "G3: a directory on local disk for KV blocks (found again after a restart; the mocker "
        "writes no files and needs none)",
        parse=non_empty,
    )
    kv_disk_bytes: int | None = setting(
        None, "G3 capacity in bytes (with --kv-disk-dir; alone for the mocker)", parse=parse_bytes
    )
    kv_disk_blocks: int | None = setting(
        None, "G3 capacity in blocks (overrides --kv-disk-bytes)", parse=tier_blocks
    )
    kv_remote: str | None = setting(
        None,
        "G4: a KV store shared by every worker: file:///shared/dir or s3://bucket/prefix (the "
        "mocker opens nothing: any value turns its modeled G4 on)",
        parse=non_empty,
    )
    kv_remote_endpoint: str | None = setting(
        None, "the S3 endpoint for --kv-remote s3://... (e.g. http://127.0.0.1:9000)"
    )
    kv_remote_refresh_s: float = setting(
        10.0,
        "how often a worker journals the blocks it wrote to the shared store and reads the "
        "other workers' journals (450 s or more: lists the whole store instead)",
        parse=float_at_most(MAX_REMOTE_REFRESH_S),
    )
    kv_offload: str = setting(
        "evicted",
        "evicted: a block goes down to G2 when the engine's cache evicts it; write-through: "
        "every completed block is copied down at once",
        choices=("evicted", "write-through"),
    )
    kv_disk_offload: str = setting(
        "reused",
        "which G2 victims go down to G3: reused (blocks that served at least 2 prefix hits) or all",
        choices=("reused", "all"),
    )
    kv_remote_offload: str = setting(
        "off",
        "off: G4 is only read; evicted: blocks leaving the lowest local tier (G3, else G2) go "
        "to G4; all: blocks entering the lowest local tier also go to G4 at once",
        choices=("off", "evicted", "all"),
    )
    kv_onboard_max_inflight_bytes: int = setting(
        DEFAULT_ONBOARD_MAX_INFLIGHT_BYTES,
        "bound on KV bytes being loaded from lower tiers at once (onboarding waits beyond it)",
        parse=parse_bytes,
    )
    kv_host_bandwidth_gbps: float = setting(
        DEFAULT_HOST_BANDWIDTH_GBPS,
        "mocker and replay only: GB/s (1e9 bytes/s) of loads from G2; default: what pinned "
        "copies of KV blocks reach over PCIe Gen4 x16 (32 GB/s line rate)",
        parse=positive_float,
    )
    kv_disk_bandwidth_gbps: float = setting(
        DEFAULT_DISK_BANDWIDTH_GBPS,
        "mocker and replay only: GB/s of loads from G3; default: one NVMe Gen4 SSD (~7 GB/s "
        "sequential) reading a file per block",
        parse=positive_float,
    )
    kv_remote_bandwidth_gbps: float = setting(
        DEFAULT_REMOTE_BANDWIDTH_GBPS,
        "mocker and replay only: GB/s of loads from G4; default: one worker's share of a "
        "network store (~20 Gb/s)",
        parse=positive_float,
    )

    def __post_init__(self) -> None:
        if self.kv_disk_dir is not None and not self.has_disk_size:
            raise ConfigError("--kv-disk-dir needs --kv-disk-bytes or --kv-disk-blocks")
        if self.kv_remote is None and self.kv_remote_offload != "off":
            raise ConfigError("--kv-remote-offload needs --kv-remote")
        if self.kv_remote is None and self.kv_remote_endpoint is not None:
            raise ConfigError("--kv-remote-endpoint needs --kv-remote s3://...")

        if self.kv_onboard_max_inflight_bytes <= 0:
            raise ConfigError("--kv-onboard-max-inflight-bytes must be positive")
        for name, gbps in self.get_bandwidths_gbps().items():
            if not gbps > 0:
                raise ConfigError(f"--kv-{name}-bandwidth-gbps must be positive")

    @property
    def is_enabled(self) -> bool:
        return bool(
            self.kv_host_bytes or self.kv_host_blocks or self.has_disk_tier or self.kv_remote
        )

    @property
    def has_host_tier(self) -> bool:
        return bool(self.kv_host_bytes or self.kv_host_blocks)

    @property
    def has_disk_size(self) -> bool:
        return self.kv_disk_bytes is not None or self.kv_disk_blocks is not None

    @property
    def has_disk_tier(self) -> bool:
        """A G3 is asked for: a directory (the torch engine) or a size alone (the mocker)."""
        return self.kv_disk_dir is not None or self.has_disk_size

    def get_bandwidths_gbps(self) -> dict[str, float]:
        """The mocker's load bandwidths by tier flag name (host, disk, remote), GB/s."""
        return {
            "host": self.kv_host_bandwidth_gbps,
            "disk": self.kv_disk_bandwidth_gbps,
            "remote": self.kv_remote_bandwidth_gbps,
        }

    def check_prefix_caching(self, enable_prefix_caching: bool) -> None:
        """ConfigError for lower tiers under --no-prefix-caching: they keep a copy of each
        cached block and find it again by its prefix hash, and no block is cached."""
        if self.is_enabled and not enable_prefix_caching:
            raise ConfigError(
                "the lower KV tiers (--kv-host-*, --kv-disk-*, --kv-remote) keep cached prefix "
                "blocks: drop --no-prefix-caching or the tier flags"
            )

    def check_applies(self) -> None:
        """ConfigError for a tier policy flag a serving worker would ignore, its tier not
        there (a replay notes them instead: it compares settings)."""
        if self.kv_remote is None and not _is_default(self, "kv_remote_refresh_s"):
            raise ConfigError("--kv-remote-refresh-s needs --kv-remote")
        if not self.has_disk_tier and not _is_default(self, "kv_disk_offload"):
            raise ConfigError("--kv-disk-offload needs a disk tier (--kv-disk-dir)")
        if not self.has_host_tier and not _is_default(self, "kv_disk_offload"):
            # G1's blocks go to the first lower tier whatever it says
            raise ConfigError(
                "--kv-disk-offload picks which host-tier (G2) victims go down to disk: it "
                "needs --kv-host-bytes or --kv-host-blocks"
            )
        if not self.is_enabled and not _is_default(self, "kv_offload"):
            raise ConfigError(
                "--kv-offload needs a lower KV tier (--kv-host-*, --kv-disk-*, --kv-remote)"
            )
        only_read = (
            not (self.has_host_tier or self.has_disk_tier) and self.kv_remote_offload == "off"
        )
        if self.is_enabled and only_read and not _is_default(self, "kv_offload"):
            raise ConfigError(
                "--kv-offload: nothing takes the blocks (--kv-remote with --kv-remote-offload "
                "off is only read): add a host or disk tier, or --kv-remote-offload"
            )
        if not self.is_enabled and not _is_default(self, "kv_onboard_max_inflight_bytes"):
            raise ConfigError(
                "--kv-onboard-max-inflight-bytes needs a lower KV tier (--kv-host-*, "
                "--kv-disk-*, --kv-remote)"
            )

    def check_stored(self) -> None:
        """ConfigError for what an engine that stores real blocks (torch) cannot run: a disk
        size with no directory to hold it, or a modeled bandwidth (the mocker's alone)."""
        if self.has_disk_size and self.kv_disk_dir is None:
            raise ConfigError(
                "--kv-disk-bytes/--kv-disk-blocks need --kv-disk-dir (only the mocker models a "
                "disk tier without files)"
            )
        defaults = KvTierConfig()
        for name, gbps in self.get_bandwidths_gbps().items():
            if gbps != defaults.get_bandwidths_gbps()[name]:
                raise ConfigError(
                    f"--kv-{name}-bandwidth-gbps is for --engine mocker (real copies take the "
                    "time they take)"
                )

    def get_num_host_blocks(self, bytes_per_block: int) -> int:
        if self.kv_host_blocks is not None:
            return self.kv_host_blocks
        return _num_blocks("host", self.kv_host_bytes, bytes_per_block)

    def get_num_disk_blocks(self, bytes_per_block: int) -> int:
        if self.kv_disk_blocks is not None:
            return self.kv_disk_blocks
        return _num_blocks("disk", self.kv_disk_bytes, bytes_per_block)

    def for_worker(self, index: int, num_workers: int) -> KvTierConfig:
        """Worker `index`'s tiers when one command starts `num_workers`: each gets its own
        subdirectory of --kv-disk-dir (a local disk tier has one owner); G4 stays shared."""
        if num_workers <= 1 or self.kv_disk_dir is None:
            return self
        return dataclasses.replace(self, kv_disk_dir=f"{self.kv_disk_dir}/worker-{index}")


def _is_default(config: KvTierConfig, name: str) -> bool:
    """Whether setting `name` of `config` has its default value."""
    value: object = getattr(config, name)
    return bool(value == KvTierConfig.__dataclass_fields__[name].default)


def _num_blocks(tier: str, num_bytes: int | None, bytes_per_block: int) -> int:
    """The blocks --kv-`tier`-bytes holds; ConfigError past MAX_KV_BLOCKS (a tier's count,
    like a cache's, must fit the index's integers)."""
    num_blocks = (num_bytes or 0) // bytes_per_block
    if num_blocks > MAX_KV_BLOCKS:
        raise ConfigError(
            f"--kv-{tier}-bytes holds {num_blocks:,} blocks of {bytes_per_block:,} bytes: at "
            f"most {MAX_KV_BLOCKS:,}"
        )
    return num_blocks
