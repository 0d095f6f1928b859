"""settle_heap, in a fresh interpreter (it changes the collector of the whole process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from armature.runtime.heap import settle_heap

PROBE = """
import gc, json, weakref
from armature.runtime.heap import settle_heap
gc.set_threshold(*THRESHOLDS)
class Node:
    pass
kept = [Node() for _ in range(1000)]
cycle = Node(); cycle.me = cycle; garbage = weakref.ref(cycle); del cycle
before = gc.get_freeze_count()
settle_heap(YOUNG)
frozen = gc.get_freeze_count()
gc.collect()
print(json.dumps({"before": before, "frozen": frozen, "after_collect": gc.get_freeze_count(),
    "kept_tracked": all(gc.is_tracked(n) for n in kept), "threshold": gc.get_threshold(),
    "garbage_collected": garbage() is None}))
"""


def probe(thresholds: tuple[int, int, int], young: int) -> dict[str, object]:
    code = PROBE.replace("THRESHOLDS", repr(thresholds)).replace("YOUNG", str(young))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_what_lives_at_start_is_frozen_and_young_collections_are_rarer() -> None:
    got = probe((700, 10, 10), 20_000)
    assert got["before"] == 0
    assert isinstance(got["frozen"], int) and got["frozen"] >= 1000  # the Nodes and the imports
    assert got["after_collect"] == got["frozen"]  # a full collection leaves them frozen
    assert got["kept_tracked"] is True
    assert got["garbage_collected"] is True  # collected first: a cycle dead at start is not kept
    assert got["threshold"] == [20_000, 10, 10]


def test_a_threshold_already_higher_is_kept() -> None:
    assert probe((50_000, 5, 5), 20_000)["threshold"] == [50_000, 5, 5]


def test_a_young_threshold_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="young_collection_every"):
        settle_heap(0)
