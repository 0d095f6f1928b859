"""Which implementation holds the router's indexes (the prefix index's holder store and the
kv policy's routed predictions): the C extensions or the pure-Python reference. Both give
identical results (tests hold them equal under hypothesis); Python is always present.

The `backend` argument of a maker wins, else the ARMATURE_INDEX_BACKEND environment variable
(`native` or `python`), else native when its extension was built.
"""

from __future__ import annotations

import enum
import os

from armature.errors import ArmatureError, ConfigError

__all__ = ["BACKEND_ENV_VAR", "IndexBackend", "IndexBackendUnavailableError", "resolve_backend"]

BACKEND_ENV_VAR = "ARMATURE_INDEX_BACKEND"


class IndexBackend(enum.StrEnum):
    """Which implementation holds an index."""

    NATIVE = "native"  # a C extension (present if it was built)
    PYTHON = "python"  # dicts and sets: always present, the reference


class IndexBackendUnavailableError(ArmatureError, RuntimeError):
    """The native backend was asked for, but its extension was not built."""


def resolve_backend(backend: IndexBackend | None, native_built: bool) -> IndexBackend:
    """`backend`; None: $ARMATURE_INDEX_BACKEND if set, else native when `native_built`."""
    if backend is not None:
        return IndexBackend(backend)
    name = os.environ.get(BACKEND_ENV_VAR, "")
    if not name:
        return IndexBackend.NATIVE if native_built else IndexBackend.PYTHON
    try:
        return IndexBackend(name)
    except ValueError:
        choices = ", ".join(b.value for b in IndexBackend)
        message = f"{BACKEND_ENV_VAR} must be one of {choices}, got {name!r}"
        raise ConfigError(message) from None
