"""KV routing cost, worker selection and active-load tracking."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from armature.router.cost import WorkerScore, score_workers, select_worker
from armature.router.load import ActiveLoad, WorkerLoad


def test_worked_example_w2_wins() -> None:
    # isl 128 tokens = 8 blocks of 16. W1: no overlap, 2 active blocks -> 8 + 10.
    # W2: 3 cached blocks, idle -> 5 + 5. W3: 6 cached blocks, 7 active blocks -> 2 + 9.
    scores = score_workers(
        ["W1", "W2", "W3"],
        128,
        16,
        overlaps={"W2": 3, "W3": 6},
        loads={"W1": WorkerLoad(0, 2, 1), "W3": WorkerLoad(0, 7, 3)},
    )
    assert [(s.prefill_blocks, s.decode_blocks, s.logit) for s in scores] == [
        (8.0, 10.0, 18.0),
        (5.0, 5.0, 10.0),
        (2.0, 9.0, 11.0),
    ]
    assert select_worker(scores, {}, 0.0, random.Random(0)).worker == "W2"


def test_overlap_weight_and_prefill_load_shift_the_choice() -> None:
    loads = {"A": WorkerLoad(active_prefill_tokens=64)}
    scores = score_workers(["A", "B"], 64, 16, overlaps={"A": 2}, loads=loads, overlap_weight=2.0)
    # A: prefill (64 - 32 + 64) / 16 = 6, decode 2 -> 14; B: prefill 4, decode 4 -> 12
    assert [s.logit for s in scores] == [14.0, 12.0]
    assert select_worker(scores, {}, 0.0, random.Random(0)).worker == "B"


def test_ties_go_to_the_fewest_cached_blocks_then_random() -> None:
    tied = [WorkerScore(w, 0, 1.0, 1.0, 2.0) for w in ("a", "b", "c")]
    assert select_worker(tied, {"a": 5, "b": 1, "c": 3}, 0.0, random.Random(0)).worker == "b"
    picks = Counter(
        select_worker(tied, {"a": 1, "b": 1, "c": 9}, 0.0, random.Random(seed)).worker
        for seed in range(200)
    )
    assert set(picks) == {"a", "b"}


def test_temperature_samples_softmax_of_range_normalized_logits() -> None:
    scores = [
        WorkerScore(w, 0, 0.0, 0.0, logit) for w, logit in (("a", 10.0), ("b", 15.0), ("c", 20.0))
    ]
    temperature = 0.5
    weights = [math.exp(-n / temperature) for n in (0.0, 0.5, 1.0)]
    expected = [w / sum(weights) for w in weights]
    rng = random.Random(1234)
    n = 20000
    counts = Counter(select_worker(scores, {}, temperature, rng).worker for _ in range(n))
    for worker, p in zip("abc", expected, strict=True):
        assert counts[worker] / n == pytest.approx(p, abs=0.015)


def test_equal_logits_with_temperature_are_uniform() -> None:
    scores = [WorkerScore(w, 0, 0.0, 0.0, 3.0) for w in "ab"]
    rng = random.Random(7)
    counts = Counter(select_worker(scores, {}, 1.0, rng).worker for _ in range(4000))
    assert counts["a"] / 4000 == pytest.approx(0.5, abs=0.04)


def test_no_workers_is_an_error() -> None:
    with pytest.raises(ValueError, match="no workers"):
        select_worker([], {}, 0.0, random.Random(0))


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
