"""A decode worker's waiting requests hold their imported KV blocks until admitted. When the
queue's head does not fit beside those holds, the holders go first (their blocks come back
only by running them), and when nothing runs at all the holds are dropped for the head: the
engine never waits on itself. Mocker cores, 4-token blocks, stepped on a virtual clock."""

from __future__ import annotations

from pathlib import Path

from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.kv.hashing import compute_block_hashes
from armature.protocols.engine import EngineRequest, SamplingParams
from armature.sim.mocker import MockerRunner, VirtualClock, simulated_arch
from armature.sim.timing import PolynomialTiming
from armature.transfer.blocks import KvBlocks

BLOCK = 4
ARCH = simulated_arch(vocab_size=1000, max_model_len=4096)


def core_of(num_kv_blocks: int) -> EngineCore:
    config = NativeEngineConfig(
        model_dir=Path("/unused"), num_kv_blocks=num_kv_blocks, block_size=BLOCK
    )
    runner = MockerRunner(ARCH, PolynomialTiming(), VirtualClock())
    core = EngineCore(config, runner, num_blocks=num_kv_blocks, time_s=runner.clock.get_time_s)
    pool = core.pool
    runner.kv_utilization = lambda: pool.get_num_active_blocks() / pool.num_blocks
    return core


def request(rid: str, prompt_len: int, first: int, max_tokens: int = 3) -> EngineRequest:
    return EngineRequest(
        request_id=rid,
        prompt_token_ids=[first + t for t in range(prompt_len)],
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )


def add_imported(core: EngineCore, req: EngineRequest) -> list[int]:
    """Import `req`'s whole prompt as pulled KV blocks and queue it holding them."""
    hashes = compute_block_hashes(req.prompt_token_ids, BLOCK)
    held = core.import_kv(hashes, 0, KvBlocks(list(range(len(hashes))), None, None))
    assert len(held) == len(hashes)
    core.add_request(req, held)
    return held


def run_all(core: EngineCore, max_steps: int = 200) -> list[str]:
    """Step until idle; the request ids in the order they were admitted (first scheduled)."""
    admitted: list[str] = []
    for _ in range(max_steps):
        if not core.has_work():
            return admitted
        core.step()
        admitted += [r.request_id for r in core.scheduler.running if r.request_id not in admitted]
    raise AssertionError(f"still working after {max_steps} steps: {core.get_load()}")


def test_holders_go_before_a_head_that_does_not_fit() -> None:
    core = core_of(num_kv_blocks=12)
    core.add_request(request("head", 36, first=100))  # 9 blocks, then a decode block
    add_imported(core, request("held-1", 12, first=300))  # 3 blocks held each
    add_imported(core, request("held-2", 12, first=500))
    assert core.pool.get_num_free_blocks() == 6
    core.step()
    # the head needs 10 of the 6 free: the holders are admitted, each with its last block
    # computed again (a prompt's last token is always computed) in one new block
    assert [r.request_id for r in core.scheduler.running] == ["held-1", "held-2"]
    assert [r.num_cached_tokens for r in core.scheduler.running] == [8, 8]
    assert [r.request_id for r in core.scheduler.waiting] == ["head"]
    assert run_all(core) == ["held-1", "held-2", "head"]
    assert core.pool.get_num_free_blocks() == 12


def test_holds_are_dropped_when_nothing_else_can_run() -> None:
    core = core_of(num_kv_blocks=12)
    core.add_request(request("head", 10, first=100))  # 3 blocks
    add_imported(core, request("held-1", 24, first=300))  # 6 blocks held each: none free
    add_imported(core, request("held-2", 24, first=500))
    assert core.pool.get_num_free_blocks() == 0
    core.step()
    # no holder fits its last block either and nothing runs: the holds go, the head runs
    assert [r.request_id for r in core.scheduler.running] == ["head"]
    assert [len(r.held_block_ids) for r in core.scheduler.waiting] == [0, 0]
    assert core.pool.get_num_free_blocks() == 12 - 3
    # the holders' imported blocks stayed cached where the head did not evict them
    assert run_all(core) == ["head", "held-1", "held-2"]
    assert core.pool.get_num_free_blocks() == 12


def test_a_head_that_fits_keeps_its_place() -> None:
    core = core_of(num_kv_blocks=12)
    core.add_request(request("head", 8, first=100))  # 2 blocks
    add_imported(core, request("held-1", 12, first=300))
    core.step()
    assert [r.request_id for r in core.scheduler.running] == ["head", "held-1"]
