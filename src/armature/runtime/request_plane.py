"""The request plane's two sides as protocols; TCP (tcp_server/tcp_client) and NATS
(nats_plane) implement them. Urls say which: tcp://host:port or nats:<subject>."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Protocol

from armature.runtime.tcp_server import Handler

__all__ = ["RequestClient", "RequestServer", "ServerFactory"]


class RequestServer(Protocol):
    @property
    def url(self) -> str: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class RequestClient(Protocol):
    def stream(self, url: str, endpoint: str, payload: bytes) -> AsyncIterator[bytes]:
        """Response payloads; closing early cancels. PeerUnavailableError if the peer is
        gone, RemoteError for a failure the server reports."""
        ...

    async def close(self) -> None: ...


ServerFactory = Callable[[Mapping[str, Handler]], RequestServer]
