"""An admin change sent on to the other frontend replicas: each gets it at its own address,
for itself alone, with the caller's key; each one's outcome comes back by name (httpx's
MockTransport answers as each replica would)."""

from __future__ import annotations

import httpx

from armature.frontend.peer_admin import REPLICA_ONLY_HEADER, send_to_peers


async def test_each_peer_gets_the_change_for_itself_alone() -> None:
    seen: list[tuple[str, str | None, str | None, bytes]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(
            (
                str(request.url),
                request.headers.get(REPLICA_ONLY_HEADER),
                request.headers.get("Authorization"),
                request.content,
            )
        )
        if request.url.host == "down":
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.host == "locked":
            return httpx.Response(401, json={"error": {"message": "Incorrect API key"}})
        return httpx.Response(200, json={})

    peers = {
        "frontend-b": "http://up:41001",
        "frontend-c": "http://down:41002/",
        "frontend-d": "http://locked:41003",
    }
    outcomes = await send_to_peers(
        peers,
        "/admin/overload",
        {"max_queued_requests": 7, "busy_kv_usage": None},
        "Bearer k1",
        transport=httpx.MockTransport(answer),
    )
    assert outcomes == {
        "frontend-b": "changed",
        "frontend-c": "failed: cannot reach http://down:41002/admin/overload: connection refused",
        "frontend-d": "failed: http://locked:41003/admin/overload answered HTTP 401",
    }
    body = b'{"max_queued_requests":7,"busy_kv_usage":null}'
    assert sorted(seen) == [
        ("http://down:41002/admin/overload", "1", "Bearer k1", body),
        ("http://locked:41003/admin/overload", "1", "Bearer k1", body),
        ("http://up:41001/admin/overload", "1", "Bearer k1", body),
    ]


async def test_no_peer_no_request_and_no_key_no_authorization() -> None:
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={})

    transport = httpx.MockTransport(answer)
    assert await send_to_peers({}, "/admin/overload", {}, None, transport=transport) == {}
    assert not sent
    peers = {"frontend-b": "http://up:1"}
    assert await send_to_peers(peers, "/admin/overload", {}, None, transport=transport) == {
        "frontend-b": "changed"
    }
    assert "Authorization" not in sent[0].headers
