"""The stored block format: exact bytes, every refusal reason, names and namespaces, and a fuzz
that `decode_block` raises nothing but BlockRefusedError for any bytes."""

from __future__ import annotations

import struct

import msgspec
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from armature.kv.block_key import BlockKey
from armature.protocols.kv_transfer import KvLayout, layout_mismatch
from armature.tiers.block_file import (
    FORMAT_VERSION,
    MAGIC,
    BlockHeader,
    BlockRefusedError,
    RefusalReason,
    block_name,
    decode_block,
    encode_block,
    layout_namespace,
    parse_block_name,
)

LAYOUT = KvLayout(num_layers=2, block_size=4, num_kv_heads=1, head_dim=2, dtype="float16")
KEY = BlockKey(0xDEADBEEF, 0x1234, 0xABCD)
PAYLOAD = bytes(range(64))
U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)


def _refusal(data: bytes, seq_hash: int = KEY.seq_hash, layout: KvLayout = LAYOUT) -> str:
    with pytest.raises(BlockRefusedError) as refused:
        decode_block(data, layout, seq_hash)
    return refused.value.reason


def _header_of(data: bytes) -> tuple[int, BlockHeader]:
    header_bytes = struct.unpack_from(">I", data, 6)[0]
    return header_bytes, msgspec.msgpack.decode(data[10 : 10 + header_bytes], type=BlockHeader)


def _with_header(data: bytes, header: BlockHeader) -> bytes:
    raw = msgspec.msgpack.encode(header)
    return MAGIC + struct.pack(">HI", FORMAT_VERSION, len(raw)) + raw + PAYLOAD


def test_a_block_is_magic_version_header_length_header_payload() -> None:
    data = encode_block(LAYOUT, KEY, PAYLOAD)
    header_bytes, header = _header_of(data)
    assert data[:6] == b"AKVB\x00\x01"
    assert len(data) == 10 + header_bytes + 64
    assert data[10 + header_bytes :] == PAYLOAD
    assert header == BlockHeader(
        version=1,
        layout=LAYOUT,
        seq_hash=0xDEADBEEF,
        local_hash=0x1234,
        parent_hash=0xABCD,
        payload_bytes=64,
        checksum=header.checksum,
    )
    assert header.checksum == xxhash.xxh3_64_intdigest(PAYLOAD)


@pytest.mark.parametrize("parent", [None, 0, (1 << 64) - 1])
def test_decode_returns_the_payload_as_a_view(parent: int | None) -> None:
    key = BlockKey((1 << 64) - 1, 7, parent)
    data = encode_block(LAYOUT, key, memoryview(PAYLOAD))
    payload = decode_block(data, LAYOUT, key.seq_hash)
    assert isinstance(payload, memoryview)
    assert payload == PAYLOAD
    assert decode_block(memoryview(data), LAYOUT, key.seq_hash) == PAYLOAD


@pytest.mark.parametrize("size_bytes", [0, 63, 65])
def test_encode_refuses_a_payload_of_the_wrong_size(size_bytes: int) -> None:
    with pytest.raises(ValueError, match=f"{size_bytes} bytes, layout needs 64"):
        encode_block(LAYOUT, KEY, bytes(size_bytes))


def test_every_cut_of_a_block_is_truncated() -> None:
    data = encode_block(LAYOUT, KEY, PAYLOAD)
    reasons = {cut: _refusal(data[:cut]) for cut in range(len(data))}
    assert reasons == dict.fromkeys(range(len(data)), RefusalReason.TRUNCATED)


@pytest.mark.parametrize(
    "data",
    [
        b"X" + encode_block(LAYOUT, KEY, PAYLOAD)[1:],  # bad magic
        b"AKVZ",  # bad magic, shorter than a prefix
        b"AKVB\x00\x02" + encode_block(LAYOUT, KEY, PAYLOAD)[6:],  # another format version
        b"AKVB\x00\x01\xff\xff\xff\xff" + bytes(100),  # absurd header length
        b"AKVB\x00\x01\x00\x00\x00\x04\xc1\xc1\xc1\xc1" + PAYLOAD,  # undecodable header
        encode_block(LAYOUT, KEY, PAYLOAD) + b"\x00",  # trailing byte
        encode_block(LAYOUT, KEY, PAYLOAD)[:-1] + b"\x00",  # payload changed: checksum
    ],
    ids=["magic", "short-magic", "version", "header-length", "header", "trailing", "checksum"],
)
def test_corrupt(data: bytes) -> None:
    assert _refusal(data) == RefusalReason.CORRUPT


def test_a_header_that_disagrees_with_itself_is_corrupt() -> None:
    _, header = _header_of(encode_block(LAYOUT, KEY, PAYLOAD))
    for changed in (
        msgspec.structs.replace(header, version=2),
        msgspec.structs.replace(header, payload_bytes=63),
    ):
        assert _refusal(_with_header(b"", changed)) == RefusalReason.CORRUPT


def test_a_block_of_another_layout_is_foreign() -> None:
    theirs = msgspec.structs.replace(LAYOUT, dtype="bfloat16")
    data = encode_block(theirs, KEY, PAYLOAD)
    with pytest.raises(BlockRefusedError) as refused:
        decode_block(data, LAYOUT, KEY.seq_hash)
    assert refused.value.reason == RefusalReason.FOREIGN_LAYOUT
    assert str(refused.value) == (
        f"KV block refused (foreign-layout): {layout_mismatch(LAYOUT, theirs)}"
    )
    assert "dtype bfloat16 != float16" in str(refused.value)


def test_a_block_of_another_sequence_hash_is_wrong_hash() -> None:
    data = encode_block(LAYOUT, KEY, PAYLOAD)
    assert _refusal(data, seq_hash=KEY.seq_hash + 1) == RefusalReason.WRONG_HASH


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=300), seq_hash=U64)
def test_arbitrary_bytes_are_refused(data: bytes, seq_hash: int) -> None:
    with pytest.raises(BlockRefusedError):
        decode_block(data, LAYOUT, seq_hash)


@settings(max_examples=500)
@given(
    cut=st.integers(min_value=0, max_value=400),
    flips=st.lists(st.integers(min_value=0, max_value=8 * 400 - 1), max_size=3),
    inserted=st.binary(max_size=4),
    insert_at=st.integers(min_value=0, max_value=400),
)
def test_damaged_blocks_are_refused_or_yield_the_original_payload(
    cut: int, flips: list[int], inserted: bytes, insert_at: int
) -> None:
    """Cuts, bit flips and inserted bytes: decode refuses, or (a flip the checksum does not
    cover, e.g. in the header's parent hash) returns exactly the stored payload."""
    data = bytearray(encode_block(LAYOUT, KEY, PAYLOAD))
    for bit in flips:
        if bit // 8 < len(data):
            data[bit // 8] ^= 1 << (bit % 8)
    data[insert_at:insert_at] = inserted
    damaged = bytes(data[:cut])
    try:
        payload = decode_block(damaged, LAYOUT, KEY.seq_hash)
    except BlockRefusedError as refused:
        assert refused.reason in set(RefusalReason)
    else:
        assert payload == PAYLOAD


def test_block_names_encode_the_key() -> None:
    assert block_name(BlockKey(0xAB, 0xCD, None)) == ("00000000000000ab-00000000000000cd-none.kvb")
    assert block_name(BlockKey((1 << 64) - 1, 0, 1)) == (
        "ffffffffffffffff-0000000000000000-0000000000000001.kvb"
    )


@given(seq=U64, local=U64, parent=st.none() | U64)
def test_block_names_round_trip(seq: int, local: int, parent: int | None) -> None:
    key = BlockKey(seq, local, parent)
    assert parse_block_name(block_name(key)) == key


@pytest.mark.parametrize(
    "name",
    [
        ".00000000000000ab-00000000000000cd-none.kvb.1a2b.tmp",
        "00000000000000ab-00000000000000cd-none.kvb.tmp",
        "00000000000000AB-00000000000000cd-none.kvb",
        "000000000000ab-00000000000000cd-none.kvb",
        "00000000000000ab-00000000000000cd.kvb",
        "notes.txt",
        "",
    ],
)
def test_other_names_are_not_blocks(name: str) -> None:
    assert parse_block_name(name) is None


def test_layout_namespace_is_the_safe_model_name_and_a_digest() -> None:
    namespace = layout_namespace("HuggingFaceTB/SmolLM2-135M-Instruct", LAYOUT, "060d5729f27813e4")
    assert namespace.startswith("HuggingFaceTB-SmolLM2-135M-Instruct-")
    assert len(namespace) == len("HuggingFaceTB-SmolLM2-135M-Instruct-") + 12


@pytest.mark.parametrize(
    ("model", "safe"),
    [
        ("../../etc/passwd", "etc-passwd"),
        ("./my-hf-dir", "my-hf-dir"),
        ("", "model"),
        ("...", "model"),
        ("a b:c*d?e", "a-b-c-d-e"),
        ("x" * 100, "x" * 64),
    ],
)
def test_layout_namespace_is_safe_for_paths_and_s3_keys(model: str, safe: str) -> None:
    namespace = layout_namespace(model, LAYOUT, "w")
    assert namespace[: -len("-0123456789ab")] == safe
    assert all(c.isalnum() or c in "._-" for c in namespace)
    assert not namespace.startswith((".", "-"))


def test_models_weights_and_layouts_never_share_a_namespace() -> None:
    other_layout = msgspec.structs.replace(LAYOUT, block_size=16)
    namespaces = {
        layout_namespace("org/model", LAYOUT, "w"),
        layout_namespace("org-model", LAYOUT, "w"),  # sanitizes like "org/model"
        layout_namespace("org/model", other_layout, "w"),
        layout_namespace("org/other", LAYOUT, "w"),
        layout_namespace("org/model", LAYOUT, "other weights"),  # a fine-tune of one name
    }
    assert len(namespaces) == 5
    assert layout_namespace("org/model", LAYOUT, "w") == layout_namespace("org/model", LAYOUT, "w")
