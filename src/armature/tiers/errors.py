"""The block stores' errors. A store raises only these (and `BlockRefusedError` comes from the
codec, `armature.tiers.block_file`, when stored bytes are not a usable block):

    ArmatureError
    └── StoreError               a store could not do what was asked
        ├── StoreFullError       no space left (disk full, quota, file size limit)
        ├── StoreUnavailableError
        │                        unreachable, timed out, refused permission, I/O error
        └── BlockMissingError    no block under that sequence hash
"""

from __future__ import annotations

from armature.errors import ArmatureError

__all__ = ["BlockMissingError", "StoreError", "StoreFullError", "StoreUnavailableError"]


class StoreError(ArmatureError):
    """A block store could not do what was asked; the message names the store."""


class StoreFullError(StoreError):
    """The store has no space for the block (ENOSPC, EDQUOT, EFBIG; an S3 store's 507)."""


class StoreUnavailableError(StoreError):
    """The store cannot be used now: unreachable, timed out, permission refused, I/O error."""


class BlockMissingError(StoreError):
    """The store holds no block under the asked sequence hash."""
