"""Incremental detokenizer: exact deltas, multi-byte characters, stop strings, min_tokens,
and property tests against the whole-output decode (the oracle)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from armature.frontend.detokenizer import (
    NUM_CONTEXT_TOKENS,
    DetokenizerUpdate,
    IncrementalDetokenizer,
)

# default_model_dir may convert the real default model on first use (tests/conftest.py).
pytestmark = pytest.mark.slow

# SmolLM2 (byte-level BPE) ids, pinned so the exact-delta tests show what they feed.
CHAT_PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
HELLO = "Hello world! How are you?"  # 'Hello' ' world' '!' ' How' ' are' ' you' '?'
HELLO_IDS = [19556, 905, 17, 1073, 359, 346, 47]
PARIS_IDS = [504, 3575, 282, 4649, 314, 7042, 30]  # 'The' ' capital' ' of' ' France' ...
IM_END_ID = 2  # <|im_end|>, a special token

# Strings whose tokens split UTF-8 characters (CJK, emoji, accents, combining marks).
MULTIBYTE_TEXTS = [
    "héllo 你好 🎉",
    " 🎉🎉",
    "你好世界",
    "Café au lait",
    "naïve e\u0301",
    "\U0001f469\u200d\U0001f469\u200d\U0001f467 ок",
]


@functools.cache
def _load_tokenizer(path: str) -> Tokenizer:
    return Tokenizer.from_file(path)


@pytest.fixture
def tokenizer(default_model_dir: Path) -> Tokenizer:
    return _load_tokenizer(str(default_model_dir / "tokenizer.json"))


@pytest.fixture
def prompt_ids(tokenizer: Tokenizer) -> list[int]:
    return tokenizer.encode(CHAT_PROMPT).ids


def _encode(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def _feed_one_at_a_time(detok: IncrementalDetokenizer, ids: Sequence[int]) -> list[str]:
    deltas = []
    for token_id in ids:
        update = detok.update([token_id])
        assert update.stop_reason is None
        deltas.append(update.text_delta)
    return deltas


# ---- decoding ------------------------------------------------------------------------------


def test_ids_are_the_pinned_ones(tokenizer: Tokenizer) -> None:
    assert _encode(tokenizer, HELLO) == HELLO_IDS
    assert _encode(tokenizer, "The capital of France is Paris.") == PARIS_IDS


def test_exact_deltas_one_token_at_a_time(tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
    detok = IncrementalDetokenizer(tokenizer, prompt_ids)

    deltas = _feed_one_at_a_time(detok, HELLO_IDS)

    assert deltas == ["Hello", " world", "!", " How", " are", " you", "?"]
    assert detok.flush() == ""
    assert detok.output_text == HELLO
    assert detok.num_output_tokens == 7
    assert detok.stop_reason is None


def test_batched_update_gives_the_same_text(tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
    detok = IncrementalDetokenizer(tokenizer, prompt_ids)

    assert detok.update(HELLO_IDS[:3]) == DetokenizerUpdate("Hello world!", None)
    assert detok.update([]) == DetokenizerUpdate("", None)
    assert detok.update(HELLO_IDS[3:]) == DetokenizerUpdate(" How are you?", None)
    assert detok.num_output_tokens == 7


def test_multibyte_characters_are_held_until_complete(
    tokenizer: Tokenizer, prompt_ids: list[int]
) -> None:
    ids = _encode(tokenizer, "héllo 你好 🎉")
    # 'h' 'Ã©' 'llo' 'Ġ' 'ä½' 'ł' 'å¥' '½' 'ĠðŁ' 'İ' 'ī': 你, 好 and 🎉 span 2-3 tokens.
    assert ids == [88, 2756, 31394, 216, 18645, 250, 48392, 138, 15107, 232, 227]
    detok = IncrementalDetokenizer(tokenizer, prompt_ids)

    deltas = _feed_one_at_a_time(detok, ids)

    assert deltas == ["h", "é", "llo", " ", "", "你", "", "好", "", "", " 🎉"]
    assert detok.flush() == ""
    assert detok.output_text == "héllo 你好 🎉"


def test_flush_returns_an_incomplete_character_as_the_decoder_does(tokenizer: Tokenizer) -> None:
    ids = [15107, 232]  # ' ' + the first 3 bytes of 🎉
    detok = IncrementalDetokenizer(tokenizer, [])

    assert detok.update(ids) == DetokenizerUpdate("", None)
    assert detok.flush() == tokenizer.decode(ids) == " \ufffd"
    assert detok.flush() == ""  # idempotent


def test_prompt_ending_inside_a_character_is_not_completed_by_the_output(
    tokenizer: Tokenizer,
) -> None:
    prompt, output = [18645], [250]  # 你 split across prompt and output
    detok = IncrementalDetokenizer(tokenizer, prompt)

    text = detok.update(output).text_delta + detok.flush()

    assert text == tokenizer.decode(output) == "\ufffd"


def test_skip_special_tokens(tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
    skipping = IncrementalDetokenizer(tokenizer, prompt_ids)
    keeping = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens=False)

    assert skipping.update([19556, IM_END_ID]).text_delta + skipping.flush() == "Hello"
    assert keeping.update([19556, IM_END_ID]).text_delta + keeping.flush() == "Hello<|im_end|>"


class _RecordingDecoder:
    """The real tokenizer, recording how many ids each decode call got."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.num_ids_per_call: list[int] = []

    def decode(self, token_ids: list[int], /, skip_special_tokens: bool = True) -> str:
        self.num_ids_per_call.append(len(token_ids))
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)


def test_each_step_decodes_a_small_window(tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
    ids = _encode(tokenizer, "héllo 你好 🎉 Hello world! " * 40)
    decoder = _RecordingDecoder(tokenizer)
    detok = IncrementalDetokenizer(decoder, prompt_ids)

    text = "".join(_feed_one_at_a_time(detok, ids)) + detok.flush()

    assert text == tokenizer.decode(ids)
    # 5 prompt tokens + the first output token; later windows hold the tokens of the last
    # emitted delta and of the next one: at most 'å¥' '½' (好) + 'ĠðŁ' 'İ' 'ī' ( 🎉).
    assert max(decoder.num_ids_per_call) == NUM_CONTEXT_TOKENS + 1
    assert max(decoder.num_ids_per_call[2:]) == 5


@pytest.mark.parametrize("text", [*MULTIBYTE_TEXTS, HELLO + " <|im_end|> after"])
@pytest.mark.parametrize("prompt_tail", [[], [IM_END_ID], "prompt"])
def test_rust_decode_stream_matches_the_python_window(
    tokenizer: Tokenizer, prompt_ids: list[int], text: str, prompt_tail: list[int] | str
) -> None:
    """A `tokenizers.Tokenizer` decodes through the library's DecodeStream, any other decoder
    through the Python window: the same deltas, flush and stops, token by token."""
    prompt = prompt_ids if prompt_tail == "prompt" else list(prompt_tail)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    outs = []
    for decoder in (tokenizer, _RecordingDecoder(tokenizer)):
        for skip in (True, False):
            detok = IncrementalDetokenizer(
                decoder, prompt, stop=["ll", "\u4e16"], skip_special_tokens=skip
            )
            deltas = []
            for token_id in ids[:-1]:
                deltas.append(detok.update([token_id]))
                if detok.stop_reason is not None:
                    break
            outs.append((deltas, detok.flush(), detok.stop_reason))
    assert outs[0] == outs[2] and outs[1] == outs[3]


def test_transformers_tokenizer_satisfies_the_protocol(
    default_model_dir: Path, prompt_ids: list[int]
) -> None:
    transformers = pytest.importorskip("transformers")
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(default_model_dir)
    ids = hf_tokenizer.encode("héllo 你好 🎉", add_special_tokens=False)
    detok = IncrementalDetokenizer(hf_tokenizer, prompt_ids)

    deltas = _feed_one_at_a_time(detok, ids)

    assert deltas == ["h", "é", "llo", " ", "", "你", "", "好", "", "", " 🎉"]
    assert detok.flush() == ""


# ---- stop strings --------------------------------------------------------------------------


def test_stop_string_inside_one_token(tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["api"])

    assert detok.update(PARIS_IDS[:1]) == DetokenizerUpdate("The", None)
    assert detok.update(PARIS_IDS[1:2]) == DetokenizerUpdate(" c", "api")  # ' capital'
    assert detok.output_text == "The c"
    assert detok.stop_reason == "api"
    assert detok.flush() == ""
    with pytest.raises(RuntimeError):
        detok.update(PARIS_IDS[2:3])


def test_stop_string_spanning_tokens_is_held_back(
    tokenizer: Tokenizer, prompt_ids: list[int]
) -> None:
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["world! How"])

    updates = [detok.update([t]) for t in HELLO_IDS[:4]]

    assert updates == [
        DetokenizerUpdate("Hello", None),
        DetokenizerUpdate(" ", None),  # 'world' could start the stop string
        DetokenizerUpdate("", None),  # 'world!' still could
        DetokenizerUpdate("", "world! How"),
    ]
    assert detok.output_text == "Hello "


def test_held_text_is_released_when_it_cannot_start_a_stop(
    tokenizer: Tokenizer, prompt_ids: list[int]
) -> None:
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["world peace", "you?!"])

    deltas = _feed_one_at_a_time(detok, HELLO_IDS)

    # 'w' of ' How' could start 'world peace' too.
    assert deltas == ["Hello", " ", "world!", " Ho", "w are", " ", ""]
    assert detok.flush() == "you?"  # end of generation: the held prefix was not a stop
    assert detok.output_text == HELLO
    assert detok.stop_reason is None


def test_stop_string_at_the_very_start(tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["Hell"])

    assert detok.update(HELLO_IDS[:1]) == DetokenizerUpdate("", "Hell")
    assert detok.output_text == ""
    assert detok.flush() == ""


def test_stop_string_in_a_batch_drops_the_text_after_it(
    tokenizer: Tokenizer, prompt_ids: list[int]
) -> None:
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["!"])

    assert detok.update(HELLO_IDS) == DetokenizerUpdate("Hello world", "!")
    assert detok.num_output_tokens == 7


def test_the_match_that_ends_first_wins(tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
    # 'How are' starts first but 'world' ends first; of 'o w' and 'lo w' (same end) the
    # earlier start wins, so the output never contains a stop string.
    first_end = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["o! How are", "world"])
    same_end = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["o w", "lo w"])

    assert first_end.update(HELLO_IDS) == DetokenizerUpdate("Hello ", "world")
    assert same_end.update(HELLO_IDS) == DetokenizerUpdate("Hel", "lo w")


def test_min_tokens_text_cannot_trigger_a_stop(tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
    ids = _encode(tokenizer, "Hello world! Hello world!")  # 'Hello' ' world' '!' ' Hello' ...
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["Hello"], min_tokens=1)

    assert detok.update(ids[:1]) == DetokenizerUpdate("Hello", None)
    assert detok.update(ids[1:3]) == DetokenizerUpdate(" world!", None)
    assert detok.update(ids[3:4]) == DetokenizerUpdate(" ", "Hello")
    assert detok.output_text == "Hello world! "


def test_min_tokens_stop_may_start_in_min_tokens_text(
    tokenizer: Tokenizer, prompt_ids: list[int]
) -> None:
    # As vLLM: only where a match ends counts, so 'Hello world' ending in token 2 matches.
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["Hello world"], min_tokens=1)

    assert detok.update(HELLO_IDS[:1]) == DetokenizerUpdate("", None)
    assert detok.update(HELLO_IDS[1:2]) == DetokenizerUpdate("", "Hello world")


def test_min_tokens_covers_the_whole_output(tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["you?"], min_tokens=7)

    assert "".join(_feed_one_at_a_time(detok, HELLO_IDS)) + detok.flush() == HELLO


def test_invalid_arguments(tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError):
        IncrementalDetokenizer(tokenizer, [], stop=[""])
    with pytest.raises(ValueError):
        IncrementalDetokenizer(tokenizer, [], min_tokens=-1)


# ---- properties against the whole-output decode --------------------------------------------

texts = st.one_of(
    st.sampled_from(MULTIBYTE_TEXTS),
    st.text(st.sampled_from([*"ab !\n", "é", "你", "🎉", "\u0301"]), max_size=20),
    st.text(st.characters(codec="utf-8"), max_size=20),
)
_property_settings = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@st.composite
def token_ids(draw: st.DrawFn, tokenizer: Tokenizer) -> list[int]:
    """Random vocab ids (special tokens and broken UTF-8 included) or encoded text, mixed."""
    random_ids = st.lists(st.integers(0, tokenizer.get_vocab_size() - 1), max_size=12)
    encoded = texts.map(lambda text: _encode(tokenizer, text))
    parts = draw(st.lists(st.one_of(random_ids, encoded), max_size=4))
    return [t for part in parts for t in part]


@st.composite
def chunked(draw: st.DrawFn, ids: list[int]) -> list[list[int]]:
    """`ids` split into update() batches of 1-3 tokens, with some empty batches between."""
    chunks: list[list[int]] = []
    i = 0
    while i < len(ids):
        if draw(st.booleans()):
            chunks.append([])
        n = draw(st.integers(1, 3))
        chunks.append(ids[i : i + n])
        i += n
    return chunks


def _run(detok: IncrementalDetokenizer, chunks: list[list[int]]) -> tuple[str, str | None]:
    text = ""
    for chunk in chunks:
        update = detok.update(chunk)
        text += update.text_delta
        if update.stop_reason is not None:
            return text, update.stop_reason
    return text + detok.flush(), detok.stop_reason


@_property_settings
@given(data=st.data())
def test_deltas_concatenate_to_the_full_decode(tokenizer: Tokenizer, data: st.DataObject) -> None:
    prompt = data.draw(token_ids(tokenizer), label="prompt")
    output = data.draw(token_ids(tokenizer), label="output")
    skip_special_tokens = data.draw(st.booleans(), label="skip_special_tokens")
    detok = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=skip_special_tokens)

    text, stop_reason = _run(detok, data.draw(chunked(output), label="chunks"))

    assert text == tokenizer.decode(output, skip_special_tokens=skip_special_tokens)
    assert stop_reason is None
    assert detok.output_text == text
    assert detok.num_output_tokens == len(output)


@_property_settings
@given(text=texts, data=st.data())
def test_valid_text_never_streams_a_partial_character(
    tokenizer: Tokenizer, text: str, data: st.DataObject
) -> None:
    ids = _encode(tokenizer, text)
    assume(tokenizer.decode(ids) == text)  # the vocab lacks a few bytes (e.g. 0xF1)
    assume("\ufffd" not in text)  # a literal U+FFFD at the end is held as if incomplete
    detok = IncrementalDetokenizer(tokenizer, _encode(tokenizer, CHAT_PROMPT))

    for chunk in data.draw(chunked(ids), label="chunks"):
        assert "\ufffd" not in detok.update(chunk).text_delta
    assert detok.flush() == ""
    assert detok.output_text == tokenizer.decode(ids)


def _oracle(text: str, stop: list[str], num_unstoppable_chars: int) -> tuple[str, str | None]:
    """Naive: try every end position in order; the first where a stop string ends wins,
    the longest stop string if several end there."""
    for end in range(num_unstoppable_chars + 1, len(text) + 1):
        ending_here = [s for s in stop if text[:end].endswith(s)]
        if ending_here:
            s = max(ending_here, key=len)
            return text[: end - len(s)], s
    return text, None


@_property_settings
@given(data=st.data())
def test_stop_strings_match_the_naive_oracle(tokenizer: Tokenizer, data: st.DataObject) -> None:
    output = data.draw(token_ids(tokenizer), label="output")
    full_text = tokenizer.decode(output)
    # Stop strings: mostly pieces of the output (so they match), some arbitrary.
    piece = st.tuples(st.integers(0, len(full_text)), st.integers(1, 6)).map(
        lambda at: full_text[at[0] : at[0] + at[1]]
    )
    stop = data.draw(
        st.lists(st.one_of(piece, st.text(min_size=1, max_size=3)).filter(bool), max_size=3),
        label="stop",
    )
    min_tokens = data.draw(st.integers(0, 4), label="min_tokens")
    # Text of the first min_tokens tokens, as the (separately tested) decode stage emits it.
    plain = IncrementalDetokenizer(tokenizer, [])
    num_unstoppable_chars = len("".join(plain.update([t]).text_delta for t in output[:min_tokens]))
    if len(output) <= min_tokens:
        num_unstoppable_chars = len(full_text)
    detok = IncrementalDetokenizer(tokenizer, [], stop=stop, min_tokens=min_tokens)

    text, stop_reason = _run(detok, data.draw(chunked(output), label="chunks"))

    assert (text, stop_reason) == _oracle(full_text, stop, num_unstoppable_chars)
    assert detok.output_text == text


@_property_settings
@given(data=st.data())
def test_update_each_is_update_one_token_at_a_time(
    tokenizer: Tokenizer, data: st.DataObject
) -> None:
    output = data.draw(token_ids(tokenizer), label="output")
    at = data.draw(st.integers(0, len(output)), label="special token at")
    output = [*output[:at], IM_END_ID, *output[at:]]  # a kept token, where tokens are kept
    full_text = tokenizer.decode(output)
    piece = st.tuples(st.integers(0, len(full_text)), st.integers(1, 4)).map(
        lambda at: full_text[at[0] : at[0] + at[1]]
    )
    stop = data.draw(st.lists(piece.filter(bool), max_size=2), label="stop")
    kept = data.draw(st.sampled_from([None, {IM_END_ID: "<|im_end|>"}]), label="kept")
    options = {"stop": stop, "min_tokens": data.draw(st.integers(0, 3)), "kept_tokens": kept}
    each = IncrementalDetokenizer(tokenizer, [1, 2], **options)  # type: ignore[arg-type]
    one = IncrementalDetokenizer(tokenizer, [1, 2], **options)  # type: ignore[arg-type]

    for chunk in data.draw(chunked(output), label="chunks"):
        texts, stop_reason = each.update_each(chunk)
        expected: list[str] = []
        for token_id in chunk[: len(texts)]:
            update = one.update([token_id])
            expected.append(update.text_delta)
        assert texts == expected
        assert len(texts) == len(chunk) or stop_reason is not None
        assert stop_reason == one.stop_reason
        if stop_reason is not None:
            break
    assert each.flush() == one.flush()
    assert (each.output_text, each.num_output_tokens) == (one.output_text, one.num_output_tokens)


def test_update_each_after_flush_raises(tokenizer: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tokenizer, [1])
    assert detok.update_each(HELLO_IDS[:2]) == (["Hello", " world"], None)
    detok.flush()
    with pytest.raises(RuntimeError):
        detok.update_each(HELLO_IDS[2:3])
