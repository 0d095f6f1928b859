"""The frontend encodes prompts with the raw `tokenizers` object (`encode_batch_fast`, no
offsets) instead of the transformers wrapper: the ids must be the wrapper's, exactly, with and
without special tokens, for any text (special-token markers, whitespace runs, any Unicode)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from armature.errors import ConfigError
from armature.frontend.preprocess import Preprocessor

pytestmark = pytest.mark.slow  # loads the default model's tokenizer

FIXED = [
    "",
    " ",
    "Hello, world!",
    "  leading and trailing spaces  ",
    "tabs\tand\nnew\n\nlines\r\n",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>in the middle<|endoftext|>",
    "émigré naïve café 東京 🤖🚀 ∑∫√",
    "1234567890 3.14159 -42 1e-9",
    "def f(x):\n    return x ** 2  # comment",
    "a" * 3000,
    " word" * 600,
]


@pytest.fixture(scope="module")
def preprocessor(default_model_dir: Path) -> Preprocessor:
    return Preprocessor(default_model_dir)


def _wrapper_ids(pre: Preprocessor, text: str, add_special_tokens: bool) -> list[int]:
    return list(pre.tokenizer.encode(text, add_special_tokens=add_special_tokens))


def test_the_fast_encoder_is_the_one_used(preprocessor: Preprocessor) -> None:
    assert preprocessor._encoder is preprocessor.tokenizer.backend_tokenizer


@pytest.mark.parametrize("add_special_tokens", [True, False])
@pytest.mark.parametrize("text", FIXED)
def test_fixed_texts_encode_as_the_wrapper_does(
    preprocessor: Preprocessor, text: str, add_special_tokens: bool
) -> None:
    assert preprocessor.encode(text, add_special_tokens) == _wrapper_ids(
        preprocessor, text, add_special_tokens
    )


@settings(max_examples=300, deadline=None)
@given(
    text=st.lists(
        st.one_of(
            st.text(max_size=8),
            st.sampled_from([" ", "\n", "\t", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]),
        ),
        max_size=30,
    ).map("".join),
    add_special_tokens=st.booleans(),
)
def test_any_text_encodes_as_the_wrapper_does(
    preprocessor: Preprocessor, text: str, add_special_tokens: bool
) -> None:
    assert preprocessor.encode(text, add_special_tokens) == _wrapper_ids(
        preprocessor, text, add_special_tokens
    )


def test_the_chat_path_encodes_as_before(preprocessor: Preprocessor) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2? <|im_end|> not a marker here"},
    ]
    text = preprocessor.render_chat(messages)
    assert preprocessor.encode_chat(messages) == _wrapper_ids(preprocessor, text, False)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"{bad", "JSONDecodeError: Expecting property name"),
        (b"{}", "KeyError: 'added_tokens'"),
        (b"\xff\xfe", "UnicodeDecodeError"),
    ],
)
def test_a_tokenizer_that_does_not_load_is_a_config_error(
    default_model_dir: Path, tmp_path: Path, content: bytes, fragment: str
) -> None:
    model_dir = tmp_path / "m"
    shutil.copytree(default_model_dir, model_dir)
    (model_dir / "tokenizer.json").write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        Preprocessor(model_dir)
    assert str(caught.value).startswith(f"cannot load the tokenizer in {model_dir}: ")
    assert fragment in str(caught.value)


def test_a_chat_template_that_does_not_parse_is_a_config_error(default_model_dir: Path) -> None:
    """At start-up, not at every chat's first render as if its messages were at fault."""
    with pytest.raises(ConfigError) as caught:
        Preprocessor(default_model_dir, "{% for %}")
    assert str(caught.value) == (
        "the --chat-template template does not parse: "
        "Expected an expression, got 'end of statement block' (line 1)"
    )
    # what transformers' own environment takes (loop controls) parses
    loop = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{% endfor %}"
    assert Preprocessor(default_model_dir, loop).has_chat_template
