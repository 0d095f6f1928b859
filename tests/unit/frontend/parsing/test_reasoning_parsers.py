"""The reasoning parsers over model-shaped outputs: the exact split whole, the same split
streamed in random chunkings, and the reasoning tokens counted."""

from __future__ import annotations

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st
from parser_streams import chunked, stream_reasoning

from armature.frontend.parsing import REASONING_PARSERS
from armature.frontend.parsing.reasoning import ReasoningSplit

Case = tuple[str, ReasoningSplit]

QWEN3: list[Case] = [
    ("<think>\nLet me add.\n</think>\n\n4", ReasoningSplit("\nLet me add.\n", "4")),
    ("  <think>a</think>b", ReasoningSplit("a", "b")),
    ("4", ReasoningSplit(None, "4")),
    ("Answer: <think>late</think>", ReasoningSplit(None, "Answer: <think>late</think>")),
    ("<think>ran out of tok", ReasoningSplit("ran out of tok", "")),
    ("<think></think>", ReasoningSplit("", "")),
    ("<thin", ReasoningSplit(None, "<thin")),
    ("", ReasoningSplit(None, "")),
    ("<think>a</think>b</think>c", ReasoningSplit("a", "b</think>c")),
]

DEEPSEEK_R1: list[Case] = [
    ("Let me add.\n</think>\n\n4", ReasoningSplit("Let me add.\n", "4")),
    ("<think>tag kept by the model</think>ok", ReasoningSplit("tag kept by the model", "ok")),
    ("no end tag at all", ReasoningSplit("no end tag at all", "")),
    ("</think>straight answer", ReasoningSplit("", "straight answer")),
    ("<thi", ReasoningSplit("<thi", "")),
    (" \n", ReasoningSplit(" \n", "")),
]

CORPUS = {"qwen3": QWEN3, "deepseek_r1": DEEPSEEK_R1}
CASES = [(name, text, want) for name, cases in CORPUS.items() for text, want in cases]


def test_every_parser_has_a_corpus() -> None:
    assert set(CORPUS) == set(REASONING_PARSERS)


@pytest.mark.parametrize(("name", "text", "want"), CASES)
def test_whole_output(name: str, text: str, want: ReasoningSplit) -> None:
    assert REASONING_PARSERS[name].parse(text) == want


@seed(0)
@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(CASES).flatmap(lambda c: st.tuples(st.just(c), chunked(c[1]))),
)
def test_stream_in_random_chunks_equals_whole(
    case: tuple[tuple[str, str, ReasoningSplit], list[str]],
) -> None:
    (name, _text, want), chunks = case
    split, _ = stream_reasoning(REASONING_PARSERS[name], chunks)
    assert split == ReasoningSplit(want.reasoning or "", want.content)


@seed(0)
@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(REASONING_PARSERS)),
    st.lists(st.sampled_from(["<think>", "</think>", "<", "th", " ", "\n", "x", "é"]), max_size=8)
    .map("".join)
    .flatmap(lambda text: st.tuples(st.just(text), chunked(text))),
)
def test_stream_equals_whole_on_stitched_outputs(name: str, sample: tuple[str, list[str]]) -> None:
    text, chunks = sample
    whole = REASONING_PARSERS[name].parse(text)
    split, _ = stream_reasoning(REASONING_PARSERS[name], chunks)
    assert split == ReasoningSplit(whole.reasoning or "", whole.content)


def test_reasoning_tokens_are_the_deltas_up_to_the_close() -> None:
    # one token per delta: "<think>", "a", "b</think>" are reasoning; "\n", "c" are not
    chunks = ["<think>", "a", "b</think>", "\n", "c"]
    split, num = stream_reasoning(REASONING_PARSERS["qwen3"], chunks)
    assert split == ReasoningSplit("ab", "c")
    assert num == 3


def test_undecided_start_counts_once_decided() -> None:
    # " <", "thi" are undecided; "nk>x" decides: all three count, then "y" too
    split, num = stream_reasoning(REASONING_PARSERS["qwen3"], [" <", "thi", "nk>x", "y"])
    assert (split, num) == (ReasoningSplit("xy", ""), 4)
    # the same start that turns out to be content counts nothing
    split, num = stream_reasoning(REASONING_PARSERS["qwen3"], [" <", "thi", "s", "y"])
    assert (split, num) == (ReasoningSplit("", " <thisy"), 0)


def test_output_without_the_opening_tag_is_reasoning_until_the_close() -> None:
    split, num = stream_reasoning(REASONING_PARSERS["deepseek_r1"], ["a", "b", "</think>", "c"])
    assert (split, num) == (ReasoningSplit("ab", "c"), 3)
    split, num = stream_reasoning(REASONING_PARSERS["deepseek_r1"], ["<th", "i"])
    assert (split, num) == (ReasoningSplit("<thi", ""), 2)
