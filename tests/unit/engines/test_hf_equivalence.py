"""In float32 the native engine's greedy output equals transformers' token for token, in every
serving mode: single prompts, concurrent batches, prefix-cache hits, preemption, chunked
prefill; for the default model and tiny random Llama / Qwen2 / llama3-RoPE models."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hf_reference import HfReference

from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.protocols.engine import EngineRequest, SamplingParams

NEW_TOKENS = 12


def engine(model_dir: Path, **overrides: object) -> EngineCore:
    settings: dict[str, object] = {"num_kv_blocks": 256, "max_num_batched_tokens": 2048}
    settings.update(overrides)
    config = NativeEngineConfig(model_dir=model_dir, dtype="float32", **settings)  # type: ignore[arg-type]
    return EngineCore(config)


def generate(
    core: EngineCore, prompts: list[list[int]], new_tokens: int = NEW_TOKENS
) -> list[list[int]]:
    """Run all prompts concurrently to completion; returns outputs in prompt order."""
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, min_tokens=new_tokens)
    outputs: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        core.add_request(EngineRequest(request_id=str(i), prompt_token_ids=prompt, sampling=params))
        outputs[str(i)] = []
    while core.has_work():
        for out in core.step():
            outputs[out.request_id].extend(out.new_token_ids)
    assert core.pool.get_num_active_blocks() == 0
    core.pool.check_integrity()
    return [outputs[str(i)] for i in range(len(prompts))]


def prompts_of(lengths: list[int], vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def check_all(ref: HfReference, prompts: list[list[int]], outputs: list[list[int]]) -> None:
    exact = [ref.assert_matches(p, o, len(o)) for p, o in zip(prompts, outputs, strict=True)]
    # near-ties are rare; most sequences must match exactly
    assert sum(exact) >= len(exact) - max(1, len(exact) // 8)


# ---- tiny random-weight models (fast) ------------------------------------------------------
TINY = ["tiny_llama_dir", "tiny_qwen2_dir", "tiny_llama3_rope_dir"]


@pytest.fixture(scope="module", params=TINY)
def tiny(request: pytest.FixtureRequest) -> tuple[Path, HfReference]:
    model_dir: Path = request.getfixturevalue(request.param)
    return model_dir, HfReference(model_dir)


def test_tiny_single_prompts(tiny: tuple[Path, HfReference]) -> None:
    model_dir, ref = tiny
    core = engine(model_dir)
    for prompt in prompts_of([1, 5, 16, 17, 70, 200], 512, seed=1):
        [out] = generate(core, [prompt])
        assert ref.assert_matches(prompt, out, NEW_TOKENS)


def test_tiny_concurrent_batch(tiny: tuple[Path, HfReference]) -> None:
    model_dir, ref = tiny
    prompts = prompts_of([3 + 11 * i for i in range(16)], 512, seed=2)
    check_all(ref, prompts, generate(engine(model_dir), prompts))


def test_tiny_prefix_cache_hits(tiny: tuple[Path, HfReference]) -> None:
    model_dir, ref = tiny
    core = engine(model_dir)
    [base] = prompts_of([40], 512, seed=3)
    generate(core, [base])
    extended = [base + p for p in prompts_of([5, 21], 512, seed=4)] + [base]
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, min_tokens=NEW_TOKENS)
    core.add_request(EngineRequest(request_id="x", prompt_token_ids=extended[0], sampling=params))
    first = core.step()
    assert first[0].num_cached_tokens == 32  # 2 full blocks of the 40-token base
    while core.has_work():
        core.step()
    check_all(ref, extended, generate(core, extended))


def test_tiny_preemption(tiny: tuple[Path, HfReference]) -> None:
    model_dir, ref = tiny
    # 24 blocks of 16 tokens cannot hold 8 sequences of ~40-60 tokens growing by 12
    core = engine(model_dir, num_kv_blocks=24)
    prompts = prompts_of([30 + 4 * i for i in range(8)], 512, seed=5)
    outputs = generate(core, prompts)
    assert core.scheduler.running == [] and len(core.scheduler.waiting) == 0
    check_all(ref, prompts, outputs)


def test_tiny_preemption_happened(tiny_llama_dir: Path) -> None:
    core = engine(tiny_llama_dir, num_kv_blocks=24)
    prompts = prompts_of([30 + 4 * i for i in range(8)], 512, seed=5)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, min_tokens=NEW_TOKENS)
    for i, prompt in enumerate(prompts):
        core.add_request(EngineRequest(request_id=str(i), prompt_token_ids=prompt, sampling=params))
    states = list(core._requests.values())
    while core.has_work():
        core.step()
    assert sum(s.num_preemptions for s in states) > 0


def test_tiny_chunked_prefill(tiny: tuple[Path, HfReference]) -> None:
    model_dir, ref = tiny
    core = engine(model_dir, max_num_batched_tokens=24)
    prompts = prompts_of([100, 7, 64, 33], 512, seed=6)
    check_all(ref, prompts, generate(core, prompts))


# ---- the default model (slow) --------------------------------------------------------------
@pytest.fixture(scope="module")
def default_ref(default_model_dir: Path) -> HfReference:
    return HfReference(default_model_dir)


@pytest.mark.slow
def test_default_model_single_and_concurrent(
    default_model_dir: Path, default_ref: HfReference
) -> None:
    core = engine(default_model_dir, num_kv_blocks=512)
    singles = prompts_of([4, 37, 150], 49152, seed=7)
    for prompt in singles:
        [out] = generate(core, [prompt])
        assert default_ref.assert_matches(prompt, out, NEW_TOKENS)
    batch = prompts_of([5 + 13 * i for i in range(16)], 49152, seed=8)
    check_all(default_ref, batch, generate(core, batch))


@pytest.mark.slow
def test_default_model_prefix_cache_preemption_and_chunking(
    default_model_dir: Path, default_ref: HfReference
) -> None:
    batch = prompts_of([5 + 13 * i for i in range(16)], 49152, seed=8)
    # tight cache (preemption) and small step budget (chunked prefill), warm prefix cache
    core = engine(default_model_dir, num_kv_blocks=40, max_num_batched_tokens=32)
    generate(core, batch[:4])
    check_all(default_ref, batch, generate(core, batch))
