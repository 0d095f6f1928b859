"""One error root. Every error Armature raises on purpose is an `ArmatureError`; callers catch
ours, not `ValueError` or `KeyError`. Subclasses that once derived from a builtin keep it as a
second base, so that code written against the builtin still works while it moves over.

    ArmatureError
    ├── InvalidRequestError   a request that can never be served (the edge answers 400)
    ├── ConfigError           settings that cannot work (the CLI exits 2)
    └── ...                   each package's own (EngineDeadError, TransferError, RoutingError…)
"""

from __future__ import annotations

__all__ = ["ArmatureError", "ConfigError", "InvalidRequestError"]


class ArmatureError(Exception):
    """The root of every error Armature raises on purpose."""


class InvalidRequestError(ArmatureError, ValueError):
    """The request cannot be served by this engine (too long, bad token ids...). `param`
    names the request field at fault when one is (the edge reports it)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class ConfigError(ArmatureError, ValueError):
    """A configuration that cannot work; its message names the setting."""
