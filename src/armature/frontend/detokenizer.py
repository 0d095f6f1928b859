"""Incremental detokenization with stop strings: token ids in, text safe to stream out.

Two stages per request, both pure:

1. Decode. Only a small window of recent tokens is decoded each step (the vLLM
   prefix_offset/read_offset technique), never the whole output, so a step costs O(window):

       window:  [ prefix tokens | new tokens ]
                0          read_offset    len(window)
       prefix_text = decode(window[:read_offset])   (already emitted, context only)
       delta       = decode(window)[len(prefix_text):]

   When decode(window) ends in U+FFFD the last character is incomplete (a byte-level BPE
   token can end inside a multi-byte UTF-8 character), so nothing is emitted and the window
   grows. Otherwise the delta is emitted and the window drops its prefix. The first window
   starts with a few prompt tokens so tokenizers that treat a leading space specially
   decode the first output token correctly. For a `tokenizers.Tokenizer` (what the frontend
   has) the tokenizers library's `DecodeStream` runs this very step in Rust.

2. Stop strings. The longest suffix of the decoded text that is a proper prefix of some
   stop string is held back, so a stop string that spans tokens is never partly emitted.
   A stop string matches only where it ends in text decoded after the first `min_tokens`
   tokens (as vLLM). Of several matches, the one ending first wins (ties: the one starting
   first), so the emitted text never contains a stop string, however the tokens are batched.

`kept_tokens` maps special token ids to their text: decoding skips special tokens, but these
are written out (a tool-call parser reads them, e.g. Mistral's `[TOOL_CALLS]`). Such a token
ends the window: the text before it is emitted, then its own text, and a new window opens on
it (it decodes to nothing, so it is context only).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

__all__ = ["DetokenizerUpdate", "IncrementalDetokenizer", "TokenDecoder"]

# Prompt tokens decoded as context before the first output token (vLLM uses the same).
NUM_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


class TokenDecoder(Protocol):
    """Turns token ids into text: a `tokenizers.Tokenizer` or a transformers fast tokenizer.

    Must be prefix-stable where a window ends on a complete character: decoding more
    tokens only appends text (true for byte-level BPE and Metaspace tokenizers; not for
    `clean_up_tokenization_spaces=True`).
    """

    def decode(self, token_ids: list[int], /, skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True)
class DetokenizerUpdate:
    """What one `IncrementalDetokenizer.update` call produced."""

    text_delta: str  # new text safe to show the client now
    # The stop string that matched, or None. When set, the output ends right before it
    # (never includes it) and generation should end.
    stop_reason: str | None


class IncrementalDetokenizer:
    """Per-request detokenizer state. Not thread-safe; one owner feeds it in order.

    Call `update` with each batch of sampled token ids, then `flush` once when generation
    ends without a stop string match. After a stop string matched, `flush` returns "" and
    `update` raises; after `flush`, `update` raises.
    """

    def __init__(
        self,
        decoder: TokenDecoder,
        prompt_token_ids: Sequence[int],
        *,
        stop: Sequence[str] = (),
        min_tokens: int = 0,
        skip_special_tokens: bool = True,
        kept_tokens: Mapping[int, str] | None = None,
    ) -> None:
        if min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {min_tokens}")
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        self._stop = tuple(stop)
        self._min_tokens = min_tokens
        # Every proper prefix of every stop string: the tails that must be held back.
        self._stop_prefixes = frozenset(s[:k] for s in self._stop for k in range(1, len(s)))
        self._max_stop_prefix_chars = max((len(p) for p in self._stop_prefixes), default=0)

        # Decode stage (see module docstring).
        self._decoder = decoder
        self._skip_special_tokens = skip_special_tokens
        self._kept_tokens = kept_tokens or {}
        self._window = _open_window(decoder, prompt_token_ids, skip_special_tokens)

        # Stop stage: decoded text not yet emitted. A match must end after its first
        # `_num_unstoppable_chars` chars (text of the first min_tokens tokens).
        self._pending_text = ""
        self._num_unstoppable_chars = 0

        self._num_output_tokens = 0
        self._output_chunks: list[str] = []
        self._stop_reason: str | None = None
        self._finished = False

    @property
    def output_text(self) -> str:
        """All text emitted so far (including flush), stop string excluded."""
        if len(self._output_chunks) > 1:
            self._output_chunks = ["".join(self._output_chunks)]
        return self._output_chunks[0] if self._output_chunks else ""

    @property
    def num_output_tokens(self) -> int:
        """Token ids fed through `update` so far, including any after a stop match."""
        return self._num_output_tokens

    @property
    def stop_reason(self) -> str | None:
        """The stop string that matched (in `update` or `flush`), or None."""
        return self._stop_reason

    def update(self, new_token_ids: Sequence[int]) -> DetokenizerUpdate:
        """Feed newly sampled tokens; returns the text now safe to show and any stop match."""
        if self._finished:
            raise RuntimeError("update() after a stop string matched or after flush()")
        for token_id in new_token_ids:
            self._num_output_tokens += 1
            self._pending_text += self._decode_next(token_id)
            if self._num_output_tokens <= self._min_tokens:
                self._num_unstoppable_chars = len(self._pending_text)
        return DetokenizerUpdate(self._take_safe_text(final=False), self._stop_reason)

    def update_each(self, new_token_ids: Sequence[int]) -> tuple[list[str], str | None]:
        """`update` with one token at a time: the text each token made safe to show, and the
        stop string that matched (None: none did). On a match the texts end at the token
        that completed it. Without stop strings no text is held back: one decode per token."""
        if self._stop:
            texts = []
            for token_id in new_token_ids:
                update = self.update((token_id,))
                texts.append(update.text_delta)
                if update.stop_reason is not None:
                    return texts, update.stop_reason
            return texts, None
        if self._finished:
            raise RuntimeError("update() after flush()")
        texts = [self._decode_next(token_id) for token_id in new_token_ids]
        self._num_output_tokens += len(texts)
        self._output_chunks += [text for text in texts if text]
        return texts, None

    def flush(self) -> str:
        """End of generation: the text held back for incomplete characters or stop prefixes.

        The held text is still checked for stop strings (see `stop_reason`).
        """
        if self._finished:
            return ""
        self._pending_text += self._window.flush()
        if self._num_output_tokens <= self._min_tokens:
            self._num_unstoppable_chars = len(self._pending_text)
        return self._take_safe_text(final=True)

    def _decode_next(self, token_id: int) -> str:
        """The newly complete text of one more token (maybe "")."""
        kept = self._kept_tokens.get(token_id)
        if kept is None:
            return self._window.step(token_id)
        before = self._window.flush()
        self._window = _open_window(self._decoder, [token_id], self._skip_special_tokens)
        return before + kept

    def _take_safe_text(self, *, final: bool) -> str:
        """Move the pending text that can no longer start a stop match to the output.

        On a match: emits the text before it, drops the rest, and finishes.
        """
        pending = self._pending_text
        match = self._find_first_stop(pending)
        if match is not None:
            start, self._stop_reason = match
            self._pending_text = ""
            self._finished = True
            return self._emit(pending[:start])
        num_held_chars = 0 if final else self._num_stop_prefix_chars(pending)
        num_safe_chars = len(pending) - num_held_chars
        self._pending_text = pending[num_safe_chars:]
        self._num_unstoppable_chars = max(0, self._num_unstoppable_chars - num_safe_chars)
        self._finished = final
        return self._emit(pending[:num_safe_chars])

    def _find_first_stop(self, text: str) -> tuple[int, str] | None:
        """(start, stop string) of the match that ends first, ties to the earliest start."""
        best: tuple[int, int, str] | None = None  # (end, start, stop string)
        for s in self._stop:
            start = text.find(s, max(0, self._num_unstoppable_chars - len(s) + 1))
            if start != -1 and (best is None or (start + len(s), start) < best[:2]):
                best = (start + len(s), start, s)
        return None if best is None else (best[1], best[2])

    def _num_stop_prefix_chars(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        for n in range(min(self._max_stop_prefix_chars, len(text)), 0, -1):
            if text[-n:] in self._stop_prefixes:
                return n
        return 0

    def _emit(self, text: str) -> str:
        if text:
            self._output_chunks.append(text)
        return text


class _Window:
    """The decode stage in Python, for any `TokenDecoder` (module docstring)."""

    def __init__(
        self,
        decoder: TokenDecoder,
        context_ids: list[int],
        context_text: str,
        skip_special_tokens: bool,
    ) -> None:
        self._decoder = decoder
        self._skip_special_tokens = skip_special_tokens
        self._ids = context_ids
        self._prefix_text = context_text  # decode(context_ids)
        self._read_offset = len(self._ids)

    def _decode(self, token_ids: list[int]) -> str:
        return self._decoder.decode(token_ids, skip_special_tokens=self._skip_special_tokens)

    def step(self, token_id: int) -> str:
        """Append one token; returns the newly complete text (maybe "")."""
        self._ids.append(token_id)
        text = self._decode(self._ids)
        if len(text) <= len(self._prefix_text) or text.endswith(_REPLACEMENT_CHAR):
            return ""
        delta = text[len(self._prefix_text) :]
        del self._ids[: self._read_offset]
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids)
        return delta

    def flush(self) -> str:
        """The text of the tokens not yet returned, incomplete characters included."""
        if self._read_offset == len(self._ids):
            return ""
        return self._decode(self._ids)[len(self._prefix_text) :]


class _RustWindow:
    """The same decode stage run by the tokenizers library (`DecodeStream`: its step is this
    module's window, in Rust), for a `tokenizers.Tokenizer`. The token ids are mirrored here
    only so that `flush` can decode what the stream holds back."""

    def __init__(
        self, tokenizer: Tokenizer, context_ids: list[int], skip_special_tokens: bool
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._stream = DecodeStream(ids=context_ids, skip_special_tokens=skip_special_tokens)
        self._ids = context_ids
        self._read_offset = len(context_ids)

    def step(self, token_id: int) -> str:
        self._ids.append(token_id)
        text = self._stream.step(self._tokenizer, token_id)
        if text is None:
            return ""
        del self._ids[: self._read_offset]
        self._read_offset = len(self._ids)
        return str(text)

    def flush(self) -> str:
        if self._read_offset == len(self._ids):
            return ""
        decode = functools.partial(
            self._tokenizer.decode, skip_special_tokens=self._skip_special_tokens
        )
        return str(decode(self._ids))[len(decode(self._ids[: self._read_offset])) :]


def _open_window(
    decoder: TokenDecoder, prompt_token_ids: Sequence[int], skip_special_tokens: bool
) -> _Window | _RustWindow:
    """The decode stage for one output, its window opened on the prompt's last tokens (none if
    the prompt ends inside a character: the output must not complete it)."""
    context = list(prompt_token_ids[-NUM_CONTEXT_TOKENS:])
    text = decoder.decode(context, skip_special_tokens=skip_special_tokens)
    if text.endswith(_REPLACEMENT_CHAR):
        context, text = [], ""
    if isinstance(decoder, Tokenizer):
        return _RustWindow(decoder, context, skip_special_tokens)
    return _Window(decoder, context, text, skip_special_tokens)
