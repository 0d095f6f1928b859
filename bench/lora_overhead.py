"""The cost of serving LoRA adapters: native-engine throughput at concurrency 8 with no
adapter, with one adapter on every request, and with four adapters and the base model mixed
in every batch.

    python -m bench.lora_overhead              # full run, docs/benchmarks.md
    python -m bench.lora_overhead --quick      # smoke run, bench/out/

The adapters are random (seeded), rank 16 on every projection of every layer (the most work
an adapter adds), written in PEFT's layout and read by the engine as `--lora` reads them. The
arms run the same prompts in turn, alternating over rounds so that the shared machine's drift
hits each; throughput is output tokens over the arm's wall time (the median round is shown).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from armature.engines.native.core import EngineCore
from armature.model.arch import ModelArch
from armature.model.lora import LORA_MODULES, lora_module_shapes
from armature.workload.measure import quantile
from bench.harness import build_core, parse_args, publish, random_prompts, run_continuous, warm_up
from bench.report import Section, markdown_table

CONCURRENCY = 8
RANK = 16
ARMS: dict[str, tuple[str | None, ...]] = {
    "base model": (None,),
    "one adapter": ("a0",),
    "4 adapters + base, mixed": ("a0", "a1", "a2", "a3", None),
}


def write_adapter(path: Path, arch: ModelArch, seed: int) -> Path:
    """A random rank-RANK adapter on every projection, in PEFT's layout."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(arch.num_layers):
        for module, sublayer in LORA_MODULES.items():
            out_features, in_features = lora_module_shapes(arch)[module]
            key = f"base_model.model.model.layers.{layer}.{sublayer}.{module}"
            a = torch.randn(RANK, in_features, generator=generator) / in_features**0.5
            b = torch.randn(out_features, RANK, generator=generator) * 0.01
            tensors[f"{key}.lora_A.weight"], tensors[f"{key}.lora_B.weight"] = a, b
    path.mkdir(parents=True)
    save_file(tensors, path / "adapter_model.safetensors")
    config = {
        "peft_type": "LORA",
        "r": RANK,
        "lora_alpha": 2 * RANK,
        "target_modules": "all-linear",
    }
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


def main() -> None:
    args, _ = parse_args(__doc__ or "")
    num_requests, max_tokens, rounds = (8, 8, 1) if args.quick else (32, 32, 3)
    core: EngineCore = build_core(args, CONCURRENCY, num_kv_blocks=1024)
    with tempfile.TemporaryDirectory() as scratch:
        for i in range(4):
            path = write_adapter(Path(scratch) / f"a{i}", core.arch, seed=i)
            core.loras.add(core.runner.read_lora(f"a{i}", path))  # type: ignore[attr-defined]
    warm_up(core)
    prompts = random_prompts(num_requests, core.arch.vocab_size, 64, 128, args.seed)
    tok_s: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for r in range(rounds):
        for arm, names in ARMS.items():
            core.pool.reset_prefix_cache()  # every arm computes its prompts
            result = run_continuous(core, prompts, CONCURRENCY, max_tokens, f"{arm}-{r}", names)
            tok_s[arm].append(result.tokens_per_s)
            print(f"round {r}: {arm}: {result.tokens_per_s:.1f} tok/s")
    base = quantile(tok_s["base model"], 0.5)
    rows = []
    for arm, values in tok_s.items():
        median = quantile(values, 0.5)
        rows.append([arm, f"{median:.1f}", f"{(1 - median / base) * 100:+.1f}%"])
    body = (
        f"{num_requests} requests of 64-128 random prompt tokens and {max_tokens} output tokens "
        f"each, {CONCURRENCY} in flight, {rounds} rounds; adapters of rank {RANK} on all seven "
        "projections of every layer.\n\n"
        + markdown_table(["arm", "output tok/s (median)", "cost vs base"], rows)
    )
    publish(args, Section("lora_overhead", "LoRA adapters: throughput cost", body, args.dtype_name))


if __name__ == "__main__":
    main()
