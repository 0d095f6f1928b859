"""Mooncake trace reader, prompt synthesis, synthetic workloads and the prefix-hit ceiling."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from armature.workload.traces import (
    TRACE_BLOCK_TOKENS,
    TraceFormatError,
    TraceRequest,
    prefix_hit_ceiling,
    prefix_hit_ceiling_tokens,
    read_mooncake_trace,
    synthesize_prompt,
    synthetic_multi_turn,
    synthetic_prefix_groups,
)

# The repo root's sibling shared/ (CI checks ../shared out beside the clone).
TRACES_DIR = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "traces"


def _line(timestamp: object, input_length: object, output_length: object, ids: object) -> str:
    return json.dumps(
        {
            "timestamp": timestamp,
            "input_length": input_length,
            "output_length": output_length,
            "hash_ids": ids,
        }
    )


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# ---- read_mooncake_trace ---------------------------------------------------------------------

VALID_LINES = [
    _line(200, 1024, 10, [1, 2]),
    "",
    _line(100, 513, 5, [1, 3]),
    "   ",
    _line(200, 1, 1, [7]),  # ties with the first line: stays after it
    json.dumps(
        {
            "timestamp": 50.5,
            "input_length": 512,
            "output_length": 2,
            "hash_ids": [1],
            "extra": "ignored",
        }
    ),
]


def test_read_parses_and_sorts_by_arrival_stably(tmp_path: Path) -> None:
    requests = read_mooncake_trace(_write(tmp_path, VALID_LINES))
    assert requests == [
        TraceRequest(50.5, 512, 2, (1,)),
        TraceRequest(100.0, 513, 5, (1, 3)),
        TraceRequest(200.0, 1024, 10, (1, 2)),
        TraceRequest(200.0, 1, 1, (7,)),
    ]


def test_read_time_scale_multiplies_timestamps(tmp_path: Path) -> None:
    requests = read_mooncake_trace(_write(tmp_path, VALID_LINES), time_scale=0.5)
    assert [r.arrival_ms for r in requests] == [25.25, 50.0, 100.0, 100.0]


def test_read_limit_takes_the_first_requests_of_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, VALID_LINES)
    assert read_mooncake_trace(path, limit=2) == [
        TraceRequest(100.0, 513, 5, (1, 3)),
        TraceRequest(200.0, 1024, 10, (1, 2)),
    ]
    assert read_mooncake_trace(path, limit=0) == []
    assert len(read_mooncake_trace(path, limit=99)) == 4


def test_read_limit_stops_before_a_later_bad_line(tmp_path: Path) -> None:
    path = _write(tmp_path, [_line(0, 1, 1, [0]), "not json"])
    assert read_mooncake_trace(path, limit=1) == [TraceRequest(0.0, 1, 1, (0,))]


@pytest.mark.parametrize(
    ("bad_line", "reason"),
    [
        (
            "{not json",
            "invalid JSON: Expecting property name enclosed in double quotes at column 2",
        ),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"input_length": 1, "output_length": 1, "hash_ids": [0]}', "missing key 'timestamp'"),
        ('{"timestamp": 0, "output_length": 1, "hash_ids": [0]}', "missing key 'input_length'"),
        ('{"timestamp": 0, "input_length": 1, "hash_ids": [0]}', "missing key 'output_length'"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 1}', "missing key 'hash_ids'"),
        (_line("5", 1, 1, [0]), "timestamp must be a finite number >= 0, got '5'"),
        (_line(-1, 1, 1, [0]), "timestamp must be a finite number >= 0, got -1"),
        (_line(float("nan"), 1, 1, [0]), "timestamp must be a finite number >= 0, got nan"),
        (_line(True, 1, 1, [0]), "timestamp must be a finite number >= 0, got True"),
        (_line(0, 0, 1, []), "input_length must be an int >= 1, got 0"),
        (_line(0, 1.5, 1, [0]), "input_length must be an int >= 1, got 1.5"),
        (_line(0, True, 1, [0]), "input_length must be an int >= 1, got True"),
        (_line(0, 1, 0, [0]), "output_length must be an int >= 1, got 0"),
        (_line(0, 1, None, [0]), "output_length must be an int >= 1, got None"),
        (_line(0, 1, 1, {"0": 1}), "hash_ids must be a list of ints >= 0, got {'0': 1}"),
        (_line(0, 1, 1, ["a"]), "hash_ids must be a list of ints >= 0, got ['a']"),
        (_line(0, 1, 1, [-1]), "hash_ids must be a list of ints >= 0, got [-1]"),
        (_line(0, 513, 1, [0]), "hash_ids has 1 ids, expected ceil(input_length / 512) = 2"),
        (_line(0, 512, 1, [0, 1]), "hash_ids has 2 ids, expected ceil(input_length / 512) = 1"),
        # values cut to 40 characters: a line may hold megabytes
        (
            _line(0, 1, 1, [-1] * 200_000),
            "hash_ids must be a list of ints >= 0, got [" + "-1, " * 9 + "...",
        ),
        (_line(0, "x" * 100, 1, [0]), "input_length must be an int >= 1, got '" + "x" * 36 + "..."),
    ],
)
def test_read_error_names_file_and_line(tmp_path: Path, bad_line: str, reason: str) -> None:
    path = _write(tmp_path, [_line(0, 1, 1, [0]), "", bad_line, "also bad"])
    with pytest.raises(TraceFormatError) as info:
        read_mooncake_trace(path)
    assert str(info.value) == f"{path}:3: {reason}"


def test_read_error_on_non_utf8_bytes(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(_line(0, 1, 1, [0]).encode() + b"\n\xff\xfe\xfa\n")
    with pytest.raises(TraceFormatError, match=r"trace\.jsonl:2: invalid JSON: not UTF-8 text$"):
        read_mooncake_trace(path)


def test_trace_format_error_is_a_value_error() -> None:
    assert issubclass(TraceFormatError, ValueError)


@pytest.mark.parametrize(
    "kwargs",
    [{"limit": -1}, {"time_scale": 0.0}, {"time_scale": -1.0}, {"time_scale": float("inf")}],
)
def test_read_rejects_bad_arguments(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        read_mooncake_trace(_write(tmp_path, VALID_LINES), **kwargs)


# ---- synthesize_prompt -----------------------------------------------------------------------


def test_synthesize_pins_exact_tokens() -> None:
    # Golden values: a change here changes every synthesized workload's tokens (not the
    # replays' counts, which depend on which blocks are equal). Block of hash id h: SplitMix64
    # from mix64(mix64(seed) + h), each output x as min_token_id + (x >> 32) * span >> 32
    # (checked by hand with Python ints in test_synth_native).
    request = TraceRequest(0.0, 8, 1, (0,))
    assert synthesize_prompt(request, vocab_size=1000) == [883, 431, 26, 970, 106, 327, 173, 771]
    assert synthesize_prompt(request, vocab_size=1000, seed=1) == [
        255, 88, 290, 566, 691, 546, 212, 409,
    ]  # fmt: skip
    small = TraceRequest(0.0, 10, 1, (7, 8, 9))
    assert synthesize_prompt(small, vocab_size=50, trace_block_tokens=4) == [
        26, 15, 47, 44, 46, 45, 46, 40, 10, 24,
    ]  # fmt: skip


def test_synthesize_equal_id_prefixes_give_equal_token_prefixes() -> None:
    a = synthesize_prompt(TraceRequest(0.0, 1500, 1, (1, 2, 3)), vocab_size=32000)
    b = synthesize_prompt(TraceRequest(0.0, 1400, 1, (1, 2, 4)), vocab_size=32000)
    assert _common_prefix_len(a, b) == 2 * TRACE_BLOCK_TOKENS


def test_synthesize_block_depends_only_on_seed_and_id_not_position() -> None:
    a = synthesize_prompt(TraceRequest(0.0, 1024, 1, (5, 6)), vocab_size=32000)
    b = synthesize_prompt(TraceRequest(0.0, 1024, 1, (6, 5)), vocab_size=32000)
    assert a[512:] == b[:512]
    assert a[:512] == b[512:]
    assert a[:512] != a[512:]


def test_synthesize_different_ids_differ_from_the_first_token() -> None:
    a = synthesize_prompt(TraceRequest(0.0, 512, 1, (1,)), vocab_size=32000)
    b = synthesize_prompt(TraceRequest(0.0, 512, 1, (2,)), vocab_size=32000)
    assert _common_prefix_len(a, b) == 0


def test_synthesize_length_is_input_length_with_a_partial_last_block() -> None:
    for input_length in (1, 511, 512, 513, 1100):
        request = TraceRequest(0.0, input_length, 1, tuple(range(-(-input_length // 512))))
        assert len(synthesize_prompt(request, vocab_size=100)) == input_length
    # the partial block is the full block's prefix
    full = synthesize_prompt(TraceRequest(0.0, 1024, 1, (3, 4)), vocab_size=100)
    part = synthesize_prompt(TraceRequest(0.0, 700, 1, (3, 4)), vocab_size=100)
    assert part == full[:700]


def test_synthesize_ids_lie_in_range() -> None:
    tokens = synthesize_prompt(
        TraceRequest(0.0, 1024, 1, (0, 1)), vocab_size=8, min_token_id=5, seed=3
    )
    assert set(tokens) == {5, 6, 7}


def test_synthesize_is_deterministic_by_seed() -> None:
    request = TraceRequest(0.0, 1300, 1, (10, 11, 12))
    first = synthesize_prompt(request, vocab_size=32000, seed=7)
    assert synthesize_prompt(request, vocab_size=32000, seed=7) == first
    other_seed = synthesize_prompt(request, vocab_size=32000, seed=8)
    assert _common_prefix_len(first, other_seed) == 0


def test_synthesize_result_is_a_fresh_list() -> None:
    request = TraceRequest(0.0, 4, 1, (0,))
    tokens = synthesize_prompt(request, vocab_size=100)
    tokens[0] = -1
    assert synthesize_prompt(request, vocab_size=100)[0] != -1


def test_synthesize_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="cannot cover"):
        synthesize_prompt(TraceRequest(0.0, 513, 1, (0,)), vocab_size=100)
    with pytest.raises(ValueError, match="empty id range"):
        synthesize_prompt(TraceRequest(0.0, 1, 1, (0,)), vocab_size=5, min_token_id=5)
    with pytest.raises(ValueError, match="trace_block_tokens"):
        synthesize_prompt(TraceRequest(0.0, 1, 1, (0,)), vocab_size=5, trace_block_tokens=0)
    with pytest.raises(ValueError, match="over 2"):
        synthesize_prompt(TraceRequest(0.0, 1, 1, (0,)), vocab_size=(1 << 32) + 1)


# ---- synthetic_prefix_groups -----------------------------------------------------------------


def _groups(**overrides: Any) -> list[TraceRequest]:
    kwargs: dict[str, Any] = {
        "num_requests": 40,
        "num_groups": 3,
        "shared_prefix_tokens": 1024,
        "unique_tokens": 300,
        "output_length": 16,
        "rate_rps": 10.0,
        "seed": 0,
    }
    kwargs.update(overrides)
    return synthetic_prefix_groups(**kwargs)


def test_groups_are_deterministic_by_seed() -> None:
    assert _groups() == _groups()
    assert _groups() != _groups(seed=1)


def test_groups_counts_lengths_and_sorted_poisson_arrivals() -> None:
    requests = _groups()
    assert len(requests) == 40
    assert {(r.input_length, r.output_length) for r in requests} == {(1324, 16)}
    arrivals = [r.arrival_ms for r in requests]
    assert arrivals[0] == 0.0
    assert arrivals == sorted(arrivals)
    many = _groups(num_requests=4000, rate_rps=20.0)
    gaps = [b.arrival_ms - a.arrival_ms for a, b in itertools.pairwise(many)]
    assert statistics.mean(gaps) == pytest.approx(50.0, rel=0.05)


def test_groups_hash_ids_share_group_blocks_and_number_the_rest_fresh() -> None:
    requests = _groups()
    # group g owns ids (2g, 2g + 1); request i's own (third) block gets id 6 + i
    assert {r.hash_ids[:2] for r in requests} == {(0, 1), (2, 3), (4, 5)}
    assert [r.hash_ids[2] for r in requests] == list(range(6, 46))


def test_groups_members_share_exactly_the_shared_prefix_tokens() -> None:
    requests = _groups()
    prompts = [synthesize_prompt(r, vocab_size=32000) for r in requests]
    for i in range(1, len(requests)):
        same_group = requests[i].hash_ids[:2] == requests[0].hash_ids[:2]
        expected = 1024 if same_group else 0
        assert _common_prefix_len(prompts[0], prompts[i]) == expected


def test_groups_block_straddling_the_boundary_gets_a_fresh_id() -> None:
    requests = _groups(num_groups=1, num_requests=3, shared_prefix_tokens=700, unique_tokens=400)
    assert [r.hash_ids for r in requests] == [(0, 1, 2), (0, 3, 4), (0, 5, 6)]
    a, b = (synthesize_prompt(r, vocab_size=32000) for r in requests[:2])
    assert _common_prefix_len(a, b) == 512  # the shared prefix floored to a block


def test_groups_without_unique_tokens_share_the_partial_block_too() -> None:
    requests = _groups(num_groups=1, num_requests=3, shared_prefix_tokens=700, unique_tokens=0)
    assert [r.hash_ids for r in requests] == [(0, 1)] * 3


def test_groups_reject_bad_arguments() -> None:
    for overrides in (
        {"num_groups": 0},
        {"num_requests": -1},
        {"shared_prefix_tokens": 0, "unique_tokens": 0},
        {"rate_rps": 0.0},
        {"output_length": 0},
    ):
        with pytest.raises(ValueError):
            _groups(**overrides)


# ---- synthetic_multi_turn --------------------------------------------------------------------


def _multi_turn(**overrides: Any) -> list[TraceRequest]:
    kwargs: dict[str, Any] = {
        "num_sessions": 2,
        "turns_per_session": 3,
        "system_prompt_tokens": 600,
        "turn_tokens": 300,
        "output_length": 8,
        "rate_rps": 1.0,
        "think_time_ms": 0.0,
        "seed": 0,
    }
    kwargs.update(overrides)
    return synthetic_multi_turn(**kwargs)


def test_multi_turn_pins_lengths_and_hash_ids() -> None:
    # With no think time a session's turns tie, so the stable sort keeps each session together.
    requests = _multi_turn()
    assert [(r.input_length, r.hash_ids) for r in requests] == [
        (900, (0, 1)),  # system block 0, then a partial block
        (1200, (0, 2, 3)),  # block 1 is now full (fresh id 2); partial block 3
        (1500, (0, 2, 4)),
        (900, (0, 5)),  # the next session shares only the system prompt's full block
        (1200, (0, 6, 7)),
        (1500, (0, 6, 8)),
    ]
    assert {r.output_length for r in requests} == {8}


def test_multi_turn_is_deterministic_by_seed() -> None:
    kwargs = {"think_time_ms": 1000.0, "num_sessions": 5}
    assert _multi_turn(**kwargs) == _multi_turn(**kwargs)
    assert _multi_turn(**kwargs) != _multi_turn(**kwargs, seed=1)


def test_multi_turn_prefix_grows_and_repeats_previous_full_blocks() -> None:
    turns = 6
    requests = _multi_turn(
        num_sessions=4, turns_per_session=turns, system_prompt_tokens=1100, turn_tokens=450
    )
    assert len(requests) == 4 * turns
    for s in range(4):
        session = requests[s * turns : (s + 1) * turns]
        assert [r.input_length for r in session] == [1100 + 450 * (k + 1) for k in range(turns)]
        assert all(r.hash_ids[:2] == (0, 1) for r in session)  # the system prompt's full blocks
        prompts = [synthesize_prompt(r, vocab_size=32000) for r in session]
        for prev, cur, prev_prompt, cur_prompt in zip(
            session, session[1:], prompts, prompts[1:], strict=False
        ):
            num_full = prev.input_length // TRACE_BLOCK_TOKENS
            assert cur.hash_ids[:num_full] == prev.hash_ids[:num_full]
            assert cur.hash_ids[num_full] != prev.hash_ids[num_full]  # the old partial block
            assert _common_prefix_len(prev_prompt, cur_prompt) == num_full * TRACE_BLOCK_TOKENS
    # every trailing partial block has an id used nowhere else
    partial_ids = [r.hash_ids[-1] for r in requests if r.input_length % TRACE_BLOCK_TOKENS]
    all_ids = [h for r in requests for h in r.hash_ids]
    assert all(all_ids.count(h) == 1 for h in partial_ids)


def test_multi_turn_arrivals_sorted_with_jittered_think_time() -> None:
    # Sessions far apart (mean 1000 s) so each session's turns are adjacent after sorting.
    requests = _multi_turn(num_sessions=5, turns_per_session=4, rate_rps=0.001, think_time_ms=1000)
    arrivals = [r.arrival_ms for r in requests]
    assert arrivals[0] == 0.0
    assert arrivals == sorted(arrivals)
    gaps = [arrivals[i + 1] - arrivals[i] for i in range(len(arrivals) - 1) if (i + 1) % 4]
    assert len(gaps) == 15
    assert all(750.0 <= g <= 1250.0 for g in gaps)
    assert len(set(gaps)) == 15  # jittered, not constant


def test_multi_turn_interleaves_sessions_by_arrival() -> None:
    requests = _multi_turn(num_sessions=20, turns_per_session=3, rate_rps=5.0, think_time_ms=2000)
    arrivals = [r.arrival_ms for r in requests]
    assert arrivals == sorted(arrivals)
    lengths = [r.input_length for r in requests]
    assert lengths != [900, 1200, 1500] * 20  # not session after session
    assert lengths[:2] == [900, 900]


# ---- prefix_hit_ceiling ----------------------------------------------------------------------


def _req(arrival_ms: float, *ids: int) -> TraceRequest:
    return TraceRequest(arrival_ms, len(ids) * TRACE_BLOCK_TOKENS, 1, ids)


def test_ceiling_counts_leading_seen_ids() -> None:
    requests = [_req(0, 1, 2, 3), _req(1, 1, 2, 4), _req(2, 1, 2, 4, 5)]
    assert prefix_hit_ceiling(requests) == 5 / 10  # 0 + 2 + 3 hits


def test_ceiling_stops_at_the_first_miss() -> None:
    assert prefix_hit_ceiling([_req(0, 1, 2, 3), _req(1, 9, 2, 3)]) == 0.0


def test_ceiling_follows_arrival_order_not_list_order() -> None:
    # In arrival order (1, 2) comes first, so the later (2,) hits; in list order nothing would.
    assert prefix_hit_ceiling([_req(5, 2), _req(0, 1, 2)]) == 1 / 3


def test_ceiling_of_nothing_is_zero() -> None:
    assert prefix_hit_ceiling([]) == 0.0
    assert prefix_hit_ceiling([_req(0)]) == 0.0


def test_ceiling_of_synthetic_workloads() -> None:
    # 40 requests in 3 groups of 2 shared blocks + 1 own block: each group misses its 2 shared
    # blocks once, every own block misses.
    requests = _groups()
    num_groups_used = len({r.hash_ids[:2] for r in requests})
    assert prefix_hit_ceiling(requests) == (40 * 2 - 2 * num_groups_used) / (40 * 3)
    # 2 sessions x 3 turns (pinned above): hits 0+1+2 and 1+1+2 over 16 blocks
    assert prefix_hit_ceiling(_multi_turn()) == 7 / 16


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "num_requests", "ceiling"),
    [("conversation_trace.jsonl", 12031, 0.366), ("synthetic_trace.jsonl", 3993, 0.640)],
)
def test_ceiling_of_the_real_mooncake_traces(name: str, num_requests: int, ceiling: float) -> None:
    path = TRACES_DIR / name
    if not path.exists():
        pytest.skip(f"{path} not present (needs the shared/ checkout beside the repo)")
    requests = read_mooncake_trace(path)
    assert len(requests) == num_requests
    assert round(prefix_hit_ceiling(requests), 3) == ceiling


def test_token_ceiling_counts_whole_engine_blocks_of_the_shared_prefix() -> None:
    """Trace blocks of 512 tokens, engine blocks of 16 (hand-worked):
    r0 [1, 2] 1,024 tokens: nothing before it, 0 hits.
    r1 [1, 3] 1,000 tokens: shares block 1 (512 tokens) = 32 engine blocks, 512 hits.
    r2 [1, 3] 1,000 tokens: shares all 1,000, capped at (1,000 - 1) // 16 = 62 blocks, 992.
    r3 [1, 3] 1,030 tokens (3 full, one 6-token block 4): id 3 was seen with 488 tokens only,
       so 512 + 488 = 1,000 shared tokens, 62 whole blocks, 992 hits."""
    requests = [
        TraceRequest(0.0, 1024, 1, (1, 2)),
        TraceRequest(1.0, 1000, 1, (1, 3)),
        TraceRequest(2.0, 1000, 1, (1, 3)),
        TraceRequest(3.0, 1030, 1, (1, 3, 4)),
    ]
    num_hits = 0 + 512 + 992 + 992
    assert prefix_hit_ceiling_tokens(requests, 16) == num_hits / (1024 + 1000 + 1000 + 1030)
    assert prefix_hit_ceiling_tokens([], 16) == 0.0


def _token_ceiling_reference(
    requests: list[TraceRequest], block_size: int, trace_block_tokens: int
) -> float:
    """prefix_hit_ceiling_tokens as first written: every block's length listed, each id's
    most tokens kept with max (the reference for the walk that knows all but the last block
    is whole)."""
    seen: dict[int, int] = {}
    num_hit_tokens = num_tokens = 0
    for request in sorted(requests, key=lambda r: r.arrival_ms):
        n = request.input_length
        lengths = [
            min(trace_block_tokens, n - i * trace_block_tokens)
            for i in range(-(-n // trace_block_tokens))
        ]
        shared_tokens = 0
        for hash_id, length in zip(request.hash_ids, lengths, strict=False):
            have = seen.get(hash_id, 0)
            shared_tokens += min(have, length)
            if have < length:
                break
        num_hit_tokens += min(shared_tokens // block_size, (n - 1) // block_size) * block_size
        num_tokens += n
        for hash_id, length in zip(request.hash_ids, lengths, strict=False):
            seen[hash_id] = max(seen.get(hash_id, 0), length)
    return num_hit_tokens / num_tokens if num_tokens else 0.0


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 200),  # input length
            st.lists(st.integers(0, 6), max_size=12),  # hash ids: few, so prompts share
            st.integers(0, 5),  # arrival
        ),
        max_size=12,
    ),
    st.sampled_from([1, 4, 16]),
    st.sampled_from([8, 32]),
)
def test_token_ceiling_equals_the_reference(
    shapes: list[tuple[int, list[int], int]], block_size: int, trace_block_tokens: int
) -> None:
    """Any lengths, hash ids shorter or longer than the prompt's blocks, ids repeated within
    a prompt, ties in arrival: the same ratio as the reference, to the bit."""
    requests = [TraceRequest(float(t), n, 1, tuple(ids)) for n, ids, t in shapes]
    assert prefix_hit_ceiling_tokens(
        requests, block_size, trace_block_tokens
    ) == _token_ceiling_reference(requests, block_size, trace_block_tokens)


def test_token_ceiling_follows_arrival_order() -> None:
    """Two prompts sharing trace block 7: the 1,024-token one first, the 512-token one hits
    all but its last block ((512 - 1) // 16 = 31 blocks, 496 tokens); the other way round,
    the long one hits the whole 512 (32 blocks)."""
    long = TraceRequest(0.0, 1024, 1, (7, 8))
    short = TraceRequest(1.0, 512, 1, (7,))
    assert prefix_hit_ceiling_tokens([short, long], 16) == 496 / 1536  # sorted by arrival
    early_short = TraceRequest(-1.0, 512, 1, (7,))
    assert prefix_hit_ceiling_tokens([long, early_short], 16) == 512 / 1536
