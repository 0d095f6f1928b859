"""Prompt preparation: chat templates and tokenization (CPU-bound; callers run a long prompt's
off the event loop with asyncio.to_thread, see jobs.py's INLINE_PROMPT_CHARS)."""

from __future__ import annotations

import copy
import functools
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jinja2 import TemplateError, TemplateSyntaxError

from armature.errors import ArmatureError, ConfigError
from armature.frontend.prompt_encoder import SegmentedEncoder
from armature.frontend.template_features import TemplateFeatures, read_template_features

__all__ = [
    "ChatRenderError",
    "NoChatTemplateError",
    "Preprocessor",
    "encode_on_calling_thread",
    "read_chat_template",
    "uses_tools",
]

PARALLELISM_VARIABLE = "TOKENIZERS_PARALLELISM"


def encode_on_calling_thread() -> None:
    """Have the tokenizers library encode a batch on the thread that calls it, in this
    process, unless its environment variable (`PARALLELISM_VARIABLE`) already says otherwise.

    A serving frontend encodes its requests on executor threads, one request each. Left
    parallel, the library also splits each request's segments across its own pool of one
    thread per core, whose workers spin before they sleep: on a loaded 2-core host that took
    a third more CPU per prompt (bench/serving_cpu.py's load: two pool threads at 8% of a core
    each), for a prompt encoded a little sooner on an idle one. `armature serve` and
    `armature frontend` call it first, before any thread that might read the environment."""
    os.environ.setdefault(PARALLELISM_VARIABLE, "false")


class ChatRenderError(ArmatureError, ValueError):
    """The chat template cannot render the request's messages (the request's fault: a 400):
    the template raised on them (`raise_exception`: roles out of its order), or they nest
    too deep for it."""


class NoChatTemplateError(ChatRenderError):
    """The model's tokenizer carries no chat template."""


def _check_template_syntax(sources: Sequence[str], whose: str) -> None:
    """ConfigError for a chat template that does not parse (`whose`: where it came from),
    compiled as the tokenizer will render it; else every chat would fail at its first
    render, as if its messages were at fault."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    for source in sources:
        if not source:
            continue
        try:
            _compile_jinja_template(source)
        except TemplateSyntaxError as exc:
            raise ConfigError(
                f"{whose} does not parse: {exc.message} (line {exc.lineno})"
            ) from None


def read_chat_template(path: str | None) -> str | None:
    """The Jinja source --chat-template names (None: the model's own template)."""
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--chat-template: cannot read {path}: {exc}") from None


def uses_tools(messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None) -> bool:
    """Whether a chat offers tools or carries tool calls or tool results in its history."""
    return bool(tools) or any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def load_tokenizer(model_dir: Path) -> Any:
    """The Hugging Face tokenizer in `model_dir`; ConfigError, in one line, where it does not
    load."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir))
    # the library reads the directory's files with whatever raises on bad ones (a JSON
    # error, a KeyError for a missing section, the Rust tokenizer's own Exception)
    except Exception as exc:
        first = str(exc).strip().split("\n", 1)[0]
        what = f"cannot load the tokenizer in {model_dir}: {type(exc).__name__}: {first}"
        raise ConfigError(what) from None


# what a template's own code raises on the values it is given (a string plus a number, a
# missing key, raise_exception): the request's fault
_RENDER_ERRORS = (
    TemplateError,
    RecursionError,
    TypeError,
    ValueError,
    LookupError,
    AttributeError,
    ArithmeticError,
)


def _as_system(message: dict[str, Any]) -> dict[str, Any]:
    return {**message, "role": "system"}


class Preprocessor:
    """The model's tokenizer and chat template; `chat_template` (Jinja source) replaces the
    model's own. A tools template (`with_tools_template`) renders the chats that use tools
    (see `uses_tools`) while the others keep the chat template: a model whose own template
    drops tools gets one that renders them in its format (chat_setup.py chooses it)."""

    def __init__(self, model_dir: Path, chat_template: str | None = None):
        self.tokenizer: Any = load_tokenizer(model_dir)
        self._chat_template = chat_template
        self.tools_template: str | None = None
        template = chat_template or getattr(self.tokenizer, "chat_template", None)
        self.has_chat_template = bool(template)
        sources = list(template.values()) if isinstance(template, dict) else [template or ""]
        whose = "the --chat-template template" if chat_template else "the model's chat template"
        _check_template_syntax(sources, whose)
        self.template_features: TemplateFeatures = read_template_features(sources)
        self._own_features = self.template_features  # the chat template's, whatever renders tools
        # the raw `tokenizers` object decodes several times faster than the transformers
        # wrapper; streaming calls it once or twice per token
        self.decoder: Any = getattr(self.tokenizer, "backend_tokenizer", self.tokenizer)
        # and encodes without the wrapper's per-call setup and without character offsets
        # (`encode_batch_fast`): the same ids for ~20% less CPU per prompt
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        self._encoder: Any = backend if hasattr(backend, "encode_batch_fast") else None
        # prompts that share text tokenize it once, where the tokenizer allows it exactly
        self.segmented: SegmentedEncoder | None = None
        if self._encoder is not None and SegmentedEncoder.accepts(backend):
            self.segmented = SegmentedEncoder(backend)

    def with_tools_template(self, source: str) -> Preprocessor:
        """This preprocessor (the same tokenizer) with `source` rendering the chats that use
        tools; its features are then the tools template's."""
        other = copy.copy(self)
        other.tools_template = source
        other.template_features = read_template_features([source])
        return other

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text of `messages` (and `tools`, for a template that takes them);
        `template_kwargs` are further variables the template may read. A developer message
        is rendered as a system message by a template that names no developer role."""
        template, features = self._chat_template, self._own_features
        if self.tools_template is not None and uses_tools(messages, tools):
            template, features = self.tools_template, self.template_features
        elif not self.has_chat_template:
            raise NoChatTemplateError("this model has no chat template; use /v1/completions")
        if not features.knows_developer:  # OpenAI's developer replaces system
            messages = [_as_system(m) if m.get("role") == "developer" else m for m in messages]
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools or None,
                chat_template=template,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **(template_kwargs or {}),
            )
        except _RENDER_ERRORS as exc:  # the request's data: its messages, its variables
            given = f" with the variables {', '.join(template_kwargs)}" if template_kwargs else ""
            raise ChatRenderError(
                f"the chat template cannot render these messages{given}: {exc}"
            ) from None
        assert isinstance(text, str)
        return text

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        text = self.render_chat(messages, tools, template_kwargs=template_kwargs)
        return self.encode(text, add_special_tokens=False)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.segmented is not None:  # adds no special tokens either way
            return self.segmented.encode(text)
        if self._encoder is not None:
            [encoding] = self._encoder.encode_batch_fast(
                [text], add_special_tokens=add_special_tokens
            )
            return list(encoding.ids)
        ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return list(ids)

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        text = self.decoder.decode(token_ids, skip_special_tokens=skip_special_tokens)
        assert isinstance(text, str)
        return text

    def token_text(self, token_id: int) -> str:
        """The text of one token as OpenAI logprobs report it."""
        return self.decode([token_id], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token adds to the text, as OpenAI logprobs' `bytes` give them: a
        token holding part of a character gives its own bytes (its text is U+FFFD), so that
        the bytes of consecutive tokens join into the text."""
        piece = self._piece(token_id)
        if piece is not None:
            if match := _BYTE_PIECE_RE.fullmatch(piece):  # a byte-fallback piece: <0xF0>
                return bytes([int(match.group(1), 16)])
            if self._byte_level and all(c in _BYTE_OF_CHAR for c in piece):
                return bytes(_BYTE_OF_CHAR[c] for c in piece)
        return self.token_text(token_id).encode("utf-8")

    def _piece(self, token_id: int) -> str | None:
        """The token's vocabulary entry (None: the tokenizer does not say)."""
        id_to_token = getattr(self.decoder, "id_to_token", None)
        if id_to_token is None:
            return None
        piece = id_to_token(token_id)
        return piece if isinstance(piece, str) else None

    @functools.cached_property
    def _byte_level(self) -> bool:
        """Whether the tokenizer's pieces are bytes spelled as characters (GPT-2's byte-level
        BPE), found by its decoder (one of a sequence)."""
        decoder = getattr(self.decoder, "decoder", None)
        if decoder is None:
            return False
        return "ByteLevel" in _decoder_kinds(decoder)


def _decoder_kinds(decoder: Any) -> set[str]:
    """The type names of a `tokenizers` decoder and, for a Sequence, of its parts."""
    import json

    try:
        state = json.loads(decoder.__getstate__())
    except (AttributeError, TypeError, ValueError):
        return {type(decoder).__name__}
    parts = state.get("decoders") or [state]
    return {str(part.get("type")) for part in parts if isinstance(part, dict)}


def _byte_chars() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


_BYTE_OF_CHAR = _byte_chars()
_BYTE_PIECE_RE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
