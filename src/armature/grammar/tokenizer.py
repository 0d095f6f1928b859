"""The model's tokenizer as llguidance reads it: built from the model directory's
tokenizer.json (the one the frontend tokenizes with), never from a hub."""

from __future__ import annotations

from pathlib import Path

import llguidance

from armature.errors import ConfigError

__all__ = ["load_grammar_tokenizer"]


def load_grammar_tokenizer(
    model_dir: str | Path, vocab_size: int, eos_token_ids: tuple[int, ...]
) -> llguidance.LLTokenizer:
    """llguidance's view of the tokenizer in `model_dir`, over the model's `vocab_size` logits
    (a padded vocabulary's extra ids are never allowed). Takes about a second (once per
    engine). ConfigError when the directory has no tokenizer.json."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"structured output needs {path} (a fast tokenizer); it is missing")
    return llguidance.LLTokenizer(
        path.read_text(), n_vocab=vocab_size, eos_token=list(eos_token_ids)
    )
