"""Which implementation holds the router's indexes (the prefix index's holder store and the
kv policy's routed predictions): the C extensions or the pure-Python reference
(`armature.backends`), chosen by the maker's argument, else ARMATURE_INDEX_BACKEND, else
native when built."""

from __future__ import annotations

from armature.backends import Backend, BackendUnavailableError
from armature.backends import resolve_backend as _resolve

__all__ = ["BACKEND_ENV_VAR", "IndexBackend", "IndexBackendUnavailableError", "resolve_backend"]

BACKEND_ENV_VAR = "ARMATURE_INDEX_BACKEND"
IndexBackend = Backend
IndexBackendUnavailableError = BackendUnavailableError


def resolve_backend(backend: Backend | None, native_built: bool) -> Backend:
    """`backend`; None: $ARMATURE_INDEX_BACKEND if set, else native when `native_built`."""
    return _resolve(backend, native_built, BACKEND_ENV_VAR)
