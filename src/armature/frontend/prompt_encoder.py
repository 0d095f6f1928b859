"""Prompt encoding a segment at a time, each segment's ids kept: prompts that share text (a
system prompt, a conversation's earlier turns, a document asked about again) are tokenized
once, like their KV blocks are computed once.

Exact for the tokenizers it accepts (`SegmentedEncoder.accepts`): a byte-level BPE whose
pre-tokenizer is the GPT-2 split (`ByteLevel` with its regex, no prefix space), without a
normalizer or BPE dropout, whose added tokens hold no whitespace and strip nothing. There a
prompt's ids are the concatenation of its pieces' ids wherever it is cut at a space that sits
between two non-space characters (position k below; the cuts taken are between two plain
characters, ASCII printables, letters or digits, which no whitespace class holds):

    "...ab cd..."        the split's alternatives (contractions, ` ?\\p{L}+`, ` ?\\p{N}+`,
          ^ k            ` ?[^\\s\\p{L}\\p{N}]+`, whitespace runs) take a space only as their
                         first character or inside a whitespace run, and T[k-1] is not
                         whitespace: no piece of the split crosses k, and the split of T[k:]
                         reads nothing before k. Added tokens (no whitespace in them) cannot
                         cross k either, and each BPE word is encoded on its own.

A prompt is cut at the first such space after every `segment_chars` characters, so prompts
that begin alike are cut alike up to where they differ; each segment's ids are kept by its
text (least recently used out first, within a bound on the kept text). Other tokenizers
encode whole prompts.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

__all__ = ["MAX_KEPT_CHARS", "SEGMENT_CHARS", "SegmentedEncoder"]

SEGMENT_CHARS = 256  # about 50-60 tokens of English text
MAX_KEPT_CHARS = 4_000_000  # the kept segments' text, all together (with their ids ~40 MB)


class SegmentedEncoder:
    def __init__(
        self,
        backend: Any,
        segment_chars: int = SEGMENT_CHARS,
        max_kept_chars: int = MAX_KEPT_CHARS,
    ):
        """`backend`: a `tokenizers.Tokenizer` that `accepts` allows. Segments are kept
        while their text adds up to at most `max_kept_chars`; one longer than 4 x
        `segment_chars` (text with no cut in it) is encoded but not kept."""
        if segment_chars < 1 or max_kept_chars < 1:
            raise ValueError("segment_chars and max_kept_chars must be >= 1")
        self._backend = backend
        self._segment_chars = segment_chars
        self._max_kept_chars = max_kept_chars
        self._ids: OrderedDict[str, list[int]] = OrderedDict()
        self._num_kept_chars = 0
        self._lock = threading.Lock()  # prompts are encoded on an executor's threads
        self.num_hits = 0
        self.num_misses = 0

    @staticmethod
    def accepts(backend: Any) -> bool:
        """Whether `backend` (a `tokenizers.Tokenizer`) splits as the module docstring says,
        and adds no tokens of its own around a prompt."""
        try:
            spec = json.loads(backend.to_str())
            added = backend.get_added_tokens_decoder().values()
        except Exception:  # not a tokenizers.Tokenizer
            return False
        model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
        post = spec.get("post_processor")
        return (
            model.get("type") == "BPE"
            and model.get("dropout") is None
            and spec.get("normalizer") is None
            and pre.get("type") == "ByteLevel"
            and pre.get("use_regex", True)
            and not pre.get("add_prefix_space", False)
            and _adds_nothing(post)
            and all(
                not (t.lstrip or t.rstrip or t.single_word)
                and not any(c.isspace() for c in t.content)
                for t in added
            )
        )

    def encode(self, text: str) -> list[int]:
        """`text`'s ids, as the backend encodes it whole."""
        segments = list(_segments(text, self._segment_chars))
        found: list[list[int] | None] = []
        with self._lock:
            for segment in segments:
                ids = self._ids.get(segment)
                if ids is not None:
                    self._ids.move_to_end(segment)
                found.append(ids)
            self.num_hits += sum(ids is not None for ids in found)
        missing = [s for s, ids in zip(segments, found, strict=True) if ids is None]
        if missing:
            encoded = self._backend.encode_batch_fast(missing, add_special_tokens=False)
            new = {s: list(e.ids) for s, e in zip(missing, encoded, strict=True)}
            longest = 4 * self._segment_chars
            with self._lock:
                for segment, ids in new.items():
                    if len(segment) <= longest and segment not in self._ids:
                        self._ids[segment] = ids
                        self._num_kept_chars += len(segment)
                while self._num_kept_chars > self._max_kept_chars:
                    self._num_kept_chars -= len(self._ids.popitem(last=False)[0])
                self.num_misses += len(missing)
            found = [new[s] if ids is None else ids for s, ids in zip(segments, found, strict=True)]
        out: list[int] = []
        for ids in found:
            assert ids is not None
            out += ids
        return out


def _adds_nothing(post: dict[str, Any] | None) -> bool:
    """Whether a post-processor leaves a single sequence's ids as they are."""
    if post is None:
        return True
    if post.get("type") == "TemplateProcessing":
        return post.get("single") == [{"Sequence": {"id": "A", "type_id": 0}}]
    return bool(post.get("type") == "ByteLevel")  # it trims offsets only


def _is_cut(text: str, k: int) -> bool:
    """Whether the space at `k` sits between two non-space characters, each an ASCII
    printable or a letter or digit (nothing that any whitespace class might hold)."""
    before, after = text[k - 1], text[k + 1]
    return _plain(before) and _plain(after)


def _plain(c: str) -> bool:
    return "!" <= c <= "~" or (c.isalnum() and not c.isspace())


def _segments(text: str, segment_chars: int) -> Iterator[str]:
    """`text` cut at the first cut (`_is_cut`) after every `segment_chars` characters."""
    start, end = 0, len(text)
    while end - start > segment_chars:
        k = text.find(" ", start + segment_chars)
        while k != -1 and (k + 1 >= end or not _is_cut(text, k)):
            k = text.find(" ", k + 1)
        if k == -1:
            break
        yield text[start:k]
        start = k
    yield text[start:]
