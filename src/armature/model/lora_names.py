"""What a LoRA adapter may be called, and the error for an adapter that cannot be served.

Without torch: the frontend and the mocker check adapter names without loading weights.
"""

from __future__ import annotations

import re

from armature.errors import ArmatureError

__all__ = ["LoraError", "check_lora_name"]

# the name is what clients pass as `model`: printable, no spaces, bounded
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")


class LoraError(ArmatureError, ValueError):
    """An adapter that cannot be served over this model; the message says why."""


def check_lora_name(name: str) -> None:
    """LoraError unless `name` can be a model name (letters, digits, ._:/@+-; at most 128)."""
    if not _NAME.fullmatch(name):
        raise LoraError(
            f"adapter name {name!r} must start with a letter or digit and hold only letters, "
            "digits and ._:/@+- (at most 128 characters)"
        )
