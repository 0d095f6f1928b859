"""Checking listen addresses before a long start (a model load), and picking free ports."""

from __future__ import annotations

import socket

from armature.errors import ConfigError

__all__ = ["check_port_free", "free_port"]


def _bind_port(host: str, port: int) -> int:
    """Bind `host`:`port` for a moment (0: any free port); the port bound, or ConfigError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        bound: int = sock.getsockname()[1]
        return bound


def check_port_free(host: str, port: int) -> None:
    """ConfigError now, rather than after the model loaded, when `host`:`port` is taken."""
    _bind_port(host, port)


def free_port(host: str) -> int:
    """A port on `host` that was free a moment ago (for servers that cannot bind port 0)."""
    return _bind_port(host, 0)
