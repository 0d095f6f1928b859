"""The memory-fit rule at its boundaries: the tiny Llama on the toy system (9e8 usable bytes),
its reserve set so that the KV room is exactly 10 requests of 300,000 tokens."""

from __future__ import annotations

from dataclasses import replace

import pytest
from configurator_cases import tiny_llama, toy_system

from armature.configurator.hardware import accelerator_hardware, local_hardware
from armature.configurator.memory import get_kv_bytes_per_token_per_gpu, get_memory_fit
from armature.configurator.space import AGG, DISAGG, Deployment, SearchSpace
from armature.configurator.timing import with_limits
from armature.errors import ConfigError
from armature.sim.profile_timing import timing_from_profile
from armature.sim.timing import StepWork
from profiles import make_profile

WEIGHT_BYTES = 139584 * 2
# 1000 tokens x (4*64 + 2*128 + 3*128) x 2 bytes, and 10 x 512 float32 logits
ACTIVATION_BYTES = 1000 * 896 * 2 + 10 * 512 * 4
KV_ROOM_BYTES = 10 * 300_000 * 256
RESERVED = 9e8 - WEIGHT_BYTES - ACTIVATION_BYTES - KV_ROOM_BYTES


def _fit(request_tokens: int, tp: int = 1, **system: float):  # type: ignore[no-untyped-def]
    return get_memory_fit(
        tiny_llama(),
        toy_system(reserved_bytes=RESERVED, **system),
        tp,
        max_num_seqs=10,
        max_num_batched_tokens=1000,
        request_tokens=request_tokens,
    )


def test_the_parts_of_the_rule() -> None:
    fit = _fit(300_000)
    assert fit.usable_bytes == pytest.approx(9e8)
    assert fit.weight_bytes == WEIGHT_BYTES
    assert fit.activation_bytes == ACTIVATION_BYTES
    assert fit.kv_bytes_per_token == 256
    assert fit.kv_capacity_bytes == pytest.approx(KV_ROOM_BYTES)
    assert fit.kv_capacity_tokens == 3_000_000


def test_fits_exactly_at_the_boundary_and_not_one_token_past_it() -> None:
    assert _fit(300_000).fits
    assert not _fit(300_001).fits


def test_tensor_parallelism_splits_weights_and_kv_heads() -> None:
    model = tiny_llama()
    assert get_kv_bytes_per_token_per_gpu(model, 1) == 256
    assert get_kv_bytes_per_token_per_gpu(model, 2) == 128  # one KV head each
    assert get_kv_bytes_per_token_per_gpu(model, 4) == 128  # replicated past the heads
    fit = _fit(300_001, tp=2)
    assert fit.weight_bytes == WEIGHT_BYTES / 2
    assert fit.fits  # half the KV bytes a token


def test_a_tp_must_split_the_heads() -> None:
    """Query heads divide by the TP; KV heads divide by it, or are each replicated over a
    whole number of GPUs."""
    model = tiny_llama()  # 4 query heads, 2 KV heads
    assert [tp for tp in range(1, 9) if model.splits_over(tp)] == [1, 2, 4]
    llama8b = replace(model, num_heads=32, num_kv_heads=8)
    assert [tp for tp in (1, 2, 3, 4, 8, 16, 64) if llama8b.splits_over(tp)] == [1, 2, 4, 8, 16]
    smollm2 = replace(model, num_heads=9, num_kv_heads=3)
    assert [tp for tp in range(1, 10) if smollm2.splits_over(tp)] == [1, 3, 9]


def test_a_model_that_fits_at_no_tensor_parallelism_is_refused() -> None:
    # TP 8 is not searched: the tiny model's 4 heads do not split over it
    with pytest.raises(ConfigError, match="does not fit on toy at any tensor parallelism up to 4"):
        accelerator_hardware(
            tiny_llama(), toy_system(memory_capacity_bytes=1e5), SearchSpace(), 8, "tiny"
        )


def test_only_the_tps_whose_weights_fit_are_searched() -> None:
    # 2e8 usable, 1e8 reserved: room for every TP
    system = toy_system(memory_capacity_bytes=2e8 / 0.9 + 0.5)
    space = SearchSpace(max_num_batched_tokens=(2048,))
    hardware = accelerator_hardware(tiny_llama(), system, space, 8, "tiny")
    assert sorted(hardware.timings) == [1, 2, 4]  # TP 8: 4 heads do not split over it
    # room for tp1's 2048-token activations less one byte: tp2's are smaller
    tight = toy_system(memory_capacity_bytes=(1e8 + 2048 * 896 * 2 - 1) / 0.9)
    hardware = accelerator_hardware(tiny_llama(), tight, space, 8, "tiny")
    assert 1 not in hardware.timings


def test_a_deployment_fits_when_each_worker_holds_its_batch() -> None:
    profile = make_profile(model="tiny")  # 96 blocks of 16 tokens: 1536 tokens
    hardware = local_hardware(tiny_llama(), profile, SearchSpace())
    agg = Deployment(AGG, 1, 16, 1024)
    assert hardware.fits(agg, request_tokens=96, isl_tokens=64)  # 16 x 96 = 1536
    assert not hardware.fits(agg, request_tokens=97, isl_tokens=64)
    # a prefill worker holds a step's prompts: 1024 // 512 = 2 of 768 tokens (a decode
    # worker of max-num-seqs 1, one)
    disagg = Deployment(DISAGG, 1, 1, 1024, 1, 1, 1)
    assert hardware.fits(disagg, request_tokens=768, isl_tokens=512)
    assert not hardware.fits(disagg, request_tokens=769, isl_tokens=512)


def test_the_local_system_searches_within_what_was_measured() -> None:
    profile = make_profile(model="tiny")  # run with max-num-seqs 32, a 1024-token step
    space = SearchSpace(max_num_seqs=(16, 32, 64), max_num_batched_tokens=(2048, 4096))
    hardware = local_hardware(tiny_llama(), profile, space)
    assert hardware.space.max_num_seqs == (16, 32)
    assert hardware.space.max_num_batched_tokens == (1024,)
    assert hardware.space.tensor_parallel == (1,)
    only_larger = local_hardware(tiny_llama(), profile, SearchSpace(max_num_seqs=(64,)))
    assert only_larger.space.max_num_seqs == (32,)


def test_a_simulated_worker_prices_steps_as_its_saved_profile_does() -> None:
    """The search prices a deployment's steps from the profile as `--save-dir` writes it for
    that deployment's step budget (prefill points past it dropped, the context cost fitted
    without them), so the saved replay line gives back the prediction exactly."""
    system = toy_system(memory_capacity_bytes=2e8 / 0.9 + 0.5)
    space = SearchSpace(max_num_batched_tokens=(2048,))
    hardware = accelerator_hardware(tiny_llama(), system, space, 8, "tiny")
    profile = hardware.timings[1].profile
    assert profile.max_num_batched_tokens > 2048  # predicted past every budget searched
    saved = with_limits(
        profile,
        max_num_seqs=16,
        max_num_batched_tokens=2048,
        num_kv_blocks=64,
        served_model_name="tiny",
    )
    budget, whole = hardware.get_timing(1, 1, 1.0, 2048), hardware.get_timing(1, 1, 1.0)
    steps = [
        StepWork(2048, 0, 0.1),
        StepWork(
            1000, 8, 0.5, num_decode_kv_tokens=8 * 3000, num_prefill_context_pairs=1000 * 6000
        ),
        StepWork(0, 16, 0.9, num_decode_kv_tokens=16 * 2500),
    ]
    assert [budget.step_ms(s) for s in steps] == [
        timing_from_profile(saved).step_ms(s) for s in steps
    ]
    # a chunk after a long prefix: the context cost fitted within the budget prices it apart
    assert budget.step_ms(steps[1]) != whole.step_ms(steps[1])
    assert budget is hardware.get_timing(1, 4, 2.0, 2048)  # made once per TP and budget
    assert whole is hardware.timings[1].timing
