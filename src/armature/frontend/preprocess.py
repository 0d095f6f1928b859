"""Prompt preparation: chat templates and tokenization (CPU-bound; callers run these off the
event loop with asyncio.to_thread)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from armature.errors import ArmatureError

__all__ = ["NoChatTemplateError", "Preprocessor"]


class NoChatTemplateError(ArmatureError, ValueError):
    """The model's tokenizer carries no chat template."""


class Preprocessor:
    def __init__(self, model_dir: Path):
        from transformers import AutoTokenizer

        self.tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir))
        self.has_chat_template = bool(getattr(self.tokenizer, "chat_template", None))
        # the raw `tokenizers` object decodes several times faster than the transformers
        # wrapper; streaming calls it once or twice per token
        self.decoder: Any = getattr(self.tokenizer, "backend_tokenizer", self.tokenizer)

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        if not self.has_chat_template:
            raise NoChatTemplateError("this model has no chat template; use /v1/completions")
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        assert isinstance(text, str)
        return text

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        return self.encode(self.render_chat(messages), add_special_tokens=False)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return list(ids)

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        text = self.decoder.decode(token_ids, skip_special_tokens=skip_special_tokens)
        assert isinstance(text, str)
        return text

    def token_text(self, token_id: int) -> str:
        """The text of one token as OpenAI logprobs report it."""
        return self.decode([token_id], skip_special_tokens=False)
