"""In float32 the native engine's greedy output with a LoRA adapter equals transformers + PEFT
on the same adapter: one adapter alone, and two adapters and the base model mixed in one
batch (one forward pass). Adapters are small random ones made with PEFT."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hf_reference import HfReference

from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.protocols.engine import EngineRequest, SamplingParams
from lora_adapters import make_adapter, peft_model

NEW_TOKENS = 10


@pytest.fixture(scope="module")
def adapters(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loras")
    return {
        # rank 4 on three projections
        "a1": make_adapter(default_model_dir, root / "a1", seed=1),
        # rank 8, rslora scaling, every projection
        "a2": make_adapter(
            default_model_dir,
            root / "a2",
            seed=2,
            rank=8,
            alpha=16,
            targets="all-linear",
            rslora=True,
        ),
    }


@pytest.fixture(scope="module")
def core(default_model_dir: Path, adapters: dict[str, Path]) -> EngineCore:
    config = NativeEngineConfig(
        model_dir=default_model_dir,
        dtype="float32",
        num_kv_blocks=256,
        max_num_batched_tokens=2048,
    )
    core = EngineCore(config)
    for name, path in adapters.items():
        core.loras.add(core.runner.read_lora(name, path))  # type: ignore[attr-defined]
    return core


@pytest.fixture(scope="module")
def refs(default_model_dir: Path, adapters: dict[str, Path]) -> dict[str | None, HfReference]:
    """transformers' greedy references: + PEFT for each adapter, and the base model (None)."""
    out: dict[str | None, HfReference] = {None: HfReference(default_model_dir)}
    for name, path in adapters.items():
        out[name] = HfReference(default_model_dir, peft_model(default_model_dir, path))
    return out


def _request(i: int, prompt: list[int], lora: str | None) -> EngineRequest:
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, min_tokens=NEW_TOKENS)
    return EngineRequest(
        request_id=str(i), prompt_token_ids=prompt, sampling=params, lora_name=lora
    )


def _prompts(lengths: list[int], seed: int, vocab: int = 49152) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def test_one_adapter_matches_peft(core: EngineCore, refs: dict[str | None, HfReference]) -> None:
    ref, base = refs["a1"], refs[None]
    for i, prompt in enumerate(_prompts([9, 40], seed=3)):
        core.add_request(_request(i, prompt, "a1"))
        out: list[int] = []
        while core.has_work():
            for o in core.step():
                out.extend(o.new_token_ids)
        assert ref.assert_matches(prompt, out, NEW_TOKENS)
        assert out != base.greedy(prompt, NEW_TOKENS)  # the adapter changed the output


def test_mixed_batch_of_two_adapters_and_base_matches_peft(
    core: EngineCore, refs: dict[str | None, HfReference]
) -> None:
    loras = ["a1", "a2", None, "a2", "a1", None]
    prompts = _prompts([7, 19, 33, 16, 25, 12], seed=4)
    for i, (prompt, lora) in enumerate(zip(prompts, loras, strict=True)):
        core.add_request(_request(i, prompt, lora))
    outputs: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    first = core.step()
    assert sorted(o.request_id for o in first) == sorted(outputs)  # one step, every prompt
    for o in first:
        outputs[o.request_id].extend(o.new_token_ids)
    while core.has_work():
        for o in core.step():
            outputs[o.request_id].extend(o.new_token_ids)
    assert core.pool.get_num_active_blocks() == 0
    core.pool.check_integrity()
    for i, (prompt, lora) in enumerate(zip(prompts, loras, strict=True)):
        assert refs[lora].assert_matches(prompt, outputs[str(i)], NEW_TOKENS), (i, lora)


def test_qkv_bias_model_with_an_adapter_matches_peft(tiny_qwen2_dir: Path, tmp_path: Path) -> None:
    """Qwen2 (q/k/v biases): the LoRA update adds to the biased projection, as PEFT's does."""
    path = make_adapter(tiny_qwen2_dir, tmp_path / "q", seed=7, targets="all-linear")
    config = NativeEngineConfig(model_dir=tiny_qwen2_dir, dtype="float32", num_kv_blocks=64)
    core = EngineCore(config)
    core.loras.add(core.runner.read_lora("q", path))  # type: ignore[attr-defined]
    ref = HfReference(tiny_qwen2_dir, peft_model(tiny_qwen2_dir, path))
    prompts = _prompts([5, 21, 40], seed=8, vocab=512)
    for i, prompt in enumerate(prompts):
        core.add_request(_request(i, prompt, "q" if i != 1 else None))
    outputs: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    while core.has_work():
        for o in core.step():
            outputs[o.request_id].extend(o.new_token_ids)
    base = HfReference(tiny_qwen2_dir)
    for i, prompt in enumerate(prompts):
        assert (base if i == 1 else ref).assert_matches(prompt, outputs[str(i)], NEW_TOKENS)
    assert outputs["0"] != base.greedy(prompts[0], NEW_TOKENS)


def test_adapter_of_some_layers_by_regex_matches_peft(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """A regex target_modules names modules of some layers only (PEFT matches it against each
    module's full name): those alone are adapted, here as in PEFT."""
    regex = r".*layers\.1\.self_attn\.(q|v)_proj|.*layers\.0\.mlp\.down_proj"
    path = make_adapter(tiny_llama_dir, tmp_path / "r", seed=9, targets=regex)
    config = NativeEngineConfig(model_dir=tiny_llama_dir, dtype="float32", num_kv_blocks=64)
    core = EngineCore(config)
    served = core.runner.read_lora("r", path)  # type: ignore[attr-defined]
    core.loras.add(served)
    reference = peft_model(tiny_llama_dir, path)
    # PEFT's names: base_model.model.model.layers.{i}.{sublayer}.{module}.lora_A
    names = [n.split(".") for n, _ in reference.named_modules() if n.endswith(".lora_A")]
    adapted = {(int(parts[-4]), parts[-2]) for parts in names}
    ours = {(i, m) for i, layer in enumerate(served.weights.layers) for m in layer}
    assert adapted == ours == {(0, "down_proj"), (1, "q_proj"), (1, "v_proj")}
    ref, base = HfReference(tiny_llama_dir, reference), HfReference(tiny_llama_dir)
    prompts = _prompts([6, 23], seed=10, vocab=512)
    for i, prompt in enumerate(prompts):
        core.add_request(_request(i, prompt, "r"))
    outputs: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    while core.has_work():
        for o in core.step():
            outputs[o.request_id].extend(o.new_token_ids)
    for i, prompt in enumerate(prompts):
        assert ref.assert_matches(prompt, outputs[str(i)], NEW_TOKENS)
        assert outputs[str(i)] != base.greedy(prompt, NEW_TOKENS)  # the adapter changed it
