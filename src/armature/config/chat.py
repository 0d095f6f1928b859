"""How the frontend renders chats and reads model output: the chat template, and the
parsers that turn output text into tool calls and reasoning (frontend/parsing/)."""

from __future__ import annotations

from dataclasses import dataclass

from armature.config.settings import setting

__all__ = ["REASONING_PARSERS", "TOOL_CALL_PARSERS", "ChatConfig"]

TOOL_CALL_PARSERS = ("hermes", "llama3_json", "mistral", "pythonic")
REASONING_PARSERS = ("qwen3", "deepseek_r1")


@dataclass(frozen=True, kw_only=True)
class ChatConfig:
    """Chat rendering and output parsing (the model family's formats)."""

    tool_call_parser: str | None = setting(
        None,
        "read tool calls in the model's output in this format and accept `tools` on chat "
        "completions (default: hermes for a ChatML model whose own template renders no tools, "
        "with the bundled ChatML tools template; otherwise `tools` is refused)",
        choices=TOOL_CALL_PARSERS,
    )
    reasoning_parser: str | None = setting(
        None,
        "split <think> reasoning from the answer into reasoning_content: qwen3 (the output "
        "opens <think>) or deepseek_r1 (the output starts inside reasoning)",
        choices=REASONING_PARSERS,
    )
    chat_template: str | None = setting(
        None,
        "a Jinja chat template file to use instead of the model's own (e.g. one that "
        "renders tools; it also replaces the bundled ChatML tools template)",
    )
