"""How a frontend renders chats and reads their output, chosen once at startup from the
model's tokenizer and --chat-template / --tool-call-parser, and logged.

A ChatML model whose own template drops tools (SmolLM2's) still takes tools out of the box:
chats that use tools are rendered by the bundled ChatML tools template (Qwen2.5's layout,
templates/chatml_tools.jinja) and read with the hermes parser. The bundled template is used
only where it renders plain chats exactly as the model's own template does (so it is the
same format, extended), and never when --chat-template is given or --tool-call-parser names
another format; chats without tools keep the model's own template.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from armature.config.chat import ChatConfig
from armature.frontend.parsing import OutputParsers
from armature.frontend.preprocess import Preprocessor, read_chat_template

__all__ = [
    "ChatSetup",
    "chatml_tools_template",
    "load_chat_setup",
    "renders_like",
    "special_token_ids",
    "with_kept_markers",
]

log = logging.getLogger(__name__)

BUNDLED_PARSER = "hermes"  # the call format the bundled template asks for
# Plain chats both templates must render alike, with and without the generation prompt. A
# system message first: models' templates differ in the default system prompt they add.
PROBE_CHATS: tuple[tuple[dict[str, Any], ...], ...] = (
    ({"role": "system", "content": "S"}, {"role": "user", "content": "U"}),
    (
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A"},
        {"role": "user", "content": "V"},
    ),
)


def chatml_tools_template() -> str:
    """The bundled ChatML tools template's Jinja source."""
    source = resources.files("armature.frontend").joinpath("templates/chatml_tools.jinja")
    return source.read_text(encoding="utf-8")


@dataclass(frozen=True)
class ChatSetup:
    preprocessor: Preprocessor
    parsers: OutputParsers
    template: str  # which template renders tool chats, in words (logged)


def renders_like(preprocessor: Preprocessor, template: str) -> bool:
    """Whether `template` renders every probe chat exactly as the preprocessor's chat
    template does (False when the latter fails on them)."""
    if not preprocessor.has_chat_template:
        return False
    for chat in PROBE_CHATS:
        for generation_prompt in (True, False):
            messages = [dict(m) for m in chat]
            try:
                own = preprocessor.render_chat(messages, add_generation_prompt=generation_prompt)
            except (TemplateError, ValueError, TypeError):
                return False
            bundled = preprocessor.tokenizer.apply_chat_template(
                messages,
                chat_template=template,
                tokenize=False,
                add_generation_prompt=generation_prompt,
            )
            if own != bundled:
                return False
    return True


def special_token_ids(tokenizer: Any, texts: Sequence[str]) -> dict[int, str]:
    """id -> text of each of `texts` that is a special token of `tokenizer` (decoding with
    skip_special_tokens drops those)."""
    wanted = set(texts)
    return {
        i: token.content
        for i, token in tokenizer.added_tokens_decoder.items()
        if token.special and token.content in wanted
    }


def with_kept_markers(parsers: OutputParsers, preprocessor: Preprocessor) -> OutputParsers:
    """`parsers` keeping the tool-call parser's markers that are special tokens here."""
    if parsers.tool_call is None:
        return parsers
    kept = special_token_ids(preprocessor.tokenizer, parsers.tool_call.markers)
    return dataclasses.replace(parsers, kept_tokens=kept)


def load_chat_setup(model_dir: Path, config: ChatConfig) -> ChatSetup:
    """The preprocessor and output parsers of `config` over the model in `model_dir`, with
    the bundled ChatML tools template and the hermes parser where the model needs them
    (module docstring); logs the choice."""
    explicit = read_chat_template(config.chat_template)
    preprocessor = Preprocessor(model_dir, explicit)
    parser = config.tool_call_parser
    if explicit is not None:
        template = f"--chat-template {config.chat_template}"
    elif preprocessor.template_features.takes_tools:
        template = "the model's own (it renders tools)"
    elif parser not in (None, BUNDLED_PARSER):
        template = f"the model's own (it renders no tools; --tool-call-parser {parser})"
    elif renders_like(preprocessor, bundled := chatml_tools_template()):
        preprocessor = preprocessor.with_tools_template(bundled)
        parser = BUNDLED_PARSER
        template = (
            "the bundled ChatML tools template for chats with tools (the model's own ChatML "
            "template renders no tools)"
        )
    else:
        template = "the model's own (it renders no tools, and it is not ChatML)"
    parsers = with_kept_markers(OutputParsers.named(parser, config.reasoning_parser), preprocessor)
    if parsers.kept_tokens:
        log.info(
            "tool-call markers that are special tokens, kept in decoded output: %s",
            ", ".join(f"{text} ({i})" for i, text in sorted(parsers.kept_tokens.items())),
        )
    log.info(
        "chat template: %s; tool-call parser: %s; reasoning parser: %s",
        template,
        parser or "none (tools are refused)",
        config.reasoning_parser or "none",
    )
    return ChatSetup(preprocessor, parsers, template)
