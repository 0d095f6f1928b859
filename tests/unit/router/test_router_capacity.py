"""The router's prefix index holds at most MAX_WORKERS workers: one more is refused with a
clear error before it is started, and the router is left as it was."""

from __future__ import annotations

from armature.config import RouterConfig
from armature.router.prefix_index import MAX_WORKERS
from armature.router.service import EngineRouter
from idle_engine import IdleEngine


def test_a_full_router_refuses_a_worker_before_starting_it() -> None:
    router = EngineRouter({}, RouterConfig())
    for i in range(MAX_WORKERS):
        router.add_engine(f"w{i}", IdleEngine())  # type: ignore[arg-type]
    extra = IdleEngine()
    try:
        router.add_engine("one-too-many", extra)  # type: ignore[arg-type]
    except ValueError as exc:
        assert str(exc) == "the router's prefix index holds at most 4,096 workers"
    else:
        raise AssertionError("the router took a worker past its index's room")
    assert extra.num_starts == 0
    assert "one-too-many" not in router.engines
    assert len(router.engines) == len(router.index.get_workers()) == MAX_WORKERS
