"""The C token synthesizer (`armature.workload._synth`) against its definition
(`traces._block_tokens_py`, numpy) and against SplitMix64 written out with Python ints, and the
fallback where the extension was not built."""

from __future__ import annotations

import array
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from armature.workload import traces
from armature.workload.traces import TraceRequest, synthesize_prompt, synthesize_prompt_ids
from without_extension import run_without

_synth = pytest.importorskip(
    "armature.workload._synth",
    reason="armature.workload._synth was not built (no C compiler at install): numpy synthesis",
)

MASK = (1 << 64) - 1


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _by_hand(seed: int, hash_id: int, low: int, span: int, num_tokens: int) -> list[int]:
    """SplitMix64 (Steele, Lea and Flood 2014) from mix64(mix64(seed) + hash_id), one int at a
    time: state += 0x9E3779B97F4A7C15, output mix64(state), reduced by multiply-shift."""
    state = _mix64((_mix64(seed & MASK) + hash_id) & MASK)
    tokens = []
    for _ in range(num_tokens):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        tokens.append(low + (((_mix64(state) >> 32) * span) >> 32))
    return tokens


@given(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=0, max_value=10**30),
    st.integers(min_value=0, max_value=1000),
    st.integers(min_value=1, max_value=2**32 - 1),
    st.integers(min_value=0, max_value=700),
)
def test_native_block_tokens_equal_the_definition(
    seed: int, hash_id: int, low: int, span: int, num_tokens: int
) -> None:
    native = _synth.prompt_tokens(seed, [hash_id], num_tokens, max(num_tokens, 1), low, span)
    assert native == traces._block_tokens_py(seed, hash_id, low, span, num_tokens)
    assert native == _by_hand(seed, hash_id, low, span, num_tokens)


@given(
    st.integers(min_value=0, max_value=2**64 - 1),
    st.lists(st.integers(min_value=0, max_value=2**64 - 1), min_size=1, max_size=6),
    st.integers(min_value=1, max_value=40),
    st.data(),
)
def test_a_prompt_is_its_blocks_in_order_cut_to_its_length(
    seed: int, hash_ids: list[int], block_tokens: int, data: st.DataObject
) -> None:
    num_tokens = data.draw(st.integers(min_value=0, max_value=len(hash_ids) * block_tokens))
    expected: list[int] = []
    for hash_id in hash_ids:
        expected += _by_hand(seed, hash_id, 3, 50, block_tokens)
    got = _synth.prompt_tokens(seed, tuple(hash_ids), num_tokens, block_tokens, 3, 50)
    assert got == expected[:num_tokens]


@given(
    st.integers(min_value=0, max_value=2**64 - 1),
    st.lists(st.integers(min_value=0, max_value=2**64 - 1), min_size=1, max_size=4),
    st.integers(min_value=1, max_value=2000),
    st.integers(min_value=2, max_value=2**32 - 1),
    st.data(),
)
def test_prompt_ids_are_the_prompts_tokens_as_u32(
    seed: int, hash_ids: list[int], input_length: int, vocab_size: int, data: st.DataObject
) -> None:
    """`synthesize_prompt_ids` (array('I'), no int objects) holds exactly
    `synthesize_prompt`'s tokens, whatever the vocabulary (shared ints or not)."""
    min_token_id = data.draw(st.integers(min_value=0, max_value=vocab_size - 1))
    request = TraceRequest(0.0, input_length, 1, tuple(hash_ids) * 4)
    kwargs = {"vocab_size": vocab_size, "seed": seed, "min_token_id": min_token_id}
    ids = synthesize_prompt_ids(request, trace_block_tokens=512, **kwargs)
    assert ids.typecode == "I"
    assert ids.tolist() == synthesize_prompt(request, trace_block_tokens=512, **kwargs)


@given(
    st.integers(min_value=0, max_value=2**64 - 1),
    st.lists(st.integers(min_value=0, max_value=2**64 - 1), min_size=1, max_size=5),
    st.integers(min_value=1, max_value=70),
    st.integers(min_value=0, max_value=2**31),
    st.data(),
)
def test_ids_into_a_buffer_are_the_listed_tokens_for_any_block_and_range(
    seed: int, hash_ids: list[int], block_tokens: int, low: int, data: st.DataObject
) -> None:
    """The u32 path (a block's tokens computed lane by lane, with whatever vector unit the
    CPU has) writes `prompt_tokens`' ids (one token after another) for every block length,
    a cut last block and ranges up to 2**32."""
    span = data.draw(st.integers(min_value=1, max_value=min(2**32 - 1, 2**32 - low)))
    num_tokens = data.draw(st.integers(min_value=0, max_value=len(hash_ids) * block_tokens))
    out = array.array("I", [0]) * num_tokens
    _synth.prompt_token_ids_into(out, seed, hash_ids, num_tokens, block_tokens, low, span)
    assert out.tolist() == _synth.prompt_tokens(
        seed, tuple(hash_ids), num_tokens, block_tokens, low, span
    )


def test_prompt_ids_refuse_what_the_prompt_refuses_and_ids_over_32_bits() -> None:
    request = TraceRequest(0.0, 600, 1, (1, 2))
    for vocab_size, min_token_id in [(2**32, 0), (2**33, 2**33 - 5), (10, 10)]:
        with pytest.raises(ValueError):
            synthesize_prompt_ids(request, vocab_size=vocab_size, min_token_id=min_token_id)
    with pytest.raises(ValueError, match="id range"):
        synthesize_prompt(request, vocab_size=2**32)
    ids = synthesize_prompt_ids(request, vocab_size=2**32, min_token_id=1)  # ids up to 2**32-1
    assert ids.tolist() == synthesize_prompt(request, vocab_size=2**32, min_token_id=1)


def test_prompt_ids_into_refuses_what_is_not_its_buffer() -> None:
    args = (0, [1], 4, 4, 0, 10)
    for out in (array.array("I", [0]) * 3, array.array("i", [0]) * 4, bytearray(16), b"\0" * 16):
        with pytest.raises((ValueError, BufferError)):  # short, signed, bytes, read-only
            _synth.prompt_token_ids_into(out, *args)
    for low, span in [(10, 2**32), (0, 2**32), (2**32 - 5, 10), (2**62, 2**31)]:
        with pytest.raises(ValueError, match="below 2"):
            _synth.prompt_token_ids_into(array.array("I", [0]) * 4, 0, [1], 4, 4, low, span)
    with pytest.raises(ValueError, match="too few hash_ids"):
        _synth.prompt_token_ids_into(array.array("I", [0]) * 5, 0, [1], 5, 4, 0, 10)
    out = array.array("I", [0]) * 4
    assert _synth.prompt_token_ids_into(out, *args) is None
    assert out.tolist() == _synth.prompt_tokens(*args)


def test_bad_arguments_are_refused() -> None:
    for args in [(0, [1], -1, 4, 0, 10), (0, [1], 4, 0, 0, 10), (0, [1], 4, 4, 0, 0)]:
        with pytest.raises(ValueError, match="required"):
            _synth.prompt_tokens(*args)
    for low, span in [(0, 2**32), (-1, 10), (0, -5)]:
        with pytest.raises(ValueError, match="required"):
            _synth.prompt_tokens(0, [1], 4, 4, low, span)
    with pytest.raises(OverflowError):  # not taken mod 2**64 into a small span
        _synth.prompt_tokens(0, [1], 4, 4, 0, 2**64 + 5)
    with pytest.raises(ValueError, match="too few hash_ids"):
        _synth.prompt_tokens(0, [1], 5, 4, 0, 10)
    with pytest.raises(TypeError, match="ints"):
        _synth.prompt_tokens(0, [1, "x"], 5, 4, 0, 10)
    with pytest.raises(TypeError, match="seed"):
        _synth.prompt_tokens(0.5, [1], 4, 4, 0, 10)
    with pytest.raises(TypeError, match="sequence"):
        _synth.prompt_tokens(0, 1, 4, 4, 0, 10)


def test_tokens_can_be_the_given_ints_themselves() -> None:
    table = tuple(range(7, 1007))
    shared = _synth.prompt_tokens(4, [2, 3], 600, 512, 7, 1000, table)
    assert shared == _synth.prompt_tokens(4, [2, 3], 600, 512, 7, 1000)
    assert all(token is table[token - 7] for token in shared)
    with pytest.raises(ValueError, match="span ints"):
        _synth.prompt_tokens(4, [2], 4, 4, 7, 1000, table[:-1])
    with pytest.raises(TypeError):
        _synth.prompt_tokens(4, [2], 4, 4, 7, 1000, list(table))


def test_synthesized_prompts_share_their_token_ints() -> None:
    first = synthesize_prompt(TraceRequest(0.0, 700, 1, (3, 9)), vocab_size=32000, seed=5)
    second = synthesize_prompt(TraceRequest(0.0, 900, 1, (4, 9)), vocab_size=32000, seed=5)
    ints = traces._shared_ints(0, 32000)
    assert all(token is ints[token] for token in first + second)


def test_a_vocabulary_too_big_to_share_makes_its_own_ints() -> None:
    request = TraceRequest(0.0, 600, 1, (1, 2))
    tokens = synthesize_prompt(request, vocab_size=(1 << 21) + 10, min_token_id=10)
    assert tokens == _by_hand(0, 1, 10, 1 << 21, 512) + _by_hand(0, 2, 10, 1 << 21, 88)


_WITHOUT_NATIVE = """
import json
from armature.workload import traces
from armature.workload.traces import TraceRequest, synthesize_prompt
print(json.dumps({
    "native": traces._synth is not None,
    "tokens": synthesize_prompt(TraceRequest(0.0, 700, 1, (3, 9)), vocab_size=32000, seed=5),
    "ids": traces.synthesize_prompt_ids(
        TraceRequest(0.0, 700, 1, (3, 9)), vocab_size=32000, seed=5
    ).tolist(),
}))
"""


def test_an_install_without_the_extension_synthesizes_the_same_tokens() -> None:
    out = json.loads(run_without("armature.workload._synth", _WITHOUT_NATIVE))
    request = TraceRequest(0.0, 700, 1, (3, 9))
    tokens = synthesize_prompt(request, vocab_size=32000, seed=5)
    assert out == {"native": False, "tokens": tokens, "ids": tokens}
