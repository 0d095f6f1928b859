"""Prompts encoded a segment at a time (`SegmentedEncoder`): exactly the tokenizer's ids for
the whole text, for any text and any cut length, cold or from kept segments; only for the
tokenizers whose split makes that exact."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, processors

from armature.frontend.preprocess import Preprocessor
from armature.frontend.prompt_encoder import SegmentedEncoder, _segments

pytestmark = pytest.mark.slow  # loads the default model's tokenizer

PIECES = [
    " ", "  ", "\n", "\n\n", "\t", " \n", "\r\n", "\u00a0", "\u3000", "\x1c", "\u200b",
    "'s", "'ll", "'", " '", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
    "word", " word", "Word", "42", " 3.14", "-", "!?", "é", "東京", "🤖", "naïve", "x_y",
]  # fmt: skip
TEXTS = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6)), max_size=60).map("".join)


@pytest.fixture(scope="module")
def backend(default_model_dir: Path) -> Any:
    return Preprocessor(default_model_dir).tokenizer.backend_tokenizer


def whole(backend: Any, text: str) -> list[int]:
    return list(backend.encode(text, add_special_tokens=False).ids)


def test_the_default_model_s_tokenizer_is_accepted_and_used(default_model_dir: Path) -> None:
    pre = Preprocessor(default_model_dir)
    assert SegmentedEncoder.accepts(pre.tokenizer.backend_tokenizer)
    assert pre.segmented is not None
    text = "You are a helpful assistant. " * 40
    assert (
        pre.encode(text)
        == pre.encode(text, add_special_tokens=False)
        == whole(pre.tokenizer.backend_tokenizer, text)
    )
    assert pre.segmented.num_misses > 1 and pre.segmented.num_hits > 0  # cut, and reused


@settings(max_examples=400, deadline=None)
@given(text=TEXTS, segment_chars=st.sampled_from([1, 2, 5, 16, 64]))
def test_any_text_cut_anywhere_encodes_as_the_whole(
    backend: Any, text: str, segment_chars: int
) -> None:
    encoder = SegmentedEncoder(backend, segment_chars=segment_chars)
    assert encoder.encode(text) == whole(backend, text)  # cold
    assert encoder.encode(text) == whole(backend, text)  # the segments kept
    segments = list(_segments(text, segment_chars))
    unkept = [s for s in segments if len(s) > 4 * segment_chars]  # no cut in them
    assert encoder.num_misses == len(segments) + len(unkept)


@settings(max_examples=100, deadline=None)
@given(shared=TEXTS, tails=st.lists(TEXTS, min_size=2, max_size=4))
def test_prompts_sharing_a_beginning_reuse_its_segments(
    backend: Any, shared: str, tails: list[str]
) -> None:
    encoder = SegmentedEncoder(backend, segment_chars=8, max_kept_chars=60)
    for tail in tails:
        assert encoder.encode(shared + tail) == whole(backend, shared + tail)
        kept = list(encoder._ids)
        assert sum(map(len, kept)) == encoder._num_kept_chars <= 60  # least recently used out
        assert all(len(segment) <= 32 for segment in kept)


def test_the_cuts_are_spaces_between_plain_characters() -> None:
    text = "alpha beta  gamma\tdelta é ü 東京 x"
    pieces = list(_segments(text, 1))
    assert "".join(pieces) == text
    assert pieces == ["alpha", " beta  gamma\tdelta", " é", " ü", " 東京", " x"]
    assert list(_segments("no-spaces-at-all" * 20, 4)) == ["no-spaces-at-all" * 20]
    assert list(_segments("", 4)) == [""]


def test_shared_between_threads(backend: Any) -> None:
    texts = [f"Shared system prompt number {i % 3}. " * 20 + f"question {i}" for i in range(40)]
    encoder = SegmentedEncoder(backend, segment_chars=32, max_kept_chars=400)
    results: dict[int, list[int]] = {}

    def run(offset: int) -> None:
        for i in range(offset, len(texts), 4):
            results[i] = encoder.encode(texts[i])

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {i: whole(backend, t) for i, t in enumerate(texts)}


def _bpe(**changes: Any) -> Tokenizer:
    """A small byte-level BPE like the default model's, with `changes` applied."""
    vocab = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    tokenizer = Tokenizer(models.BPE(vocab, [], dropout=changes.get("dropout")))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(
        add_prefix_space=changes.get("add_prefix_space", False),
        use_regex=changes.get("use_regex", True),
    )
    if "normalizer" in changes:
        tokenizer.normalizer = changes["normalizer"]
    if "post_processor" in changes:
        tokenizer.post_processor = changes["post_processor"]
    tokenizer.add_special_tokens([changes.get("added", AddedToken("<|end|>", special=True))])
    return tokenizer


@pytest.mark.parametrize(
    "changes",
    [
        {"normalizer": normalizers.NFKC()},
        {"add_prefix_space": True},
        {"use_regex": False},
        {"dropout": 0.1},
        {"added": AddedToken("<end>", rstrip=True)},
        {"added": AddedToken("<end>", lstrip=True)},
        {"added": AddedToken("two words")},
        {"added": AddedToken("<end>", single_word=True)},
        {
            "post_processor": processors.TemplateProcessing(
                single="<|end|> $A", special_tokens=[("<|end|>", 256)]
            )
        },
    ],
    ids=lambda c: next(iter(c)) + ":" + str(next(iter(c.values()))),
)
def test_tokenizers_whose_split_is_not_exact_are_refused(changes: dict[str, Any]) -> None:
    assert SegmentedEncoder.accepts(_bpe())
    assert not SegmentedEncoder.accepts(_bpe(**changes))


def test_a_metaspace_tokenizer_and_other_objects_are_refused() -> None:
    tokenizer = Tokenizer(models.BPE({"a": 0, "▁": 1}, []))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    assert not SegmentedEncoder.accepts(tokenizer)
    assert not SegmentedEncoder.accepts(object())
    with pytest.raises(ValueError):
        SegmentedEncoder(_bpe(), segment_chars=0)


def test_text_with_no_cut_is_encoded_but_not_kept(backend: Any) -> None:
    encoder = SegmentedEncoder(backend, segment_chars=8)
    text = "x" * 33 + " short tail"
    assert encoder.encode(text) == whole(backend, text)
    assert list(encoder._ids) == [" short tail"]  # the 33 characters without a cut: not kept
    assert encoder._num_kept_chars == len(" short tail")
