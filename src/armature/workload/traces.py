"""Request workloads: Mooncake traces, synthetic generators, deterministic prompt synthesis.

A workload is a list of `TraceRequest`s sorted by arrival. As in the Mooncake FAST'25 traces,
a prompt is described by prefix block ids, one per TRACE_BLOCK_TOKENS tokens: `hash_ids[i]`
names block i together with every block before it, so two requests sharing their first k ids
share their first k * TRACE_BLOCK_TOKENS prompt tokens. `synthesize_prompt` turns the ids into
token ids that keep this promise; `prefix_hit_ceiling` is what an infinite prefix cache gets
(in trace blocks), `prefix_hit_ceiling_tokens` the same in an engine's own unit (prompt tokens
found cached, in whole engine blocks).

    prompt tokens:  [0 ..... 512)[512 .... 1024)[1024 .. input_length)
    hash_ids:        h0           h1             h2  (the last block may be partial)

Pure: no I/O except `read_mooncake_trace`; the generators draw from a seeded `random.Random`
and prompt tokens come from a counter-based generator keyed by (seed, hash id), so a seed
gives the same workload in every process.
"""

from __future__ import annotations

import array
import itertools
import json
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from armature.errors import ArmatureError

try:  # C, built by pip install (setup.py); without it the same tokens through numpy
    from armature.workload import _synth
except ImportError:  # pragma: no cover - exercised by the fallback test in a subprocess
    _synth = None  # type: ignore[assignment]

__all__ = [
    "THINK_JITTER_FRACTION",
    "TRACE_BLOCK_TOKENS",
    "TraceFormatError",
    "TraceRequest",
    "prefix_hit_ceiling",
    "prefix_hit_ceiling_tokens",
    "read_mooncake_trace",
    "synthesize_prompt",
    "synthesize_prompt_ids",
    "synthetic_multi_turn",
    "synthetic_prefix_groups",
]

TRACE_BLOCK_TOKENS = 512
# A turn gap in `synthetic_multi_turn` is think_time_ms scaled by U(1 - f, 1 + f).
THINK_JITTER_FRACTION = 0.25
_MASK64 = (1 << 64) - 1
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment
# a vocabulary up to this many ids shares its token ints (`_shared_ints`: 28 MiB at the most)
_MAX_SHARED_INTS = 1 << 20


class TraceFormatError(ArmatureError, ValueError):
    """An invalid trace line; the one-line message reads `path:LINE: reason`."""


@dataclass(frozen=True)
class TraceRequest:
    """One request. `hash_ids` holds one prefix id per TRACE_BLOCK_TOKENS block of the prompt
    (the last one may be partial): len(hash_ids) == ceil(input_length / TRACE_BLOCK_TOKENS)."""

    arrival_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _num_blocks(num_tokens: int, block_tokens: int = TRACE_BLOCK_TOKENS) -> int:
    return -(-num_tokens // block_tokens)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


# ---- Mooncake JSONL reader -------------------------------------------------------------------


class _InvalidLine(Exception):
    """Why one line is invalid; `read_mooncake_trace` adds the file and line number."""


def read_mooncake_trace(
    path: Path, *, limit: int | None = None, time_scale: float = 1.0
) -> list[TraceRequest]:
    """Read a Mooncake JSONL trace: the first `limit` requests of the file (all when None),
    sorted by arrival (stable), with arrival_ms = timestamp * time_scale (time_scale < 1
    compresses time, i.e. raises the request rate). Empty lines are skipped; unknown keys are
    ignored. Raises TraceFormatError at the first invalid line, ValueError on a bad argument."""
    _require(limit is None or limit >= 0, f"limit must be >= 0, got {limit}")
    _require(math.isfinite(time_scale) and time_scale > 0, f"bad time_scale {time_scale}")
    requests: list[TraceRequest] = []
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if limit is not None and len(requests) >= limit:
                break
            if not raw.strip():
                continue
            try:
                requests.append(_parse_line(raw, time_scale))
            except _InvalidLine as e:
                raise TraceFormatError(f"{path}:{line_no}: {e}") from None
    requests.sort(key=lambda r: r.arrival_ms)
    return requests


def _is_finite(value: float) -> bool:
    """Finite as a float (an int too large for one is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _parse_line(raw: bytes, time_scale: float) -> TraceRequest:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _InvalidLine("invalid JSON: not UTF-8 text") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise _InvalidLine(f"invalid JSON: {e.msg} at column {e.colno}") from None
    except RecursionError:
        raise _InvalidLine("invalid JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise _InvalidLine(f"expected a JSON object, got {type(obj).__name__}")
    timestamp = _get(obj, "timestamp")
    if not _is_number(timestamp) or not _is_finite(timestamp) or timestamp < 0:
        raise _InvalidLine(f"timestamp must be a finite number >= 0, got {_shown(timestamp)}")
    input_length = _get_int(obj, "input_length", minimum=1)
    output_length = _get_int(obj, "output_length", minimum=1)
    hash_ids = _get(obj, "hash_ids")
    if not isinstance(hash_ids, list) or not all(_is_int(h) and h >= 0 for h in hash_ids):
        raise _InvalidLine(f"hash_ids must be a list of ints >= 0, got {_shown(hash_ids)}")
    expected = _num_blocks(input_length)
    if len(hash_ids) != expected:
        raise _InvalidLine(
            f"hash_ids has {len(hash_ids)} ids, expected ceil(input_length / "
            f"{TRACE_BLOCK_TOKENS}) = {expected}"
        )
    return TraceRequest(timestamp * time_scale, input_length, output_length, tuple(hash_ids))


def _shown(value: object) -> str:
    """`value`'s repr for an error line, cut to 40 characters (a line may hold megabytes)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _get(obj: dict[str, Any], key: str) -> Any:
    if key not in obj:
        raise _InvalidLine(f"missing key {key!r}")
    return obj[key]


def _get_int(obj: dict[str, Any], key: str, *, minimum: int) -> int:
    value = _get(obj, key)
    if not _is_int(value) or value < minimum:
        raise _InvalidLine(f"{key} must be an int >= {minimum}, got {_shown(value)}")
    return int(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is not a count


def _is_number(value: object) -> bool:
    return _is_int(value) or isinstance(value, float)


# ---- Prompt synthesis ------------------------------------------------------------------------


def synthesize_prompt(
    request: TraceRequest,
    *,
    vocab_size: int,
    seed: int = 0,
    min_token_id: int = 0,
    trace_block_tokens: int = TRACE_BLOCK_TOKENS,
) -> list[int]:
    """Deterministic prompt token ids for `request`, input_length of them. Block i is a
    pseudo-random run of `trace_block_tokens` ids in [min_token_id, vocab_size) that depends
    only on (seed, hash_ids[i]) (for a given id range), so requests sharing their first k hash
    ids share exactly their first k * trace_block_tokens tokens, whatever block size an engine
    hashes them with. The run is defined by `_block_tokens_py`. Raises ValueError on an empty
    id range or too few hash_ids."""
    num_blocks, span = _check_synthesis(request, vocab_size, min_token_id, trace_block_tokens)
    if _synth is not None:
        args = (seed, request.hash_ids, request.input_length, trace_block_tokens, min_token_id)
        if span > _MAX_SHARED_INTS:
            return _synth.prompt_tokens(*args, span)
        return _synth.prompt_tokens(*args, span, _shared_ints(min_token_id, span))
    tokens: list[int] = []
    for hash_id in request.hash_ids[:num_blocks]:
        tokens.extend(_block_tokens_py(seed, hash_id, min_token_id, span, trace_block_tokens))
    del tokens[request.input_length :]
    return tokens


def _check_synthesis(
    request: TraceRequest, vocab_size: int, min_token_id: int, trace_block_tokens: int
) -> tuple[int, int]:
    """The trace blocks a prompt takes and the id range's size; ValueError on an empty or
    too wide id range or too few hash_ids."""
    _require(0 <= min_token_id < vocab_size, f"empty id range [{min_token_id}, {vocab_size})")
    _require(trace_block_tokens >= 1, f"trace_block_tokens must be >= 1: {trace_block_tokens}")
    num_blocks = _num_blocks(request.input_length, trace_block_tokens)
    _require(
        len(request.hash_ids) >= num_blocks,
        f"{len(request.hash_ids)} hash_ids cannot cover {request.input_length} tokens",
    )
    span = vocab_size - min_token_id
    _require(span < 1 << 32, f"the id range [{min_token_id}, {vocab_size}) is over 2**32 ids")
    return num_blocks, span


def synthesize_prompt_ids(
    request: TraceRequest,
    *,
    vocab_size: int,
    seed: int = 0,
    min_token_id: int = 0,
    trace_block_tokens: int = TRACE_BLOCK_TOKENS,
) -> array.array[int]:
    """`synthesize_prompt`'s token ids as an array of unsigned 32-bit ints (four bytes a
    token, no int objects; the simulator's prompts, which the engine and the hashing read as
    they are)."""
    _require(vocab_size <= 1 << 32, f"token ids up to {vocab_size - 1} do not fit 32 bits")
    if _synth is None:
        return array.array(
            "I",
            synthesize_prompt(
                request,
                vocab_size=vocab_size,
                seed=seed,
                min_token_id=min_token_id,
                trace_block_tokens=trace_block_tokens,
            ),
        )
    _, span = _check_synthesis(request, vocab_size, min_token_id, trace_block_tokens)
    ids = array.array("I", (0,)) * request.input_length
    _synth.prompt_token_ids_into(
        ids, seed, request.hash_ids, request.input_length, trace_block_tokens, min_token_id, span
    )
    return ids


@lru_cache(maxsize=4)
def _shared_ints(low: int, span: int) -> tuple[int, ...]:
    """The ints low..low + span - 1, made once: synthesized prompts hold references to these
    rather than ints of their own (a prompt's list is then its pointers alone, and making one
    allocates no int)."""
    return tuple(range(low, low + span))


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on uint64 (numpy's uint64 arithmetic wraps mod 2**64)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _block_tokens_py(seed: int, hash_id: int, low: int, span: int, num_tokens: int) -> list[int]:
    """One trace block's token ids (the definition; `armature.workload._synth` computes the
    same in C): the first num_tokens outputs x of SplitMix64 started at
    mix64(mix64(seed) + hash_id), each low + ((x >> 32) * span >> 32); seed and hash_id are
    taken mod 2**64 and span must be below 2**32."""
    seed_key = _mix64(np.array([seed & _MASK64], dtype=np.uint64))
    key = _mix64(seed_key + np.uint64(hash_id & _MASK64))
    steps = np.arange(1, num_tokens + 1, dtype=np.uint64) * np.uint64(_GOLDEN_GAMMA)
    offsets = ((_mix64(key + steps) >> np.uint64(32)) * np.uint64(span)) >> np.uint64(32)
    return [low + offset for offset in offsets.tolist()]


# ---- Synthetic workloads ---------------------------------------------------------------------


def _poisson_arrivals_ms(rng: random.Random, num_arrivals: int, rate_rps: float) -> list[float]:
    """Arrival times of a Poisson process at rate_rps, the first at 0 ms."""
    arrivals_ms: list[float] = []
    now_ms = 0.0
    for i in range(num_arrivals):
        if i:
            now_ms += rng.expovariate(rate_rps) * 1000.0
        arrivals_ms.append(now_ms)
    return arrivals_ms


def synthetic_prefix_groups(
    *,
    num_requests: int,
    num_groups: int,
    shared_prefix_tokens: int,
    unique_tokens: int,
    output_length: int,
    rate_rps: float,
    seed: int,
) -> list[TraceRequest]:
    """Requests in uniformly random groups, each prompt = its group's shared prefix
    (shared_prefix_tokens) + unique_tokens of its own, Poisson arrivals at rate_rps from 0 ms.
    Blocks lying wholly in the shared prefix get the group's ids; the others (the unique tail,
    and a block straddling the boundary) get fresh ids, so once synthesized, group members
    share floor(shared_prefix_tokens / 512) * 512 tokens (all of them when unique_tokens == 0).
    Ids are consecutive from 0: the groups' first, then each request's in arrival order."""
    _require(num_requests >= 0 and num_groups >= 1, "need num_requests >= 0, num_groups >= 1")
    _require(shared_prefix_tokens >= 0 and unique_tokens >= 0, "token counts must be >= 0")
    _require(shared_prefix_tokens + unique_tokens >= 1, "prompts must have >= 1 token")
    _require(output_length >= 1 and rate_rps > 0, "need output_length >= 1, rate_rps > 0")
    rng = random.Random(seed)
    new_ids = itertools.count()
    input_length = shared_prefix_tokens + unique_tokens
    num_shared_blocks = shared_prefix_tokens // TRACE_BLOCK_TOKENS
    if unique_tokens == 0:  # a partial last block is then wholly shared too
        num_shared_blocks = _num_blocks(shared_prefix_tokens)
    num_own_blocks = _num_blocks(input_length) - num_shared_blocks
    group_ids = [_take(new_ids, num_shared_blocks) for _ in range(num_groups)]
    requests = []
    for arrival_ms in _poisson_arrivals_ms(rng, num_requests, rate_rps):
        shared_ids = group_ids[rng.randrange(num_groups)]
        hash_ids = shared_ids + _take(new_ids, num_own_blocks)
        requests.append(TraceRequest(arrival_ms, input_length, output_length, hash_ids))
    return requests


def synthetic_multi_turn(
    *,
    num_sessions: int,
    turns_per_session: int,
    system_prompt_tokens: int,
    turn_tokens: int,
    output_length: int,
    rate_rps: float,
    think_time_ms: float,
    seed: int,
) -> list[TraceRequest]:
    """Chat sessions under one system prompt. Turn k (from 0) of a session sends its whole
    context, system_prompt_tokens + (k + 1) * turn_tokens tokens, each turn appending
    turn_tokens (standing for the previous reply plus the new user message). A full block of
    the context keeps its id from turn to turn (blocks wholly in the system prompt share ids
    across sessions); a partial last block gets a fresh id, since the next turn fills it with
    other tokens. So turn k repeats all of turn k-1's full blocks.
    Sessions start at Poisson arrivals (rate_rps, the first at 0 ms); turn k+1 arrives
    think_time_ms * U(1 - THINK_JITTER_FRACTION, 1 + THINK_JITTER_FRACTION) after turn k.
    Sorted by arrival (stable: ties keep session order)."""
    _require(num_sessions >= 0 and turns_per_session >= 0, "counts must be >= 0")
    _require(system_prompt_tokens >= 0 and turn_tokens >= 1, "need turn_tokens >= 1")
    _require(output_length >= 1 and rate_rps > 0, "need output_length >= 1, rate_rps > 0")
    _require(think_time_ms >= 0, f"think_time_ms must be >= 0, got {think_time_ms}")
    rng = random.Random(seed)
    new_ids = itertools.count()
    system_ids = _take(new_ids, system_prompt_tokens // TRACE_BLOCK_TOKENS)
    requests = []
    for start_ms in _poisson_arrivals_ms(rng, num_sessions, rate_rps):
        context_ids = list(system_ids)  # ids of the session's full context blocks so far
        arrival_ms = start_ms
        for turn in range(turns_per_session):
            if turn:
                jitter = rng.uniform(1 - THINK_JITTER_FRACTION, 1 + THINK_JITTER_FRACTION)
                arrival_ms += think_time_ms * jitter
            input_length = system_prompt_tokens + (turn + 1) * turn_tokens
            num_full_blocks = input_length // TRACE_BLOCK_TOKENS
            context_ids += _take(new_ids, num_full_blocks - len(context_ids))
            partial_ids = _take(new_ids, 1) if input_length % TRACE_BLOCK_TOKENS else ()
            hash_ids = tuple(context_ids) + partial_ids
            requests.append(TraceRequest(arrival_ms, input_length, output_length, hash_ids))
    requests.sort(key=lambda r: r.arrival_ms)
    return requests


def _take(ids: Iterator[int], n: int) -> tuple[int, ...]:
    return tuple(itertools.islice(ids, max(n, 0)))


# ---- Analysis --------------------------------------------------------------------------------


def prefix_hit_ceiling(requests: Sequence[TraceRequest]) -> float:
    """Prefix hit ratio, in blocks, of an infinite cache: over the requests in arrival order
    (stable), the leading hash ids already seen in any earlier request, over all blocks (0.0
    when there are none). A set of seen ids suffices: an id names its block together with all
    the blocks before it."""
    seen: set[int] = set()
    num_hit_blocks = 0
    num_blocks = 0
    for request in sorted(requests, key=lambda r: r.arrival_ms):
        for hash_id in request.hash_ids:
            if hash_id not in seen:
                break
            num_hit_blocks += 1
        num_blocks += len(request.hash_ids)
        seen.update(request.hash_ids)
    return num_hit_blocks / num_blocks if num_blocks else 0.0


def prefix_hit_ceiling_tokens(
    requests: Sequence[TraceRequest],
    block_size: int,
    trace_block_tokens: int = TRACE_BLOCK_TOKENS,
) -> float:
    """Prefix hit ratio, in prompt tokens, of an infinite prefix cache shared by every worker,
    counted as an engine with `block_size`-token blocks counts hits (a replay's
    `prefix_hit_ratio`): over the requests in arrival order (stable), the longest token
    prefix each prompt shares with any earlier one, in whole blocks and at most
    (input_length - 1) // block_size of them (the engine always computes the last token),
    over all prompt tokens (0.0 when there are none).

    Prompts are as `synthesize_prompt` makes them: block i's tokens depend only on
    hash_ids[i], and a shorter (last) block is a prefix of a longer one with the same id, so
    the shared prefix follows from the ids and the most tokens of each id's block seen."""
    seen: dict[int, int] = {}  # hash id -> the most tokens of its block any prompt had
    num_hit_tokens = 0
    num_tokens = 0
    for request in sorted(requests, key=lambda r: r.arrival_ms):
        n = request.input_length
        ids = request.hash_ids[: _num_blocks(n, trace_block_tokens)]
        # every block is whole but a shorter last one; a whole block shares what any prompt
        # had of its id (never more than a whole block), and the walk ends at the first id
        # not seen whole
        num_whole = min(n // trace_block_tokens, len(ids))
        whole = ids[:num_whole]
        last_id = ids[num_whole] if num_whole < len(ids) else None  # the shorter last block
        last = n - num_whole * trace_block_tokens
        shared_tokens = 0
        for hash_id in whole:
            have = seen.get(hash_id, 0)
            shared_tokens += have
            if have < trace_block_tokens:
                break
        else:
            if last_id is not None:
                shared_tokens += min(seen.get(last_id, 0), last)
        num_hit_blocks = min(shared_tokens // block_size, (n - 1) // block_size)
        num_hit_tokens += num_hit_blocks * block_size
        num_tokens += n
        seen.update(dict.fromkeys(whole, trace_block_tokens))
        if last_id is not None:
            seen[last_id] = max(seen.get(last_id, 0), last)
    return num_hit_tokens / num_tokens if num_tokens else 0.0
