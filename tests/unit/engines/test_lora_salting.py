"""The KV block hash is salted by the request's LoRA adapter (the real engine core, driven by
the mocker's runner, which serves adapters by name): the same prompt on two adapters and the
base model shares no block, and repeats hit only their own adapter's blocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.kv.hashing import DEFAULT_HASH_SEED, compute_seq_hashes, hash_seed_for_salt
from armature.protocols.engine import EngineRequest, SamplingParams
from armature.protocols.kv_events import KvStored
from armature.protocols.lora import LoraNotFoundError
from armature.sim.mocker import build_mocker_core
from armature.sim.timing import PolynomialTiming

PROMPT = list(range(10, 58))  # 48 tokens: 3 full blocks of 16


@pytest.fixture
def core(tiny_llama_dir: Path) -> EngineCore:
    config = NativeEngineConfig(model_dir=tiny_llama_dir, num_kv_blocks=64)
    core = build_mocker_core(config, timing=PolynomialTiming(speedup_ratio=1e9))
    for name in ("a", "b"):
        core.loras.add(core.runner.read_lora(name, Path("/unused")))
    return core


def _run(core: EngineCore, rid: str, lora: str | None) -> int:
    """Run PROMPT with `lora` to the end; returns its prompt tokens found cached."""
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    core.add_request(
        EngineRequest(request_id=rid, prompt_token_ids=PROMPT, sampling=params, lora_name=lora)
    )
    cached = None
    while core.has_work():
        for out in core.step():
            if cached is None:
                cached = out.num_cached_tokens
    assert cached is not None
    return cached


def test_same_prompt_on_two_adapters_and_base_shares_no_blocks(core: EngineCore) -> None:
    assert [_run(core, "base", None), _run(core, "a1", "a"), _run(core, "b1", "b")] == [0, 0, 0]
    stored = [
        [b.seq_hash for b in e.blocks] for e in core.take_kv_events() if isinstance(e, KvStored)
    ]
    seeds = [DEFAULT_HASH_SEED, hash_seed_for_salt("a"), hash_seed_for_salt("b")]
    expected = [compute_seq_hashes(PROMPT, 16, seed) for seed in seeds]
    assert stored == expected  # one Stored event per request, each under its own salt
    assert len({h for hashes in expected for h in hashes}) == 9  # nothing shared
    assert sorted(core.pool.get_cached_hashes()) == sorted(h for hs in expected for h in hs)
    # a repeat finds its own adapter's prefix (all but the block of the last token)
    assert _run(core, "a2", "a") == 32
    assert _run(core, "base2", None) == 32
    core.pool.check_integrity()


def test_unknown_adapter_is_refused_naming_the_model(core: EngineCore) -> None:
    params = SamplingParams(max_tokens=2)
    request = EngineRequest(request_id="x", prompt_token_ids=PROMPT, sampling=params, lora_name="c")
    with pytest.raises(LoraNotFoundError, match="the model 'c' does not exist") as refused:
        core.validate(request)
    assert refused.value.param == "model"
    core.loras.remove("a")
    with pytest.raises(LoraNotFoundError, match="'a'"):
        core.add_request(
            EngineRequest(request_id="y", prompt_token_ids=PROMPT, sampling=params, lora_name="a")
        )
