"""The operator model and the model spec against FLOPs, bytes and times computed by hand for
a tiny Llama (2 layers, h 64, 4 heads and 2 KV heads of 16, I 128, V 512, bfloat16) on the
toy system of configurator_cases (GEMMs 5e11 FLOP/s, attention 2.5e11, memory 1e10 B/s,
links 1e9 B/s and 1 us a hop, 0.1 ms a step)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from configurator_cases import TINY_LLAMA, tiny_llama, toy_system, write_config

from armature.configurator.model_spec import read_model_spec
from armature.configurator.operators import (
    OperatorCost,
    get_all_reduce_s,
    get_attention,
    get_kv_transfer_s,
    get_layer_gemms,
    get_step_breakdown,
)
from armature.configurator.timing import PREFILL_CONTEXT_TOKENS, predict_profile
from armature.errors import ConfigError
from armature.sim.profile_timing import timing_from_profile
from armature.sim.timing import StepWork


def test_layer_gemms_at_tp1_and_tp2() -> None:
    model = tiny_llama()
    # qkv: 2*T*64*(64+2*32); weights 64*128*2 bytes; activations T*(64 + 128)*2
    assert get_layer_gemms(model, 10, 1) == {
        "qkv": OperatorCost(16384 * 10, 16384 + 384 * 10),
        "o": OperatorCost(8192 * 10, 8192 + 256 * 10),
        "mlp": OperatorCost(49152 * 10, 49152 + 1024 * 10),
    }
    assert get_layer_gemms(model, 10, 2) == {
        "qkv": OperatorCost(8192 * 10, 8192 + 256 * 10),
        "o": OperatorCost(4096 * 10, 4096 + 192 * 10),
        "mlp": OperatorCost(24576 * 10, 24576 + 640 * 10),
    }


def test_attention_prefill_causal_and_decode_reads_the_cache() -> None:
    model = tiny_llama()
    prefill, decode = get_attention(model, 100, 3, 300, 1)
    assert prefill == OperatorCost(2 * 100 * 100 * 64, 100 * (128 + 64) * 2)
    assert decode == OperatorCost(4 * 300 * 64, 300 * 2 * 32 * 2 + 3 * 2 * 64 * 2)
    # 4 ranks, 2 KV heads: each rank holds one KV head (replicated), a quarter of q
    _, decode = get_attention(model, 0, 1, 100, 4)
    assert decode == OperatorCost(4 * 100 * 16, 100 * 2 * 16 * 2 + 2 * 16 * 2)


def test_a_prefill_after_cached_tokens_attends_over_them() -> None:
    model = tiny_llama()
    # 100 new tokens after 500 cached: causal over their own, plus QK and PV over the 500
    # (4 * 100 * 500 * 64), reading the cached K and V (500 * 2 * 32 * 2 bytes)
    prefill, _ = get_attention(model, 100, 0, 0, 1, num_prefill_context_tokens=500)
    assert prefill == OperatorCost(
        2 * 100 * 100 * 64 + 4 * 100 * 500 * 64,
        100 * (128 + 64) * 2 + 500 * 2 * 32 * 2,
    )


def test_a_predicted_profile_prices_the_context_of_a_prefill() -> None:
    """The operator model's profile has prefills after PREFILL_CONTEXT_TOKENS cached ones;
    the timing fitted from it charges a prefill after a cached prefix what the operator model
    says it takes (within the fit's straight line)."""
    model, system = tiny_llama(), toy_system()
    profile = predict_profile(
        model,
        system,
        1,
        served_model_name="tiny",
        max_num_seqs=8,
        max_num_batched_tokens=512,
        num_kv_blocks=1024,
        block_size_tokens=16,
    )
    after = [p for p in profile.prefill if p.context_tokens]
    assert after and all(p.context_tokens == PREFILL_CONTEXT_TOKENS for p in after)
    assert max(p.input_tokens for p in after) <= 512
    timing = timing_from_profile(profile)
    assert timing.prefill_ms_per_context_pair > 0
    for t in (64, 256, 512):
        work = StepWork(t, 0, 0.0, num_prefill_context_pairs=t * PREFILL_CONTEXT_TOKENS)
        step = get_step_breakdown(
            model,
            system,
            1,
            num_prefill_tokens=t,
            num_decode_requests=0,
            num_kv_tokens=0,
            num_prefill_context_tokens=PREFILL_CONTEXT_TOKENS,
        )
        assert timing.step_ms(work) == pytest.approx(step.total_s * 1000, rel=0.1)
        assert timing.step_ms(work) > timing.step_ms(StepWork(t, 0, 0.0))


def test_all_reduce_and_kv_transfer() -> None:
    system = toy_system()
    assert get_all_reduce_s(system, 128000, 1) == 0.0
    # ring over 2: 2*(2-1)/2 * bytes / 1e9 + 2 hops of 1 us
    assert get_all_reduce_s(system, 128000, 2) == pytest.approx(1.28e-4 + 2e-6)
    assert get_all_reduce_s(system, 128000, 4) == pytest.approx(6 / 4 * 1.28e-4 + 6e-6)
    assert get_kv_transfer_s(1e6, 1e9, 0.5) == pytest.approx(2e-3)


def test_decode_step_is_memory_bound() -> None:
    step = get_step_breakdown(
        tiny_llama(),
        toy_system(),
        1,
        num_prefill_tokens=0,
        num_decode_requests=1,
        num_kv_tokens=100,
    )
    # per layer qkv 16768 + o 8448 + mlp 50176 bytes at 1e10 B/s; LM head 67712 bytes
    assert step.gemm_s == pytest.approx(2 * (1.6768e-6 + 8.448e-7 + 5.0176e-6) + 6.7712e-6)
    assert step.attention_s == pytest.approx(2 * 1.3056e-6)  # 13056 bytes of cache and q, o
    assert step.all_reduce_s == 0.0
    assert step.total_s == pytest.approx(1.244608e-4)


def test_prefill_step_at_tp2_is_compute_bound_in_attention() -> None:
    step = get_step_breakdown(
        tiny_llama(),
        toy_system(),
        2,
        num_prefill_tokens=1000,
        num_decode_requests=0,
        num_kv_tokens=0,
    )
    # GEMMs memory-bound: qkv 264192, o 196096, mlp 664576 bytes; LM head 33920 bytes
    assert step.gemm_s == pytest.approx(2 * (2.64192e-5 + 1.96096e-5 + 6.64576e-5) + 3.392e-6)
    # attention compute-bound: 2 * 1000^2 * 32 FLOPs at 2.5e11 per layer
    assert step.attention_s == pytest.approx(2 * 2.56e-4)
    # two all-reduces of 1000 * 64 * 2 bytes per layer
    assert step.all_reduce_s == pytest.approx(4 * (1.28e-4 + 2e-6))
    assert step.total_s == pytest.approx(1.3603648e-3)


def test_model_spec_counts_parameters_and_kv_bytes(tmp_path: Path) -> None:
    model = read_model_spec(write_config(tmp_path / "tiny", TINY_LLAMA), "bfloat16")
    assert model == tiny_llama()
    # per layer: attention 12288 + MLP 24576 + norms 128; embedding and LM head 2*512*64
    assert model.get_num_params() == 2 * (12288 + 24576 + 128) + 65536 + 64
    assert model.get_weight_bytes() == 139584 * 2
    assert model.get_kv_bytes_per_token() == 2 * 2 * 32 * 2
    assert read_model_spec(tmp_path / "tiny" / "config.json", "fp8").get_weight_bytes() == 139584


def test_model_spec_of_the_default_model_and_a_moe(tmp_path: Path, default_model_dir: Path) -> None:
    smol = read_model_spec(default_model_dir, "bfloat16")
    assert smol.get_num_params() == 134_515_008  # SmolLM2-135M, tied embeddings
    mixtral = {
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    }
    moe = read_model_spec(write_config(tmp_path / "mixtral", mixtral), "bfloat16")
    assert (moe.num_experts, moe.num_experts_per_token, moe.num_moe_layers) == (8, 2, 32)
    assert moe.get_num_params() == 46_702_792_704  # Mixtral-8x7B's 46.7B


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"hidden_size": 64}, "config.json has no num_attention_heads"),
        (
            {**TINY_LLAMA, "num_hidden_layers": 0},
            r"num_hidden_layers must be an integer in \[1, 2147483647\], got 0",
        ),
        (  # an OverflowError traceback before, sizing the weights
            {**TINY_LLAMA, "hidden_size": 10**400},
            r"hidden_size must be an integer in \[1, 2147483647\], got 1" + "0" * 39 + r"\.\.\.$",
        ),
        ([1, 2], "is not a JSON object"),
    ],
)
def test_model_spec_refuses_what_is_not_an_llm_config(
    tmp_path: Path, config: object, message: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=message):
        read_model_spec(tmp_path, "bfloat16")


def test_a_file_given_as_the_model_is_named_in_its_errors(tmp_path: Path) -> None:
    other = tmp_path / "prediction.json"
    other.write_text(json.dumps({"ttft_ms_p50": 12.5}))
    with pytest.raises(ConfigError) as caught:
        read_model_spec(other, "bfloat16")
    assert str(caught.value) == (
        f"--model {other}: prediction.json has no num_attention_heads (not a decoder-only LLM "
        "config?)"
    )


def test_model_spec_refuses_a_missing_file_and_an_unknown_dtype(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no config\.json there"):
        read_model_spec(tmp_path, "bfloat16")
    with pytest.raises(ConfigError, match="--dtype must be one of"):
        read_model_spec(tmp_path, "int3")
