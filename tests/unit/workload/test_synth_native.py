"""The C token synthesizer (`armature.workload._mt`) against its definition through
`random.Random`, and the fallback where the extension was not built."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from armature.workload import traces
from armature.workload.traces import TraceRequest, synthesize_prompt
from without_extension import run_without

_mt = pytest.importorskip(
    "armature.workload._mt",
    reason="armature.workload._mt was not built (no C compiler at install): Python synthesis",
)


@given(
    st.integers(min_value=0, max_value=2**40),
    st.integers(min_value=0, max_value=10**30),
    st.integers(min_value=0, max_value=1000),
    st.integers(min_value=1, max_value=2**31),
    st.integers(min_value=0, max_value=700),
)
def test_native_block_tokens_equal_the_random_module(
    seed: int, hash_id: int, low: int, span: int, num_tokens: int
) -> None:
    native = traces._block_token_ids.__wrapped__(seed, hash_id, low, low + span, num_tokens)
    python = traces._block_token_ids_py(seed, hash_id, low, low + span, num_tokens)
    assert native == python
    assert len(native) == num_tokens


@pytest.mark.parametrize("seed", ["", "0:0", "x" * 2000, "é:1"])
def test_the_key_seeds_mt19937_as_random_does(seed: str) -> None:
    # the raw 32-bit outputs (span 2**32 - 1 would fold one value; compare words directly)
    words = np.frombuffer(random.Random(seed).randbytes(4 * 1300), dtype="<u4").tolist()
    # 1300 outputs cross two twists of the 624-word state
    got = _mt.block_tokens(traces._mt_key(seed), 1300, 0, 2**32 - 1)
    assert list(got) == [w % (2**32 - 1) for w in words]


def test_bad_arguments_are_refused() -> None:
    key = traces._mt_key("0:1")
    for args in [(b"", 4, 0, 10), (b"abc", 4, 0, 10), (key, -1, 0, 10), (key, 4, 0, 0)]:
        with pytest.raises(ValueError, match="u32 words"):
            _mt.block_tokens(*args)
    with pytest.raises((ValueError, OverflowError)):
        _mt.block_tokens(key, 4, 0, 2**32)


def test_tokens_can_be_the_given_ints_themselves() -> None:
    key = traces._mt_key("4:2")
    table = tuple(range(7, 1007))
    shared = _mt.block_tokens(key, 600, 7, 1000, table)
    assert shared == _mt.block_tokens(key, 600, 7, 1000)
    assert all(token is table[token - 7] for token in shared)
    with pytest.raises(ValueError, match="span ints"):
        _mt.block_tokens(key, 4, 7, 1000, table[:-1])
    with pytest.raises(TypeError):
        _mt.block_tokens(key, 4, 7, 1000, list(table))


def test_synthesized_prompts_share_their_token_ints() -> None:
    first = synthesize_prompt(TraceRequest(0.0, 700, 1, (3, 9)), vocab_size=32000, seed=5)
    second = synthesize_prompt(TraceRequest(0.0, 900, 1, (4, 9)), vocab_size=32000, seed=5)
    ints = traces._shared_ints(0, 32000)
    assert all(token is ints[token] for token in first + second)


_WITHOUT_NATIVE = """
import json
from armature.workload import traces
from armature.workload.traces import TraceRequest, synthesize_prompt
print(json.dumps({
    "native": traces._mt is not None,
    "tokens": synthesize_prompt(TraceRequest(0.0, 700, 1, (3, 9)), vocab_size=32000, seed=5),
}))
"""


def test_an_install_without_the_extension_synthesizes_the_same_tokens() -> None:
    out = json.loads(run_without("armature.workload._mt", _WITHOUT_NATIVE))
    request = TraceRequest(0.0, 700, 1, (3, 9))
    assert out == {
        "native": False,
        "tokens": synthesize_prompt(request, vocab_size=32000, seed=5),
    }
