"""Native or Python: the choice behind each component that has a C extension and its
pure-Python reference (the router's indexes, the KV block pool). Both give identical results
(tests hold each pair equal under hypothesis); Python is always present.

A maker's `backend` argument wins, else the component's environment variable (`native` or
`python`), else native when its extension was built.
"""

from __future__ import annotations

import enum
import os

from armature.errors import ArmatureError, ConfigError

__all__ = ["Backend", "BackendUnavailableError", "resolve_backend"]


class Backend(enum.StrEnum):
    """Which implementation a component runs on."""

    NATIVE = "native"  # a C extension (present if it was built)
    PYTHON = "python"  # the pure-Python reference: always present


class BackendUnavailableError(ArmatureError, RuntimeError):
    """The native backend was asked for, but its extension was not built."""


def resolve_backend(backend: Backend | None, native_built: bool, env_var: str) -> Backend:
    """`backend`; None: $`env_var` if set, else native when `native_built`."""
    if backend is not None:
        return Backend(backend)
    name = os.environ.get(env_var, "")
    if not name:
        return Backend.NATIVE if native_built else Backend.PYTHON
    try:
        return Backend(name)
    except ValueError:
        choices = ", ".join(b.value for b in Backend)
        raise ConfigError(f"{env_var} must be one of {choices}, got {name!r}") from None
