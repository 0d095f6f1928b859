"""KV routing cost, worker selection (the native softmax draw against the Python one, and the
fallback without the extension) and active-load tracking."""

from __future__ import annotations

import math
import random
from collections import Counter
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from armature.router.cost import (
    cost_terms,
    fair_ties_py,
    select_worker,
    softmax_pick_py,
    within_capacity_py,
    worker_logits,
    worker_logits_py,
)
from armature.router.holder_store import has_native_index
from armature.router.load import ActiveLoad, WorkerLoad
from without_extension import run_without

if has_native_index():
    from armature.router._index import fair_ties, softmax_pick, within_capacity
    from armature.router._index import worker_logits as native_worker_logits


def _none(worker_index: int) -> int:
    return 0


def test_worked_example_w2_wins() -> None:
    # isl 128 tokens = 8 blocks of 16. W1: no overlap, 2 active blocks -> 8 + 10.
    # W2: 3 cached blocks, idle -> 5 + 5. W3: 6 cached blocks, 7 active blocks -> 2 + 9.
    assert cost_terms(128, 16, 0, WorkerLoad(0, 2, 1)) == (8.0, 10.0)
    assert cost_terms(128, 16, 3, WorkerLoad()) == (5.0, 5.0)
    assert cost_terms(128, 16, 6, WorkerLoad(0, 7, 3)) == (2.0, 9.0)
    logits = worker_logits(
        ["W1", "W2", "W3"],
        128,
        16,
        overlaps={"W2": 3, "W3": 6},
        loads={"W1": WorkerLoad(0, 2, 1), "W3": WorkerLoad(0, 7, 3)},
    )
    assert logits == [18.0, 10.0, 11.0]
    assert select_worker(logits, _none, 0.0, random.Random(0)) == 1


def test_idle_workers_share_the_formula() -> None:
    logits = worker_logits(["a", "b"], 100, 16, overlaps={}, loads={"b": WorkerLoad()})
    prefill, decode = cost_terms(100, 16, 0, WorkerLoad())
    assert logits == [prefill + decode, prefill + decode] == [100 / 16 + 7, 100 / 16 + 7]


def test_overlap_weight_and_prefill_load_shift_the_choice() -> None:
    loads = {"A": WorkerLoad(active_prefill_tokens=64)}
    logits = worker_logits(["A", "B"], 64, 16, overlaps={"A": 2}, loads=loads, overlap_weight=2.0)
    # A: prefill (64 - 32 + 64) / 16 = 6, decode 2 -> 14; B: prefill 4, decode 4 -> 12
    assert logits == [14.0, 12.0]
    assert select_worker(logits, _none, 0.0, random.Random(0)) == 1


def test_ties_go_to_the_fewest_cached_blocks_then_random() -> None:
    tied = [2.0, 2.0, 2.0, 5.0]
    assert select_worker(tied, [5, 1, 3, 0].__getitem__, 0.0, random.Random(0)) == 1
    picks = Counter(
        select_worker(tied, [1, 1, 9, 0].__getitem__, 0.0, random.Random(seed))
        for seed in range(200)
    )
    assert set(picks) == {0, 1}
    asked: list[int] = []
    select_worker([1.0, 2.0], lambda i: asked.append(i) or 0, 0.0, random.Random(0))
    assert asked == []  # no tie: no cached-block lookups


def test_temperature_samples_softmax_of_range_normalized_logits() -> None:
    logits = [10.0, 15.0, 20.0]
    temperature = 0.5
    weights = [math.exp(-n / temperature) for n in (0.0, 0.5, 1.0)]
    expected = [w / sum(weights) for w in weights]
    rng = random.Random(1234)
    n = 20000
    counts = Counter(select_worker(logits, _none, temperature, rng) for _ in range(n))
    for index, p in enumerate(expected):
        assert counts[index] / n == pytest.approx(p, abs=0.015)


def test_equal_logits_with_temperature_are_uniform() -> None:
    rng = random.Random(7)
    counts = Counter(select_worker([3.0, 3.0], _none, 1.0, rng) for _ in range(4000))
    assert counts[0] / 4000 == pytest.approx(0.5, abs=0.04)


def test_no_workers_is_an_error() -> None:
    with pytest.raises(ValueError, match="no workers"):
        select_worker([], _none, 0.0, random.Random(0))


def test_load_follows_a_request_through_every_ending() -> None:
    load = ActiveLoad()
    load.start("r1", "w", prefill_tokens=100, blocks=7)
    load.start("r2", "w", prefill_tokens=50, blocks=4)
    assert load.get("w") == WorkerLoad(150, 11, 2)
    load.first_token("r1")
    load.first_token("r1")  # idempotent
    assert load.get("w") == WorkerLoad(50, 11, 2)
    load.finish("r2")  # cancelled before its first token
    assert load.get("w") == WorkerLoad(0, 7, 1)
    load.finish("r1")
    load.finish("r1")  # idempotent
    assert load.get("w") == WorkerLoad()
    assert load.get_num_tracked() == 0
    with pytest.raises(ValueError, match="already tracked"):
        load.start("r3", "w", 1, 1)
        load.start("r3", "w", 1, 1)


def test_decode_weight_discounts_active_blocks() -> None:
    # The worked example with decode_weight 0.25: W3's 7 active blocks count as 1.75, so its
    # 6 cached blocks now win: W1 8 + 8.5, W2 5 + 5, W3 2 + 3.75.
    loads = {"W1": WorkerLoad(0, 2, 1), "W3": WorkerLoad(0, 7, 3)}
    overlaps = {"W2": 3, "W3": 6}
    assert cost_terms(128, 16, 6, WorkerLoad(0, 7, 3), decode_weight=0.25) == (2.0, 3.75)
    logits = worker_logits(["W1", "W2", "W3"], 128, 16, overlaps, loads, decode_weight=0.25)
    assert logits == [16.5, 10.0, 5.75]
    assert select_worker(logits, _none, 0.0, random.Random(0)) == 2
    assert worker_logits(["W1", "W2", "W3"], 128, 16, overlaps, loads) == [18.0, 10.0, 11.0]


@given(
    st.lists(st.floats(min_value=0, max_value=1e4), min_size=1, max_size=70),
    st.sampled_from([0.001, 0.01, 0.1, 1.0, 5.0]),
    st.integers(min_value=0, max_value=2**32),
)
def test_sampling_draws_what_random_choices_would(
    logits: list[float], temperature: float, seed: int
) -> None:
    """The softmax draw is `rng.choices` over the normalized weights, with the same one
    `random()` (the router's sampling is reproducible from its seed)."""
    low, span = min(logits), max(logits) - min(logits)
    normalized = [(logit - low) / span if span > 0 else 0.0 for logit in logits]
    weights = [math.exp(-n / temperature) for n in normalized]
    expected = random.Random(seed).choices(range(len(logits)), weights=weights, k=1)[0]
    assert select_worker(logits, _none, temperature, random.Random(seed)) == expected


@pytest.mark.skipif(not has_native_index(), reason="armature.router._index was not built")
@given(
    st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=300),
    st.sampled_from([0.001, 0.01, 0.1, 1.0, 5.0]),
    st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_native_softmax_draw_is_the_python_draw(
    logits: list[float], temperature: float, u: float
) -> None:
    """The C draw does the reference's float operations in its order: the same index for
    every `u` (over 256 logits it leaves its stack buffer)."""
    assert softmax_pick(logits, temperature, u) == softmax_pick_py(logits, temperature, u)


NAMES = [f"w{i}" for i in range(12)]
LOADS = st.builds(WorkerLoad, st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 64))
OVERLAPS = st.one_of(st.integers(0, 5000), st.floats(0, 5000))  # weighted overlaps are floats


@pytest.mark.skipif(not has_native_index(), reason="armature.router._index was not built")
@given(
    st.lists(st.sampled_from(NAMES), min_size=1, max_size=12, unique=True),
    st.integers(0, 80_000),
    st.sampled_from([1, 16, 64]),
    st.dictionaries(st.sampled_from(NAMES), OVERLAPS),
    st.dictionaries(st.sampled_from(NAMES), LOADS),
    st.sampled_from([1.0, 0.5, 2.0, 1]),
    st.sampled_from([1.0, 0.5, 0.0, 0.25]),
    st.booleans(),
)
def test_native_logits_are_the_python_logits(
    workers: list[str],
    isl_tokens: int,
    block_size: int,
    overlaps: dict[str, float],
    loads: dict[str, WorkerLoad],
    overlap_weight: float,
    decode_weight: float,
    as_view: bool,
) -> None:
    """The C cost does the reference's float operations in its order (ints exactly): equal
    logits, for plain dicts and for the read-only view ActiveLoad gives."""
    view = MappingProxyType(loads) if as_view else loads
    args = (workers, isl_tokens, block_size, overlaps, view, overlap_weight, decode_weight)
    assert native_worker_logits(*args) == worker_logits_py(*args)


def test_capacity_and_fair_ties_by_hand() -> None:
    """Counts 5, 1, 3, 3 (12 decisions): bound 1.05 gives capacity ceil(1.05 x 13 / 4) = 4,
    which the first worker is at; at bound 1 (fair share) ceil(13 / 4) = 4 too. Of the
    logits 10, 10.1, 10, 20 (range 10), temperature 0.02 holds near-ties up to 10.2: the
    first three, of which the last two are below their fair share."""
    counts, logits = [5, 1, 3, 3], [10.0, 10.1, 10.0, 20.0]
    assert within_capacity_py(counts, 1.05) == [1, 2, 3]
    assert within_capacity_py([3, 3, 3, 3], 1.05) is None  # capacity 4: nobody at it
    assert fair_ties_py(logits, counts, 0.02) == [1, 2]
    assert fair_ties_py(logits, counts, 0.0) == [2]  # exact ties only
    assert fair_ties_py([10.0, 20.0, 20.0, 20.0], counts, 0.0) is None  # none below is a tie
    assert fair_ties_py(logits, [3, 3, 3, 3], 0.02) is None  # nobody at the fair share


COUNTS = st.lists(st.integers(0, 2_000), min_size=1, max_size=300)


@pytest.mark.skipif(not has_native_index(), reason="armature.router._index was not built")
@given(COUNTS, st.sampled_from([1.0, 1.05, 1.08, 1.5, 2.0, 3]))
def test_native_capacity_is_the_python_capacity(counts: list[int], bound: float) -> None:
    """The same indexes (or None) for any counts, over 256 of them too (the heap buffers)."""
    assert within_capacity(counts, bound) == within_capacity_py(counts, bound)


@pytest.mark.skipif(not has_native_index(), reason="armature.router._index was not built")
@given(
    st.lists(
        st.tuples(st.integers(0, 2_000), st.sampled_from([0.0, 1.5, 7.25, 100.0, 101.0])),
        min_size=1,
        max_size=300,
    ),
    st.sampled_from([0.0, 0.01, 0.02, 0.5, 1.0]),
)
def test_native_fair_ties_are_the_python_ones(
    pairs: list[tuple[int, float]], temperature: float
) -> None:
    """Counts and logits drawn from few values, so that ties and workers at their fair
    share are common: the same indexes (or None)."""
    counts = [count for count, _ in pairs]
    logits = [logit for _, logit in pairs]
    assert fair_ties(logits, counts, temperature) == fair_ties_py(logits, counts, temperature)


SHARE_FUNCTIONS = [pytest.param((within_capacity_py, fair_ties_py), id="python")]
if has_native_index():
    SHARE_FUNCTIONS.append(pytest.param((within_capacity, fair_ties), id="native"))


@pytest.mark.parametrize("functions", SHARE_FUNCTIONS)
def test_share_functions_refuse_bad_input_alike(functions: tuple[Any, Any]) -> None:
    """The C functions raise what their Python references raise, and like them read no
    logits when no count is at its fair share."""
    capacity, ties = functions
    with pytest.raises(ZeroDivisionError):
        capacity([], 1.05)
    with pytest.raises(ZeroDivisionError):
        ties([], [], 0.0)
    with pytest.raises(ValueError, match="differ in length"):
        ties([1.0], [1, 2], 0.0)
    with pytest.raises(ValueError, match="differ in length"):
        ties([1.0], [], 0.0)
    with pytest.raises(TypeError):
        capacity([1, "2"], 1.05)
    with pytest.raises(ValueError):
        capacity([1, 2], math.nan)
    with pytest.raises(OverflowError):
        capacity([1, 2], math.inf)
    assert ties(["not read"], [0], 0.0) is None  # capacity 1, nobody at it


def test_cost_without_the_extension_is_the_reference() -> None:
    """Without the extension, logits and the draw come from the Python code."""
    script = """
import random
from armature.router import cost
from armature.router.load import WorkerLoad
assert cost._native is None
rng = random.Random(3)
logits = [rng.uniform(0, 100) for _ in range(64)]
print(cost.select_worker(logits, lambda i: 0, 0.01, random.Random(5)))
print(cost.softmax_pick_py(logits, 0.01, random.Random(5).random()))
print(cost.worker_logits(["a", "b"], 128, 16, {"b": 3}, {"a": WorkerLoad(0, 2, 1)}) == [18.0, 10.0])
print(cost.within_capacity([5, 1, 3, 3], 1.05) == [1, 2, 3])
print(cost.fair_ties([10.0, 10.1, 10.0, 20.0], [5, 1, 3, 3], 0.02) == [1, 2])
"""
    first, second, *checks = run_without("armature.router._index", script).split()
    assert first == second and checks == ["True", "True", "True"]
