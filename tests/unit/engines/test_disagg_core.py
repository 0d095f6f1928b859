"""Disaggregation inside the engine core: a prefill core pins the prompt's blocks after the
first token, a decode core imports the blocks it lacks and continues. In float32 the greedy
output equals transformers' (the near-tie rule of the engine's tests), with prefix hits on
either side and partial transfers; both pools end clean."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_reference import HfReference
from test_hf_equivalence import check_all, engine, prompts_of

from armature.engines.native.core import EngineCore
from armature.protocols.engine import EngineRequest, FinishReason, SamplingParams
from armature.protocols.kv_transfer import KvHandle
from armature.transfer.wire import TransferError

NEW_TOKENS = 10


def params(max_tokens: int, min_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, min_tokens=min_tokens)


def run_to_end(core: EngineCore, outputs: dict[str, list[int]]) -> dict[str, object]:
    finals: dict[str, object] = {}
    while core.has_work():
        for out in core.step():
            outputs[out.request_id].extend(out.new_token_ids)
            if out.finish_reason is not None:
                finals[out.request_id] = out
    return finals


def disagg_generate(
    prefill: EngineCore,
    decode: EngineCore,
    prompts: list[list[int]],
    new_tokens: int = NEW_TOKENS,
    prefill_hits: list[int] | None = None,
) -> tuple[list[list[int]], list[int]]:
    """All prompts prefilled together on `prefill`, then decoded together on `decode`.
    Returns the outputs and, per prompt, how many blocks were transferred; appends the
    prefill's cached prompt tokens per prompt to `prefill_hits`."""
    first: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    for i, prompt in enumerate(prompts):
        prefill.add_request(
            EngineRequest(
                request_id=str(i),
                prompt_token_ids=prompt,
                sampling=params(new_tokens, new_tokens),
                remote_prefill=True,
            )
        )
    finals = run_to_end(prefill, first)
    outputs: dict[str, list[int]] = {}
    moved: list[int] = []
    for i, prompt in enumerate(prompts):
        final = finals[str(i)]
        assert final.finish_reason is FinishReason.TRANSFER  # type: ignore[attr-defined]
        handle = final.kv_handle  # type: ignore[attr-defined]
        if prefill_hits is not None:
            prefill_hits.append(final.num_cached_tokens)  # type: ignore[attr-defined]
        assert handle is not None and len(handle.seq_hashes) == len(prompt) // 16
        request = EngineRequest(
            request_id=str(i),
            prompt_token_ids=prompt,
            output_token_ids=first[str(i)],
            sampling=params(new_tokens - 1, new_tokens),
            kv_handle=handle,
        )
        hashes, start = decode.plan_import(request)
        held: list[int] = []
        if start < len(hashes):
            block_ids = prefill.pins.begin_read(handle.handle_id)
            blocks = prefill.kv_store.read_blocks(block_ids[start:])
            prefill.pins.end_read(handle.handle_id)
            held = decode.import_kv(hashes, start, blocks)
            assert len(held) == len(hashes)
        moved.append(len(hashes) - start)
        if handle.seq_hashes:
            assert prefill.pins.release(handle.handle_id)
        decode.add_request(request, held)
        outputs[str(i)] = list(first[str(i)])
    prefill.free_unpinned()
    run_to_end(decode, outputs)
    for core in (prefill, decode):
        assert core.pool.get_num_active_blocks() == 0
        assert len(core.pins) == 0
        core.pool.check_integrity()
    return [outputs[str(i)] for i in range(len(prompts))], moved


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir: Path) -> tuple[Path, HfReference]:
    return tiny_llama_dir, HfReference(tiny_llama_dir)


def test_disagg_matches_transformers_concurrently(tiny: tuple[Path, HfReference]) -> None:
    model_dir, ref = tiny
    prompts = prompts_of([1, 5, 16, 17, 31, 32, 70, 200], 512, seed=11)
    outputs, moved = disagg_generate(engine(model_dir), engine(model_dir), prompts)
    check_all(ref, prompts, outputs)
    assert moved == [len(p) // 16 for p in prompts]  # a cold decode pool pulls every block


def test_partial_transfer_when_decode_holds_a_prefix(tiny: tuple[Path, HfReference]) -> None:
    model_dir, ref = tiny
    shared = prompts_of([48], 512, seed=12)[0]
    tails = prompts_of([20, 40], 512, seed=13)
    prefill, decode = engine(model_dir), engine(model_dir)
    # the decode pool serves a request with the shared prefix first (aggregated)
    decode.add_request(
        EngineRequest(request_id="warm", prompt_token_ids=[*shared, 7], sampling=params(2, 2))
    )
    run_to_end(decode, {"warm": []})
    prompts = [shared + t for t in tails]
    outputs, moved = disagg_generate(prefill, decode, prompts)
    check_all(ref, prompts, outputs)
    assert moved == [len(p) // 16 - 3 for p in prompts]  # 3 shared blocks stay local


def test_prefix_hits_on_the_prefill_side(tiny: tuple[Path, HfReference]) -> None:
    model_dir, ref = tiny
    prefill = engine(model_dir)
    base = prompts_of([64], 512, seed=14)[0]
    for round_ in range(2):  # the second round hits the prefill's cache
        prompts = [[*base, 5 + round_], [*base, 9 + round_, 3]]
        hits: list[int] = []
        outputs, moved = disagg_generate(prefill, engine(model_dir), prompts, prefill_hits=hits)
        check_all(ref, prompts, outputs)
        assert moved == [4, 0]  # the second prompt's blocks arrived with the first
        assert hits == ([0, 0] if round_ == 0 else [64, 64])


def test_default_model_disagg_matches_transformers(default_model_dir: Path) -> None:
    ref = HfReference(default_model_dir)
    prompts = prompts_of([20, 37, 64, 90], 49152, seed=15)

    def core() -> EngineCore:
        return engine(default_model_dir, num_kv_blocks=64)

    outputs, _ = disagg_generate(core(), core(), prompts, new_tokens=8)
    check_all(ref, prompts, outputs)


def test_unreleased_pins_expire(tiny_llama_dir: Path) -> None:
    core = engine(tiny_llama_dir, kv_pin_ttl_s=5.0)
    core.add_request(
        EngineRequest(
            request_id="p",
            prompt_token_ids=list(range(3, 40)),
            sampling=params(4, 0),
            remote_prefill=True,
        )
    )
    finals = run_to_end(core, {"p": []})
    handle = finals["p"].kv_handle  # type: ignore[attr-defined]
    assert core.pool.get_num_active_blocks() == 2 and core.pins.get_num_pinned_blocks() == 2
    import time

    assert core.free_unpinned(time.monotonic()) == 0  # not yet
    assert core.free_unpinned(time.monotonic() + 6.0) == 2
    assert core.pool.get_num_active_blocks() == 0 and core.pins.num_expired == 1
    assert not core.pins.release(handle.handle_id)  # too late: already freed
    core.pool.check_integrity()


def test_a_caller_that_left_before_the_handle_frees_the_pin(tiny_llama_dir: Path) -> None:
    """The prefill finished (blocks pinned) just as its caller left: the late abort releases
    the pin, since no decode worker will ever get the handle."""
    core = engine(tiny_llama_dir, kv_pin_ttl_s=60.0)
    prompt = list(range(3, 40))
    core.add_request(
        EngineRequest(
            request_id="p", prompt_token_ids=prompt, sampling=params(4, 0), remote_prefill=True
        )
    )
    run_to_end(core, {"p": []})
    assert core.pins.get_num_pinned_blocks() == 2
    assert not core.pins.release_request("other")
    assert core.abort_request("p") is True
    assert core.free_unpinned() == 2
    assert core.pool.get_num_active_blocks() == 0 and core.pins.num_expired == 0
    assert core.abort_request("p") is False
    core.pool.check_integrity()


def decode_leg(prompt: list[int], handle: KvHandle | None) -> EngineRequest:
    """The decode leg of `prompt` after a prefill that sampled token 5."""
    return EngineRequest(
        request_id="d",
        prompt_token_ids=prompt,
        output_token_ids=[5],
        sampling=params(3, 0),
        kv_handle=handle,
    )


def test_a_handle_for_another_prompt_is_refused(tiny_llama_dir: Path) -> None:
    prefill, decode = engine(tiny_llama_dir), engine(tiny_llama_dir)
    prefill.add_request(
        EngineRequest(
            request_id="p",
            prompt_token_ids=list(range(3, 40)),
            sampling=params(4, 0),
            remote_prefill=True,
        )
    )
    handle = run_to_end(prefill, {"p": []})["p"].kv_handle  # type: ignore[attr-defined]
    other = decode_leg(list(range(4, 41)), handle)
    with pytest.raises(TransferError, match="do not match this prompt"):
        decode.plan_import(other)


def test_first_token_that_finishes_needs_no_transfer(tiny_llama_dir: Path) -> None:
    core = engine(tiny_llama_dir)
    core.add_request(
        EngineRequest(
            request_id="p",
            prompt_token_ids=list(range(3, 40)),
            sampling=params(1, 0),
            remote_prefill=True,
        )
    )
    final = run_to_end(core, {"p": []})["p"]
    assert final.finish_reason is FinishReason.LENGTH and final.kv_handle is None  # type: ignore[attr-defined]
    assert core.pool.get_num_active_blocks() == 0 and len(core.pins) == 0
    torch.manual_seed(0)


def test_a_vllm_handle_offers_nothing_to_import(tiny_llama_dir: Path) -> None:
    """A native decode worker handed a vLLM prefill's handle (no block hashes, only vLLM's
    transfer params) plans no import: it computes the prompt itself."""
    from armature.engines.vllm.disagg import to_kv_handle
    from armature.protocols.kv_transfer import KvLayout

    vllm_params = {"remote_engine_id": "e", "remote_block_ids": [[1]], "remote_host": "h"}
    layout = KvLayout(num_layers=2, block_size=16, num_kv_heads=1, head_dim=8, dtype="float32")
    handle = to_kv_handle(
        {**vllm_params, "remote_port": 1}, request_id="p", worker_id="w", layout=layout, ttl_s=1
    )
    decode = engine(tiny_llama_dir)
    hashes, start = decode.plan_import(decode_leg(list(range(3, 40)), handle))
    assert (list(hashes), start) == ([], 0)
