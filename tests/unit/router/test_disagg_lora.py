"""A LoRA adapter in disaggregated serving, in one process: a DisaggRouter over a prefill and
a decode AsyncEngine (tiny float32 model, both serving the same random PEFT adapter) that move
KV blocks through real transfer agents. Greedy outputs with the adapter equal aggregated
serving's (one engine) and transformers + PEFT; the blocks both workers store and move are
hashed under the adapter's salt, so a decode worker that holds the same prompt's base-model
blocks pulls the adapter's rather than reusing them, and both kinds stay cached side by side;
every pool ends clean."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engines"))
from hf_reference import HfReference
from test_disagg_router import run, settle
from test_hf_equivalence import prompts_of

from armature.config import DisaggConfig, RouterConfig
from armature.engines.native.async_engine import AsyncEngine
from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.engines.native.transfer import start_transfer_agent
from armature.kv.hashing import DEFAULT_HASH_SEED, compute_seq_hashes
from armature.protocols.engine import EngineRequest, SamplingParams
from armature.router.disagg import DisaggRouter
from lora_adapters import make_adapter, peft_model

NEW_TOKENS = 8
ADAPTER = "a"


@pytest.fixture(scope="module")
def adapter(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_adapter(tiny_llama_dir, tmp_path_factory.mktemp("lora") / ADAPTER, seed=5)


def make_core(model_dir: Path, adapter: Path) -> EngineCore:
    config = NativeEngineConfig(
        model_dir=model_dir, dtype="float32", num_kv_blocks=128, shared_kv_cache=True
    )
    core = EngineCore(config)
    core.loras.add(core.runner.read_lora(ADAPTER, adapter))  # type: ignore[attr-defined]
    return core


def request(rid: str, prompt: list[int], lora: str | None) -> EngineRequest:
    sampling = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, min_tokens=NEW_TOKENS)
    return EngineRequest(request_id=rid, prompt_token_ids=prompt, sampling=sampling, lora_name=lora)


def aggregated(core: EngineCore, prompts: list[list[int]], lora: str | None) -> list[list[int]]:
    """Greedy outputs of one engine serving every prompt at once."""
    for i, prompt in enumerate(prompts):
        core.add_request(request(str(i), prompt, lora))
    outputs: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    while core.has_work():
        for out in core.step():
            outputs[out.request_id].extend(out.new_token_ids)
    return [outputs[str(i)] for i in range(len(prompts))]


async def test_an_adapters_disaggregated_output_and_kv_are_its_own(
    tiny_llama_dir: Path, adapter: Path
) -> None:
    prompts = prompts_of([33, 64, 100], 512, seed=31)
    expected = aggregated(make_core(tiny_llama_dir, adapter), prompts, ADAPTER)
    engines = {}
    for name in ("p0", "d0"):
        core = make_core(tiny_llama_dir, adapter)
        engines[name] = AsyncEngine(core, start_transfer_agent(core, worker_id=name))
    prefill, decode = engines["p0"], engines["d0"]
    router = DisaggRouter(
        {"d0": decode},
        RouterConfig(policy="kv", block_size_tokens=16),
        DisaggConfig(max_local_prefill_tokens=0),
        prefill_engines={"p0": prefill},
    )
    router.start()
    try:
        # the base model first: the decode worker then caches these prompts' base blocks
        base = [await run(router, request(f"b{i}", p, None)) for i, p in enumerate(prompts)]
        pulled_for_base = decode.num_kv_blocks_pulled
        assert pulled_for_base == sum(len(p) // 16 for p in prompts)  # every full prompt block
        seed = prefill.core.loras.get(ADAPTER).hash_seed  # type: ignore[union-attr]
        assert seed != DEFAULT_HASH_SEED
        outputs = await asyncio.gather(
            *(run(router, request(f"r{i}", p, ADAPTER)) for i, p in enumerate(prompts))
        )
        assert list(outputs) == expected
        assert list(outputs) != base  # the adapter changes the output
        assert router.num_prefills == {"remote": 6, "local": 0}
        # the adapter's blocks were pulled in full (no base block reused), and both workers
        # cache each prompt's blocks twice: under the adapter's salt and unsalted
        assert decode.num_kv_blocks_pulled - pulled_for_base == pulled_for_base
        assert decode.num_kv_pull_failures == 0
        salted = {h for p in prompts for h in compute_seq_hashes(p, 16, seed)}
        unsalted = {h for p in prompts for h in compute_seq_hashes(p, 16, DEFAULT_HASH_SEED)}
        assert len(salted) == len(unsalted) == pulled_for_base and not salted & unsalted
        await settle(router)
        for engine in (prefill, decode):
            assert set(engine.core.pool.get_cached_hashes()) == salted | unsalted
    finally:
        await router.stop()
    reference = HfReference(tiny_llama_dir, peft_model(tiny_llama_dir, adapter))
    for prompt, output in zip(prompts, outputs, strict=True):
        assert reference.assert_matches(prompt, output, NEW_TOKENS)
