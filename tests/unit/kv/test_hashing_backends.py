"""Both hashing backends, chosen explicitly: the pure-Python fallback runs here even where the
native extension was built, and gives the DESIGN §3 conformance vector and the same hashes and
errors as the native path. Native cases skip (with the reason) where it was not built."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from types import FrameType

import pytest

from armature.kv.hashing import (
    HashBackend,
    HashBackendUnavailableError,
    compute_block_hashes,
    compute_local_hashes,
    compute_seq_hashes,
    has_native_hashing,
)
from without_extension import run_without

CONFORMANCE_TOKENS = list(range(100, 148))
CONFORMANCE_LOCAL = [10823191264391160519, 1219978239041041138, 11579058346470406089]
NOT_BUILT = "armature.kv._native was not built (no C compiler at install)"


def require(backend: HashBackend) -> HashBackend:
    if backend is HashBackend.NATIVE and not has_native_hashing():
        pytest.skip(NOT_BUILT)
    return backend


def functions_run(fn: Callable[[], object]) -> set[str]:
    """`module.name` of every Python and C function `fn` ran (seen by a profiler, no patching)."""
    seen: set[str] = set()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            seen.add(f"{frame.f_globals.get('__name__')}.{frame.f_code.co_name}")
        elif event == "c_call":
            seen.add(f"{getattr(arg, '__module__', None)}.{getattr(arg, '__name__', None)}")

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def test_has_native_hashing_says_whether_the_extension_imports() -> None:
    assert has_native_hashing() == (importlib.util.find_spec("armature.kv._native") is not None)


@pytest.mark.parametrize("hash_fn", [compute_block_hashes, compute_seq_hashes])
def test_the_python_backend_never_calls_the_extension(hash_fn: Callable[..., object]) -> None:
    ran = functions_run(lambda: hash_fn(CONFORMANCE_TOKENS, 16, backend=HashBackend.PYTHON))
    assert "armature.kv.hashing.compute_block_hashes_py" in ran
    assert "armature.kv._native.hash_blocks" not in ran
    default = functions_run(lambda: hash_fn(CONFORMANCE_TOKENS, 16))
    if has_native_hashing():
        assert "armature.kv._native.hash_blocks" in default
        assert "armature.kv.hashing.compute_block_hashes_py" not in default
        native = functions_run(lambda: hash_fn(CONFORMANCE_TOKENS, 16, backend=HashBackend.NATIVE))
        assert native == default
    else:
        assert "armature.kv.hashing.compute_block_hashes_py" in default


@pytest.mark.parametrize("backend", list(HashBackend))
def test_conformance_vector(backend: HashBackend) -> None:
    pairs = compute_block_hashes(CONFORMANCE_TOKENS, 16, backend=require(backend))
    assert [local for _, local in pairs] == CONFORMANCE_LOCAL
    assert [s for s, _ in pairs] == compute_seq_hashes(CONFORMANCE_TOKENS, 16, backend=backend)
    assert pairs[0][0] == CONFORMANCE_LOCAL[0]
    assert pairs == compute_block_hashes(CONFORMANCE_TOKENS, 16)  # the default backend


@pytest.mark.parametrize("backend", list(HashBackend))
def test_a_4096_token_prompt_hashes_alike(backend: HashBackend) -> None:
    tokens = [(i * 2654435761) % 2**32 for i in range(4096 + 7)]
    pairs = compute_block_hashes(tokens, 16, 42, 7, backend=require(backend))
    assert len(pairs) == 256
    assert [local for _, local in pairs] == compute_local_hashes(tokens, 16, 42)
    assert pairs == compute_block_hashes(tokens, 16, 42, 7, backend=HashBackend.PYTHON)


@pytest.mark.parametrize("backend", list(HashBackend))
@pytest.mark.parametrize("start", [0, 1, 16, 37, 4096, 4103])
def test_start_hashes_the_tokens_from_there_as_a_slice_would(
    backend: HashBackend, start: int
) -> None:
    tokens = [(i * 2654435761) % 2**32 for i in range(4096 + 7)]
    pairs = compute_block_hashes(tokens, 16, 42, 7, start=start, backend=require(backend))
    assert pairs == compute_block_hashes(tokens[start:], 16, 42, 7, backend=HashBackend.PYTHON)
    assert len(pairs) == (len(tokens) - start) // 16


@pytest.mark.parametrize("backend", list(HashBackend))
@pytest.mark.parametrize("start", [-1, 4104])
def test_a_start_outside_the_tokens_is_refused(backend: HashBackend, start: int) -> None:
    tokens = list(range(4103))
    with pytest.raises(ValueError, match=r"start must be in \[0, 4103\]"):
        compute_block_hashes(tokens, 16, start=start, backend=require(backend))


@pytest.mark.parametrize("backend", list(HashBackend))
def test_bad_input_raises_the_same_errors(backend: HashBackend) -> None:
    require(backend)
    for bad in ([2**32], [-1], ["a"], [1.0]):
        with pytest.raises(ValueError, match="unsigned 32-bit"):
            compute_seq_hashes(bad, 1, backend=backend)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_size must be positive"):
        compute_seq_hashes([1, 2], 0, backend=backend)
    with pytest.raises(TypeError):
        compute_seq_hashes(5, 1, backend=backend)  # type: ignore[arg-type]
    # A partial block is never read, so its contents are never validated either.
    assert compute_seq_hashes([1, 2**40], 4, backend=backend) == []


def test_asking_for_native_where_it_was_not_built_raises() -> None:
    if has_native_hashing():
        pytest.skip("the extension is built here; the subprocess test covers the other case")
    with pytest.raises(HashBackendUnavailableError, match="not built"):
        compute_block_hashes(CONFORMANCE_TOKENS, 16, backend=HashBackend.NATIVE)


_WITHOUT_NATIVE = """
import json
from armature.kv import hashing
try:
    hashing.compute_seq_hashes([1, 2, 3, 4], 4, backend=hashing.HashBackend.NATIVE)
    refused = False
except hashing.HashBackendUnavailableError:
    refused = True
print(json.dumps({
    "native": hashing.has_native_hashing(),
    "pairs": hashing.compute_block_hashes(list(range(100, 148)), 16),
    "seqs": hashing.compute_seq_hashes(list(range(100, 148)), 16),
    "refused": refused,
    "range": hashing.get_token_id_range([5, 2, 9]),
}))
"""


def test_an_install_without_the_extension_falls_back_to_python() -> None:
    """The import fallback itself, in a fresh interpreter where the extension cannot load."""
    out = json.loads(run_without("armature.kv._native", _WITHOUT_NATIVE))
    expected = compute_block_hashes(CONFORMANCE_TOKENS, 16, backend=HashBackend.PYTHON)
    assert out == {
        "native": False,
        "pairs": [list(p) for p in expected],
        "seqs": [s for s, _ in expected],
        "refused": True,
        "range": [2, 9],
    }
    assert [local for _, local in out["pairs"]] == CONFORMANCE_LOCAL
