"""Request lists for `armature bench`: synthetic lengths, shared-prefix groups, Mooncake
traces (prompt text through TextSynth: equal hash ids, equal tokens) and JSONL prompt files."""

from __future__ import annotations

import json
import random
from pathlib import Path

from armature.bench.client import BenchRequest
from armature.bench.prompts import TextSynth
from armature.errors import ArmatureError
from armature.workload.traces import TraceRequest, read_mooncake_trace

__all__ = [
    "WorkloadError",
    "from_prompts_file",
    "from_trace",
    "multi_turn",
    "prefix_groups",
    "read_trace",
    "synthetic",
]


class WorkloadError(ArmatureError, ValueError):
    """An unreadable or invalid workload file or setting."""


def _length(rng: random.Random, mean: int, spread: float) -> int:
    if spread <= 0:
        return mean
    return max(1, round(rng.uniform(mean * (1 - spread), mean * (1 + spread))))


def synthetic(
    synth: TextSynth, count: int, input_len: int, output_len: int, spread: float, seed: int
) -> list[BenchRequest]:
    """`count` independent prompts; lengths uniform within +-spread (in [0, 1)) of the means."""
    if not 0 <= spread < 1:
        raise WorkloadError(f"--len-spread must be in [0, 1), got {spread}")
    rng = random.Random(seed)
    out = []
    for i in range(count):
        n = _length(rng, input_len, spread)
        out.append(
            BenchRequest(synth.text(n, f"syn:{i}"), _length(rng, output_len, spread), 0.0, n)
        )
    return out


def prefix_groups(
    synth: TextSynth,
    count: int,
    input_len: int,
    output_len: int,
    num_groups: int,
    prefix_ratio: float,
    seed: int,
) -> list[BenchRequest]:
    """Requests in `num_groups` groups; a group's requests share their first
    prefix_ratio * input_len tokens."""
    if not 0 <= prefix_ratio <= 1 or num_groups < 1:
        raise WorkloadError("--prefix-ratio must be in [0, 1] and --prefix-groups >= 1")
    shared = round(input_len * prefix_ratio)
    rng = random.Random(seed)
    out = []
    for i in range(count):
        group = rng.randrange(num_groups)
        ids = synth.token_ids(shared, f"group:{group}") + synth.token_ids(
            input_len - shared, f"own:{i}"
        )
        out.append(BenchRequest(synth.decode(ids), output_len, 0.0, input_len))
    return out


def multi_turn(
    synth: TextSynth, num_sessions: int, turns: int, turn_len: int, output_len: int, seed: int
) -> list[BenchRequest]:
    """`num_sessions` conversations of `turns` user turns of `turn_len` tokens; every turn
    resends the whole conversation so far (the server's answers included)."""
    if turns < 1:
        raise WorkloadError("--multi-turn needs at least one turn")
    out = []
    for session in range(num_sessions):
        texts = [synth.text(turn_len, f"s{seed}:{session}:{t}") for t in range(turns)]
        out.append(BenchRequest(texts[0], output_len, 0.0, turn_len, followups=tuple(texts[1:])))
    return out


def read_trace(path: Path, limit: int | None, time_scale: float) -> list[TraceRequest]:
    """The first `limit` requests of the Mooncake trace at `path`, sorted by arrival."""
    try:
        return read_mooncake_trace(path, limit=limit, time_scale=time_scale)
    except OSError as exc:
        raise WorkloadError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise WorkloadError(str(exc)) from None


def from_trace(synth: TextSynth, trace: list[TraceRequest]) -> list[BenchRequest]:
    """The trace's requests with their prompts synthesized (equal hash ids, equal text)."""
    return [
        BenchRequest(synth.trace_text(r), r.output_length, r.arrival_ms / 1000, r.input_length)
        for r in trace
    ]


def from_prompts_file(path: Path, default_max_tokens: int) -> list[BenchRequest]:
    """JSONL: {"prompt": "...", "max_tokens": 64} per line (max_tokens optional)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise WorkloadError(f"cannot read prompts file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise WorkloadError(
            f"prompts file {path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
            f"offset {exc.start})"
        ) from None
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            prompt = item["prompt"]
            max_tokens = int(item.get("max_tokens", default_max_tokens))
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError):
            raise WorkloadError(
                f'{path}:{number}: expected {{"prompt": str, "max_tokens": int}}'
            ) from None
        if not isinstance(prompt, str) or max_tokens < 1:
            raise WorkloadError(f"{path}:{number}: prompt must be text and max_tokens >= 1")
        out.append(BenchRequest(prompt, max_tokens))
    if not out:
        raise WorkloadError(f"{path} holds no prompts")
    return out
