"""Structured output in the native engine: each guided request's grammar state, and the token
masks of a step computed on a thread of their own while the model's forward pass runs.

    engine thread:  start(masks of the step's guided rows) -> forward pass -> apply -> sample
    mask thread:                     compute masks (llguidance releases the GIL) ^ wait

The masks of step N depend only on the tokens accepted up to step N-1, so they are known
before the forward pass starts: computing them beside it takes them off the critical path
(the wait is short unless a mask takes longer than the whole forward pass).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import llguidance
import torch

from armature.errors import InvalidRequestError
from armature.grammar.compile import check_guide
from armature.protocols.guide import Guide

__all__ = ["GrammarMasks", "MaskTimes", "PendingMasks", "RequestGrammar"]

log = logging.getLogger(__name__)

_BITS = torch.arange(32, dtype=torch.int32)


class RequestGrammar:
    """One request's grammar: an llguidance matcher advanced by each accepted token. Touched
    by the engine thread, and by the mask thread only between `start` and `apply`."""

    def __init__(self, matcher: llguidance.LLMatcher, param: str):
        self.matcher = matcher
        self.param = param  # the request field the guide came from

    def accept(self, token_id: int) -> None:
        """Advance past `token_id` (a refused token leaves the matcher in error)."""
        self.matcher.consume_token(token_id)

    @property
    def is_complete(self) -> bool:
        """The grammar can take nothing more (the output matches it whole)."""
        return self.matcher.is_stopped()

    @property
    def error(self) -> str | None:
        """Why the matcher stopped (its first line: llguidance appends its internal state),
        None while it has not."""
        if not self.matcher.is_error():
            return None
        return self.matcher.get_error().strip().split("\n", 1)[0]


@dataclass
class MaskTimes:
    """What the masks cost so far: the mask thread's seconds computing them, and the engine
    thread's seconds waiting for them after the forward pass (the part not overlapped)."""

    num_steps: int = 0
    num_masks: int = 0
    compute_s: float = 0.0
    wait_s: float = 0.0


class PendingMasks:
    """The masks of one step's rows, being computed. `wait` or `apply` waits for them."""

    def __init__(self, rows: list[int], future: Future[torch.Tensor], times: MaskTimes):
        self.rows = rows  # rows of the step's logits that have a grammar
        self._future = future
        self._times = times

    def wait(self) -> torch.Tensor:
        """The allowed tokens, bool [len(rows), vocab]; the matchers are free again after."""
        started_s = time.perf_counter()
        allowed = self._future.result()
        self._times.wait_s += time.perf_counter() - started_s
        return allowed

    def apply(self, logits: torch.Tensor) -> None:
        """Set every token the grammars refuse to -inf in `logits` [rows, vocab], in place."""
        allowed = self.wait()
        index = torch.tensor(self.rows, dtype=torch.long)
        logits[index] = logits[index].masked_fill(~allowed, float("-inf"))


class GrammarMasks:
    """The engine's structured output: builds request grammars against the model's tokenizer
    and computes the masks of a step on one thread of its own. The tokenizer (llguidance's
    view of it: about a second to build) loads on that thread from the start, so the engine
    starts without waiting and only a guided request that comes sooner waits for it. Owns the
    thread: `close` stops it."""

    def __init__(self, load_tokenizer: Callable[[], llguidance.LLTokenizer], vocab_size: int):
        self.vocab_size = vocab_size
        self.times = MaskTimes()  # written by both threads: read it when the engine is idle
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="armature-grammar")
        self._tokenizer = self._pool.submit(load_tokenizer)

    def build(self, guide: Guide, output_token_ids: Sequence[int]) -> RequestGrammar:
        """A grammar for `guide`, advanced past `output_token_ids` (a resumed request's).
        InvalidRequestError naming the guide's field for a guide it cannot follow."""
        grammar = check_guide(guide)
        matcher = llguidance.LLMatcher(self._tokenizer.result(), grammar, log_level=0)
        state = RequestGrammar(matcher, guide.param)
        for token in output_token_ids:
            state.accept(token)
        if state.error is not None:
            raise InvalidRequestError(
                f"the output so far does not match: {state.error}", guide.param
            )
        return state

    def start(self, grammars: Sequence[RequestGrammar | None]) -> PendingMasks | None:
        """Begin computing the masks of the rows that have a grammar (None: no row has)."""
        rows = [row for row, g in enumerate(grammars) if g is not None]
        if not rows:
            return None
        matchers = [g.matcher for g in grammars if g is not None]
        self.times.num_steps += 1
        self.times.num_masks += len(rows)
        return PendingMasks(rows, self._pool.submit(self._compute, matchers), self.times)

    def _compute(self, matchers: list[llguidance.LLMatcher]) -> torch.Tensor:
        started_s = time.perf_counter()
        num_words = (self.vocab_size + 31) // 32
        bitmask = torch.empty((len(matchers), num_words), dtype=torch.int32)
        row_bytes = num_words * 4
        for i, matcher in enumerate(matchers):
            matcher.unsafe_compute_mask_ptr(bitmask.data_ptr() + i * row_bytes, row_bytes)
        bits = (bitmask.unsqueeze(-1) >> _BITS) & 1
        allowed = bits.view(len(matchers), -1)[:, : self.vocab_size].bool()
        self.times.compute_s += time.perf_counter() - started_s
        return allowed

    def close(self) -> None:
        """Stop the mask thread and log what the masks cost (benchmarks read the line)."""
        self._pool.shutdown(wait=True)
        t = self.times
        if t.num_steps:
            log.info(
                "grammar masks: %d steps, %d masks, %.3f s computing, %.3f s waited for",
                t.num_steps,
                t.num_masks,
                t.compute_s,
                t.wait_s,
            )
