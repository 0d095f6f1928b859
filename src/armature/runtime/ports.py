"""Holding listen addresses from before a long start (a model load, worker processes that
bind ports of their own), and picking free ports."""

from __future__ import annotations

import socket

from armature.errors import ConfigError

__all__ = ["check_bindable", "free_port", "reserve_listen_socket", "reserve_shared_listen_socket"]


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


def reserve_listen_socket(
    host: str, port: int, *, reuse_port: bool = False, listen_now: bool = True
) -> socket.socket:
    """A socket bound to `host`:`port` and listening, for the HTTP server to serve on later:
    ConfigError now, rather than after the model loaded, when the address is taken; and no
    port that a worker or transfer server binds meanwhile (port 0) can land on it. Not
    inherited by child processes. `reuse_port`: SO_REUSEPORT, so that other processes of
    this user listening on the same address with it too share the connections (the kernel
    spreads them over the sockets); a socket without it still finds the address taken.
    Without `listen_now` it is bound only, and the server listens when it starts serving
    (asyncio's `create_server` does): a process joining a shared port then gets no share of
    the connections while it starts (they would wait in its backlog until it serves)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if listen_now:
            sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def reserve_shared_listen_socket(host: str, port: int) -> socket.socket:
    """The first of a group of SO_REUSEPORT sockets on `host`:`port` (port 0: a free port;
    the others bind the port this one has): ConfigError when anything listens there already,
    even a process sharing the port the same way (it would otherwise join the group and
    take a share of the connections)."""
    free = _bind_port(host, port)
    return reserve_listen_socket(host, free, reuse_port=True)


def free_port(host: str) -> int:
    """A port on `host` that was free a moment ago (for servers that cannot bind port 0)."""
    return _bind_port(host, 0)


def check_bindable(flag: str, host: str) -> None:
    """ConfigError naming `flag` when `host` is no address of this machine (nothing could
    bind it), before a server that binds it later fails where no one sees it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, 0))
        except OSError as exc:
            raise ConfigError(f"{flag} {host}: cannot bind it here: {exc.strerror}") from None
