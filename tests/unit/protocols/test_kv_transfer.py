"""KvHandle on the wire: each kind of transfer round-trips through msgpack, tagged by kind."""

from __future__ import annotations

import msgspec
import pytest

from armature.protocols.kv_transfer import ConnectorTransfer, KvHandle, KvLayout, NativeTransfer

LAYOUT = KvLayout(num_layers=2, block_size=16, num_kv_heads=1, head_dim=8, dtype="bfloat16")
NATIVE = NativeTransfer(endpoints={"tcp": "tcp://10.0.0.2:7001", "shm": "shm:/proc/9/fd/3"})
CONNECTOR = ConnectorTransfer(connector="vllm-nixl", params=b"\x81\xa1k\x01")


def handle(transfer: NativeTransfer | ConnectorTransfer) -> KvHandle:
    return KvHandle(
        handle_id="r1/abc",
        worker_id="w1",
        layout=LAYOUT,
        seq_hashes=[7, 2**64 - 1],
        transfer=transfer,
        ttl_s=12.5,
    )


@pytest.mark.parametrize("transfer", [NATIVE, CONNECTOR])
def test_a_handle_round_trips_with_its_kind_of_transfer(
    transfer: NativeTransfer | ConnectorTransfer,
) -> None:
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(handle(transfer)), type=KvHandle)
    assert decoded == handle(transfer)
    assert type(decoded.transfer) is type(transfer)


def test_the_transfer_is_tagged_by_kind() -> None:
    as_plain = msgspec.msgpack.decode(msgspec.msgpack.encode(handle(NATIVE)))
    assert as_plain["transfer"] == {"type": "native", "endpoints": NATIVE.endpoints}
    as_plain = msgspec.msgpack.decode(msgspec.msgpack.encode(handle(CONNECTOR)))
    assert as_plain["transfer"] == {
        "type": "connector",
        "connector": "vllm-nixl",
        "params": b"\x81\xa1k\x01",
    }


def test_a_transfer_of_an_unknown_kind_is_refused() -> None:
    plain = msgspec.msgpack.decode(msgspec.msgpack.encode(handle(NATIVE)))
    plain["transfer"] = {"type": "carrier-pigeon", "endpoints": {}}
    with pytest.raises(msgspec.ValidationError, match="Invalid value 'carrier-pigeon'"):
        msgspec.msgpack.decode(msgspec.msgpack.encode(plain), type=KvHandle)
