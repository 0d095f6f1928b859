"""KV routing cost, worker selection (the native choice against the Python one, and the
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
    break_ties,
    choose_py,
    cost_terms,
    fair_ties_py,
    softmax_pick_py,
    within_capacity_py,
    worker_logits_py,
)
from armature.router.holder_store import has_native_index
from armature.router.load import ActiveLoad, WorkerLoad
from without_extension import run_without

if has_native_index():
    from armature.router._index import choose, within_capacity

worker_logits = worker_logits_py


def _none(worker_index: int) -> int:
    return 0


def select_worker(
    logits: list[float], cached_blocks: Any, temperature: float, rng: random.Random
) -> int:
    """The choice over `logits` as the kv policy makes it: the draw with one random() at a
    temperature, else the cheapest with `break_ties`."""
    if temperature > 0:
        return softmax_pick_py(logits, temperature, rng.random())
    best = min(logits)
    return break_ties([i for i, x in enumerate(logits) if x == best], cached_blocks, rng)


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
        choose_py([], 64, 16, {}, {}, 1.0, 1.0, None, 0.0, 0.0, 0.5)


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


NAMES = [f"w{i}" for i in range(300)]
LOADS = st.builds(WorkerLoad, st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 3))
# weighted overlaps are floats; few values, so that ties are common
OVERLAPS = st.one_of(st.sampled_from([0, 1, 2, 40]), st.integers(0, 5000), st.floats(0, 5000))


@pytest.mark.skipif(not has_native_index(), reason="armature.router._index was not built")
@given(
    st.lists(st.sampled_from(NAMES), min_size=1, max_size=300, unique=True),
    st.integers(0, 80_000),
    st.sampled_from([1, 16, 64]),
    st.dictionaries(st.sampled_from(NAMES), OVERLAPS),
    st.dictionaries(st.sampled_from(NAMES), LOADS),
    st.sampled_from([1.0, 0.5, 2.0, 1]),
    st.sampled_from([1.0, 0.5, 0.0, 0.25]),
    st.one_of(st.none(), st.lists(st.sampled_from([0, 1, 2, 3, 9]), min_size=300, max_size=300)),
    st.sampled_from([1.05, 1.5, 2.0, 3]),
    st.sampled_from([0.0, 0.01, 0.02, 0.5, 1.0, 5.0]),
    st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
    st.booleans(),
)
def test_native_choice_is_the_python_choice(
    workers: list[str],
    isl_tokens: int,
    block_size: int,
    overlaps: dict[str, float],
    loads: dict[str, WorkerLoad],
    overlap_weight: float,
    decode_weight: float,
    counts: list[int] | None,
    share_bound: float,
    temperature: float,
    u: float,
    as_view: bool,
) -> None:
    """The C choice does the reference's float operations in its order (ints exactly): the
    same index, or the same cheapest at temperature 0, whatever the share cap, the fair
    near-ties and the draw keep (counts from few values, so that workers at their capacity
    are common; requests 0-3, so that idle workers are), for plain dicts and other
    mappings."""
    view = MappingProxyType(loads) if as_view else loads
    args = (workers, isl_tokens, block_size, overlaps, view, overlap_weight, decode_weight)
    share = None if counts is None else counts[: len(workers)]
    rest = (share, share_bound, temperature, u)
    assert choose(*args, *rest) == choose_py(*args, *rest)


@pytest.mark.skipif(not has_native_index(), reason="armature.router._index was not built")
@given(
    st.lists(st.sampled_from(NAMES[:20]), min_size=1, max_size=20, unique=True),
    st.dictionaries(st.sampled_from(NAMES[:20]), st.sampled_from([0, 3, math.nan, math.inf])),
    st.dictionaries(st.sampled_from(NAMES[:20]), LOADS),
    st.one_of(st.none(), st.lists(st.sampled_from([0, 1, 3]), min_size=20, max_size=20)),
    st.sampled_from([0.0, 0.02, math.nan]),
    st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_native_choice_is_the_python_choice_with_non_finite_values(
    workers: list[str],
    overlaps: dict[str, float],
    loads: dict[str, WorkerLoad],
    counts: list[int] | None,
    temperature: float,
    u: float,
) -> None:
    """NaN and infinite overlaps (so NaN logits) and a NaN temperature, which configuration
    refuses but code may pass: the two agree, and at temperature 0 or NaN (not above 0) the
    cheapest are never empty (a NaN where min() finds the lowest is the one chosen)."""
    share = None if counts is None else counts[: len(workers)]
    args = (workers, 256, 16, overlaps, loads, 1.0, 0.5, share, 1.05, temperature, u)
    picked = choose_py(*args)
    assert choose(*args) == picked
    assert isinstance(picked, int) == (temperature > 0)
    assert picked != []


def test_choice_caps_shares_then_keeps_fair_ties_by_hand() -> None:
    """Four workers, counts 5, 1, 3, 3: capacity ceil(1.05 x 13 / 4) = 4, which w0 is at; w1
    is idle and others busy, so the cap spills and w0 is out. The logits of w1, w2, w3 (64
    tokens, 4 blocks; w2 and w3 hold 2 blocks, w1 none): 4 + 4, 2 + (1 x 0.5 + 2) (its one
    active block at decode weight 0.5), 2 + (4 x 0.5 + 2); no fair near-tie is below its
    share, so at temperature 0 the cheapest is w2. Without a spill (no worker idle) w0,
    holding all 4 blocks and none active, is the cheapest (0)."""
    workers = ["w0", "w1", "w2", "w3"]
    loads = {"w0": WorkerLoad(0, 0, 1), "w2": WorkerLoad(0, 1, 1), "w3": WorkerLoad(0, 4, 1)}
    overlaps = {"w0": 4, "w2": 2, "w3": 2}
    counts = [5, 1, 3, 3]
    args = (workers, 64, 16, overlaps, loads, 1.0, 0.5, counts, 1.05, 0.0, 0.5)
    assert worker_logits(workers[1:], 64, 16, overlaps, loads, 1.0, 0.5) == [8.0, 4.5, 6.0]
    assert choose_py(*args) == [2]
    busy = {**loads, "w1": WorkerLoad(0, 0, 1)}
    assert choose_py(workers, 64, 16, overlaps, busy, 1.0, 0.5, counts, 1.05, 0.0, 0.5) == [0]
    if has_native_index():
        assert choose(*args) == [2]


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


CHOICES = [pytest.param((within_capacity_py, choose_py), id="python")]
if has_native_index():
    CHOICES.append(pytest.param((within_capacity, choose), id="native"))


@pytest.mark.parametrize("functions", CHOICES)
def test_capacity_and_choice_refuse_bad_input_alike(functions: tuple[Any, Any]) -> None:
    """The C functions raise what their Python references raise."""
    capacity, pick = functions
    with pytest.raises(ZeroDivisionError):
        capacity([], 1.05)
    with pytest.raises(TypeError):
        capacity([1, "2"], 1.05)
    with pytest.raises(ValueError):
        capacity([1, 2], math.nan)
    with pytest.raises(OverflowError):
        capacity([1, 2], math.inf)
    tail = (64, 16, {}, {"a": WorkerLoad(0, 1, 1)}, 1.0, 1.0)
    with pytest.raises(ValueError, match="no workers"):
        pick([], *tail, None, 1.05, 0.0, 0.5)
    with pytest.raises(ValueError, match="differ in length"):
        pick(["a", "b"], *tail, [1], 1.05, 0.0, 0.5)
    with pytest.raises(TypeError):
        pick(["a", "b"], *tail, [1, "2"], 1.05, 0.0, 0.5)
    with pytest.raises(ValueError):
        pick(["a", "b"], *tail, [1, 2], math.nan, 0.0, 0.5)
    with pytest.raises(OverflowError):
        pick(["a", "b"], *tail, [1, 2], math.inf, 0.0, 0.5)
    assert pick(["a", "b"], *tail, [1, 2], 1.05, 0.0, 0.5) == [1]  # a busy, b idle


def test_cost_without_the_extension_is_the_reference() -> None:
    """Without the extension, the choice comes from the Python code."""
    script = """
import random
from armature.router import cost
from armature.router.load import WorkerLoad
assert cost._native is None
rng = random.Random(3)
workers = [f"w{i}" for i in range(64)]
loads = {w: WorkerLoad(rng.randrange(1000), rng.randrange(100), 1) for w in workers[::2]}
overlaps = {w: rng.randrange(8) for w in workers[::3]}
u = random.Random(5).random()
print(cost.choose(workers, 128, 16, overlaps, loads, 1.0, 0.5, None, 0.0, 0.01, u))
print(cost.choose_py(workers, 128, 16, overlaps, loads, 1.0, 0.5, None, 0.0, 0.01, u))
print(cost.within_capacity([5, 1, 3, 3], 1.05) == [1, 2, 3])
"""
    first, second, *checks = run_without("armature.router._index", script).split()
    assert first == second and checks == ["True"]


@pytest.mark.skipif(not has_native_index(), reason="armature.router._index was not built")
@pytest.mark.parametrize("temperature", [0.0, 0.02, 0.5])
def test_a_policy_decides_alike_with_the_native_and_the_python_choice(
    temperature: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kv policy with shares, over 40 workers with cached prefixes, loads that start and
    end as it routes, 400 decisions in a row: the same workers in the same order, and its
    random draws left in the same state, whichever choice it calls."""
    from armature.kv.hashing import DEFAULT_HASH_SEED, compute_block_hashes
    from armature.protocols.kv_events import KvStored, StoredBlock
    from armature.router import policies
    from armature.router.policies import KvPolicy, RouteRequest
    from armature.router.prefix_index import PrefixIndex

    def run() -> tuple[list[str], object]:
        rng = random.Random(7)
        workers = [f"w{i}" for i in range(40)]
        stems = [[rng.randrange(1000) for _ in range(32)] for _ in range(6)]
        index = PrefixIndex()
        for w in workers:
            index.add_worker(w, 4096)
            blocks = compute_block_hashes(rng.choice(stems), 4)[: rng.randrange(1, 9)]
            index.apply(w, KvStored(0, None, [StoredBlock(s, loc) for s, loc in blocks]))
        load = ActiveLoad()
        policy = KvPolicy(
            index,
            load,
            block_size=4,
            hash_seed=DEFAULT_HASH_SEED,
            temperature=temperature,
            decode_weight=0.5,
            share_bound=1.05,
            share_window=8,
            seed=3,
        )
        chosen: list[str] = []
        for i in range(400):
            prompt = rng.choice(stems) + [rng.randrange(1000) for _ in range(rng.randrange(8))]
            decision = policy.select(RouteRequest(f"r{i}", prompt), workers)
            chosen.append(decision.worker)
            load.start(f"r{i}", decision.worker, len(prompt), len(prompt) // 4 + 1)
            if rng.random() < 0.5:
                load.first_token(f"r{rng.randrange(i + 1)}")
            if rng.random() < 0.6:
                load.finish(f"r{rng.randrange(i + 1)}")
        return chosen, policy._rng.getstate()

    native = run()
    monkeypatch.setattr(policies, "choose", choose_py)
    python = run()
    assert native == python
    assert len(set(native[0])) > 20  # the shares spread it over the fleet


@pytest.mark.skipif(not has_native_index(), reason="armature.router._index was not built")
def test_native_choice_reads_workers_that_a_lookup_changes_as_they_were() -> None:
    """Reading an overlap may run code (a value's __float__); one that empties the list of
    workers mid-read leaves the choice on the workers as they were (the C code reads its own
    copy of them, and of the counts)."""
    workers = [f"worker-{i}" for i in range(300)]
    counts = [1] * 300
    tail = (1.0, 0.5, counts, 1.05, 0.0, 0.3)
    expected = choose(list(workers), 64, 16, {"worker-0": 1.0, "worker-250": 3.0}, {}, *tail)

    others: list[str] = []

    class Emptying:
        def __float__(self) -> float:
            workers.clear()
            counts.clear()
            # new names of the same size, where the freed ones' memory goes first
            others.extend(f"other!-{i}" for i in range(300))
            return 1.0

    overlaps = {"worker-0": Emptying(), "worker-250": 3.0}  # the first one read empties
    assert choose(workers, 64, 16, overlaps, {}, *tail) == expected
    assert expected == [250] and workers == []
