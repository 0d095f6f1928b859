"""A runtime setting changed on one frontend replica, carried to the others: POST
/admin/overload on any replica applies there and is sent on to every other replica of the
namespace, at the address its card in discovery names (`FrontendCard.http_url`), marked so
that they apply it without sending it on again. The caller's Authorization goes with it (the
replicas of one deployment share their API keys). Each peer's outcome comes back by name."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx

__all__ = ["PEER_TIMEOUT_S", "REPLICA_ONLY_HEADER", "send_to_peers"]

# a request with this header changes the replica that answers it alone (a peer's forward)
REPLICA_ONLY_HEADER = "x-armature-replica-only"
PEER_TIMEOUT_S = 5.0


async def send_to_peers(
    peers: Mapping[str, str],
    path: str,
    body: dict[str, Any],
    authorization: str | None,
    *,
    timeout_s: float = PEER_TIMEOUT_S,
    transport: httpx.AsyncBaseTransport | None = None,
) -> dict[str, str]:
    """POST `body` to `path` on every peer (name -> base url) at once, for that replica
    alone: name -> "changed", or "failed: <why>"."""
    if not peers:
        return {}
    headers = {REPLICA_ONLY_HEADER: "1"}
    if authorization is not None:
        headers["Authorization"] = authorization
    async with httpx.AsyncClient(timeout=timeout_s, headers=headers, transport=transport) as client:

        async def send(url: str) -> str:
            target = url.rstrip("/") + path
            try:
                response = await client.post(target, json=body)
            except httpx.HTTPError as exc:
                return f"failed: cannot reach {target}: {str(exc) or type(exc).__name__}"
            if response.status_code != 200:
                return f"failed: {target} answered HTTP {response.status_code}"
            return "changed"

        names = sorted(peers)
        outcomes = await asyncio.gather(*(send(peers[name]) for name in names))
    return dict(zip(names, outcomes, strict=True))
