"""Authentication on the internal planes: the TCP request plane and the KV transfer server
take only peers that present the shared secret; NATS takes its own token from the url."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch

from armature.engines.native.kv_store import PagedCacheStore
from armature.model.arch import ModelArch
from armature.model.kv_cache import PagedKvCache
from armature.protocols.kv_transfer import KvHandle, NativeTransfer
from armature.runtime.nats_conn import NatsUnavailableError, connect_nats
from armature.runtime.request_plane import PeerUnavailableError
from armature.runtime.tcp_client import RequestPlaneClient
from armature.runtime.tcp_server import RequestPlaneServer
from armature.transfer.agent import KvTransferAgent
from armature.transfer.pins import PinTable
from armature.transfer.wire import TransferError
from servers import Nats


async def echo(payload: bytes) -> AsyncIterator[bytes]:
    yield payload


async def test_the_tcp_plane_needs_the_secret(caplog: pytest.LogCaptureFixture) -> None:
    server = RequestPlaneServer({"echo": echo}, secret="s3cret-plane")
    await server.start()
    try:
        # the client is told why (it read as a worker hanging up, as a dead one does)
        refused = "the server refused this client: its request plane secret differs"
        for secret in (None, "wrong"):
            client = RequestPlaneClient(secret=secret)
            with pytest.raises(PeerUnavailableError, match=refused):
                _ = [x async for x in client.stream(server.url, "echo", b"hi")]
            await client.close()
        assert "gave no valid secret" in caplog.text
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 2 and all(refused in e for e in errors), errors
        assert "s3cret-plane" not in caplog.text and "wrong" not in caplog.text
        client = RequestPlaneClient(secret="s3cret-plane")
        assert [x async for x in client.stream(server.url, "echo", b"hi")] == [b"hi"]
        await client.close()
    finally:
        await server.stop()


def test_kv_transfers_need_the_secret() -> None:
    arch = ModelArch(
        model_type="llama", num_layers=1, hidden_size=8, num_heads=1, num_kv_heads=1,
        head_dim=8, intermediate_size=8, vocab_size=10, rms_norm_eps=1e-6,
        tie_word_embeddings=True, qkv_bias=False, max_position_embeddings=64,
        eos_token_ids=(), sliding_window=None,
    )  # fmt: skip
    cache = PagedKvCache(arch, 4, 4, torch.float32, torch.device("cpu"))
    pins = PinTable()
    pins.add("h", [1, 2], deadline_s=1e18)
    server = KvTransferAgent(PagedCacheStore(cache), pins, backends=("tcp",), secret="kv-s3cret")
    server.start()
    try:
        handle = KvHandle(
            handle_id="h", worker_id="w", layout=cache.layout, seq_hashes=[1, 2],
            transfer=NativeTransfer(endpoints=server.endpoints),
        )  # fmt: skip
        local = PagedCacheStore(PagedKvCache(arch, 4, 4, torch.float32, torch.device("cpu")))
        intruder = KvTransferAgent(local, PinTable(), backends=("tcp",), secret="guess")
        with pytest.raises(TransferError, match="bad secret"):
            intruder.pull(handle, 0)
        intruder.release(handle)  # refused too: the pin stays
        assert len(pins) == 1 and pins.take_freeable(0.0) == []
        peer = KvTransferAgent(local, PinTable(), backends=("tcp",), secret="kv-s3cret")
        assert peer.pull(handle, 0).num_blocks == 2
    finally:
        server.stop()


async def test_nats_takes_its_token_from_the_url(tmp_path: Path) -> None:
    nats = Nats(tmp_path, token="nats-t0ken")
    nats.start()
    try:
        with pytest.raises(NatsUnavailableError):
            await connect_nats(nats.url)
        host = nats.url.removeprefix("nats://")
        nc = await connect_nats(f"nats://nats-t0ken@{host}")
        await nc.close()
    finally:
        nats.stop()
