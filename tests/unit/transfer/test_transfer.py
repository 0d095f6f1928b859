"""KV transfer backends: pinned blocks move byte for byte over TCP and shared memory; layout
mismatches, unknown handles and malformed frames are refused with clear errors; pins are freed
on release or expiry, never under a read."""

from __future__ import annotations

import importlib.util
import socket
import time
from pathlib import Path

import pytest
import torch

from armature.engines.native.kv_store import PagedCacheStore
from armature.model.arch import ModelArch
from armature.model.kv_cache import PagedKvCache
from armature.protocols.kv_transfer import (
    ConnectorTransfer,
    KvHandle,
    KvLayout,
    NativeTransfer,
    layout_mismatch,
)
from armature.transfer.agent import KvTransferAgent
from armature.transfer.blocks import KvBlocks, ModeledKvStore, copy_block_runs
from armature.transfer.pins import PinTable, UnknownHandleError
from armature.transfer.tcp import TcpTransferClient
from armature.transfer.wire import TransferError

ARCH = ModelArch(
    model_type="llama",
    num_layers=3,
    hidden_size=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    intermediate_size=64,
    vocab_size=100,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    qkv_bias=False,
    max_position_embeddings=512,
    eos_token_ids=(),
    sliding_window=None,
)


def store(cache: PagedKvCache) -> PagedCacheStore:
    return PagedCacheStore(cache)


def filled_cache(num_blocks: int = 32, shared: bool = False) -> PagedKvCache:
    cache = PagedKvCache(ARCH, num_blocks, 4, torch.float32, torch.device("cpu"), shared=shared)
    cache.k.copy_(torch.randn(cache.k.shape, generator=torch.Generator().manual_seed(1)))
    cache.v.copy_(torch.randn(cache.v.shape, generator=torch.Generator().manual_seed(2)))
    return cache


def handle_for(agent: KvTransferAgent, handle_id: str, num_blocks: int) -> KvHandle:
    return KvHandle(
        handle_id=handle_id,
        worker_id="w",
        layout=agent.layout,
        seq_hashes=list(range(num_blocks)),
        transfer=NativeTransfer(endpoints=agent.endpoints),
    )


def test_pin_table_frees_on_release_or_expiry_but_never_under_a_read() -> None:
    pins = PinTable()
    pins.add("a", [1, 2], deadline_s=10.0)
    pins.add("b", [3], deadline_s=20.0)
    assert pins.begin_read("a") == [1, 2]
    assert pins.take_freeable(now_s=15.0) == []  # "a" expired but is being read
    pins.end_read("a")
    assert pins.take_freeable(now_s=15.0) == [[1, 2]]
    assert pins.num_expired == 1
    assert pins.release("b")
    assert not pins.release("b")  # twice: no-op
    with pytest.raises(UnknownHandleError, match="unknown or expired KV handle 'b'"):
        pins.begin_read("b")
    assert pins.take_freeable(now_s=0.0) == [[3]]
    assert len(pins) == 0 and pins.next_deadline_s() is None


def test_copy_block_runs_coalesces_and_matches_indexing() -> None:
    src = torch.arange(2 * 10 * 3, dtype=torch.float32).view(2, 10, 3)
    dst = torch.zeros(2, 12, 3)
    dst_ids, src_ids = [4, 5, 6, 0, 11], [2, 3, 4, 9, 1]
    copy_block_runs(dst, dst_ids, src, src_ids)
    assert torch.equal(dst[:, dst_ids], src[:, src_ids])
    assert dst[:, [1, 2, 3, 7, 8, 9, 10]].abs().sum() == 0


NIXL = pytest.param(
    ("nixl", "tcp"),
    marks=pytest.mark.skipif(
        importlib.util.find_spec("nixl_cu12") is None, reason="NIXL is not installed"
    ),
)


@pytest.mark.parametrize("backends", [("tcp",), ("shm", "tcp"), NIXL])
def test_pull_moves_pinned_blocks_exactly(backends: tuple[str, ...]) -> None:
    cache = filled_cache(shared=True)
    pins = PinTable()
    pins.add("h", [7, 8, 9, 20, 3], deadline_s=1e18)
    server = KvTransferAgent(
        store(cache),
        pins,
        shm_path=cache.shm_path,
        num_blocks=cache.num_blocks,
        backends=("shm", *backends),
        name="prefill",
    )
    server.start()
    local = PagedKvCache(ARCH, 16, 4, torch.float32, torch.device("cpu"))
    puller = KvTransferAgent(store(local), PinTable(), backends=backends, name="decode")
    try:
        handle = handle_for(server, "h", 5)
        blocks = puller.pull(handle, start_block=1)
        assert blocks.num_blocks == 4
        assert puller.num_pulls[backends[0]] == 1
        store(local).write_blocks([0, 1, 2, 10], blocks)
        for mine, theirs in zip([0, 1, 2, 10], [8, 9, 20, 3], strict=True):
            assert torch.equal(local.k[:, mine], cache.k[:, theirs])
            assert torch.equal(local.v[:, mine], cache.v[:, theirs])
        puller.release(handle)
        # the server ends its read just after the last byte left: wait for that event
        deadline_s = time.monotonic() + 10.0
        freed = pins.take_freeable(now_s=0.0)
        while not freed and time.monotonic() < deadline_s:
            time.sleep(0.001)
            freed = pins.take_freeable(now_s=0.0)
        assert freed == [[7, 8, 9, 20, 3]]
        with pytest.raises(TransferError, match="unknown or expired KV handle"):
            puller.pull(handle, 0)
    finally:
        server.stop()


def test_layout_mismatch_is_refused_on_both_sides() -> None:
    cache = filled_cache()
    pins = PinTable()
    pins.add("h", [1], deadline_s=1e18)
    server = KvTransferAgent(store(cache), pins)
    server.start()
    try:
        other = PagedKvCache(ARCH, 8, 8, torch.float32, torch.device("cpu"))  # block size 8
        puller = KvTransferAgent(store(other), PinTable(), backends=("tcp",))
        with pytest.raises(TransferError, match=r"KV layout mismatch.*block_size 4 != 8"):
            puller.pull(handle_for(server, "h", 1), 0)  # the decode side checks the handle
        lying = KvHandle(  # a handle that claims our layout: the server still refuses
            handle_id="h",
            worker_id="w",
            layout=other.layout,
            seq_hashes=[0],
            transfer=NativeTransfer(endpoints=server.endpoints),
        )
        with pytest.raises(TransferError, match=r"KV layout mismatch.*block_size 8 != 4"):
            puller.pull(lying, 0)
        assert len(pins) == 1  # nothing was released or freed
    finally:
        server.stop()
    assert "dtype bfloat16 != float32" in (
        layout_mismatch(cache.layout, KvLayout(**{**_fields(cache.layout), "dtype": "bfloat16"}))
        or ""
    )


def _fields(layout: KvLayout) -> dict[str, object]:
    return {f: getattr(layout, f) for f in layout.__struct_fields__}


def test_malformed_frames_drop_only_that_connection() -> None:
    cache = filled_cache()
    pins = PinTable()
    pins.add("h", [2, 4], deadline_s=1e18)
    server = KvTransferAgent(store(cache), pins)
    url = server.start()["tcp"]
    host, port = url.removeprefix("tcp://").rsplit(":", 1)
    try:
        for junk in [b"\xff\xff\xff\xff", b"\x00\x00\x00\x03abc", b"\x01\x00"]:
            with socket.create_connection((host, int(port))) as sock:
                sock.sendall(junk)
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(5)
                assert sock.recv(100) == b""  # closed without an answer
        blocks = TcpTransferClient().pull(url, handle_for(server, "h", 2), 0, cache.layout)
        assert blocks.k is not None and torch.equal(blocks.k, cache.k[:, [2, 4]])
    finally:
        server.stop()


def test_unreachable_server_is_a_transfer_error() -> None:
    local = PagedKvCache(ARCH, 4, 4, torch.float32, torch.device("cpu"))
    puller = KvTransferAgent(store(local), PinTable(), backends=("tcp",))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    handle = KvHandle(
        handle_id="h",
        worker_id="w",
        layout=local.layout,
        seq_hashes=[1],
        transfer=NativeTransfer(endpoints={"tcp": f"tcp://127.0.0.1:{port}"}),
    )
    with pytest.raises(TransferError, match="cannot reach the KV transfer server"):
        puller.pull(handle, 0)
    puller.release(handle)  # best effort: logs, does not raise


def test_a_connector_handle_is_refused_by_a_native_agent() -> None:
    """A handle whose blocks vLLM's connector holds names none of our endpoints: pulling it is
    a TransferError (the decode computes the prompt), releasing it does nothing."""
    local = PagedKvCache(ARCH, 4, 4, torch.float32, torch.device("cpu"))
    pins = PinTable()
    agent = KvTransferAgent(store(local), pins, backends=("tcp",))
    handle = KvHandle(
        handle_id="h",
        worker_id="w",
        layout=local.layout,
        seq_hashes=[],
        transfer=ConnectorTransfer(connector="vllm-nixl", params=b"\x80"),
    )
    with pytest.raises(
        TransferError,
        match="KV handle h is held by the 'vllm-nixl' connector; a native engine cannot pull it",
    ):
        agent.pull(handle, 0)
    agent.release(handle)
    assert agent.num_pulls == {"shm": 0, "nixl": 0, "tcp": 0}


def test_modeled_store_moves_no_bytes_and_charges_bandwidth() -> None:
    layout = KvLayout(num_layers=32, block_size=16, num_kv_heads=8, head_dim=128, dtype="bfloat16")
    assert layout.bytes_per_block == 2 * 32 * 8 * 128 * 2 * 16  # 2 MiB
    modeled = ModeledKvStore(layout, bandwidth_bytes_s=2 * 1024 * 1024 * 100, speedup_ratio=2.0)
    assert modeled.transfer_delay_s(100) == pytest.approx(0.5)
    pins = PinTable()
    pins.add("h", [0, 1, 2], deadline_s=1e18)
    server = KvTransferAgent(modeled, pins)
    server.start()
    try:
        puller = KvTransferAgent(ModeledKvStore(layout, 1e9), PinTable())
        blocks = puller.pull(handle_for(server, "h", 3), 1)
        assert blocks == KvBlocks([0, 1], None, None)
    finally:
        server.stop()


def _resident_shmem_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1])
    pytest.skip("no RssShmem in /proc/self/status")


def test_a_shared_cache_is_resident_and_zeroed_when_made() -> None:
    """A shared KV cache's pages are written when it is made (as a private one's are by
    torch.zeros), not at the engine step that first touches each of them."""
    before_kib = _resident_shmem_kib()
    cache = PagedKvCache(ARCH, 4096, 16, torch.float32, torch.device("cpu"), shared=True)
    num_bytes = 2 * cache.k.numel() * cache.k.element_size()
    assert num_bytes >= 8 << 20
    assert _resident_shmem_kib() - before_kib >= num_bytes // 1024 * 0.95
    assert not cache.k.any() and not cache.v.any()
