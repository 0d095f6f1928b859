"""What every benchmark script shares: the command line (--quick, --out, --threads, --dtype),
the default model, seeded random-token prompts, and driving an EngineCore directly with a
fixed number of requests in flight (continuous batching).
"""

from __future__ import annotations

import argparse
import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.model.dtypes import torch_dtype
from armature.model.source import resolve_model
from armature.protocols.engine import EngineRequest, FinishReason, SamplingParams
from bench.paths import DOCS_OUT, REPO_ROOT, SCRATCH_OUT, results_path
from bench.report import Section, get_machine_facts, write_section

__all__ = [
    "BenchArgs",
    "RunResult",
    "build_core",
    "greedy",
    "parse_args",
    "publish",
    "random_prompts",
    "run_continuous",
    "warm_up",
]


@dataclass(frozen=True)
class BenchArgs:
    quick: bool
    out: Path
    dtype_name: str
    model_dir: Path
    served_name: str
    seed: int

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype_name)


def parse_args(
    description: str, parser: argparse.ArgumentParser | None = None
) -> tuple[BenchArgs, argparse.Namespace]:
    """Parse the shared options (plus any the caller added to `parser`) and apply --threads."""
    parser = parser or argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: tiny workload, results go to {SCRATCH_OUT.relative_to(REPO_ROOT)}",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"markdown file to write the section into (default: "
        f"{DOCS_OUT.relative_to(REPO_ROOT)}, or the scratch file with --quick)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: torch's choice). On an oversubscribed machine "
        "1 thread avoids OpenMP spin-waits that cost ~10 ms per op.",
    )
    parser.add_argument("--dtype", choices=["bfloat16", "float32", "float16"], default="bfloat16")
    parser.add_argument("--model", default=None, help="as `armature serve --model`")
    parser.add_argument("--seed", type=int, default=0, help="seed for prompts")
    ns = parser.parse_args()
    if ns.threads is not None:
        torch.set_num_threads(ns.threads)
    resolved = resolve_model(ns.model)
    out = ns.out or results_path(ns.quick)
    args = BenchArgs(
        quick=ns.quick,
        out=out,
        dtype_name=ns.dtype,
        model_dir=resolved.path,
        served_name=resolved.served_name,
        seed=ns.seed,
    )
    return args, ns


def publish(args: BenchArgs, section: Section) -> None:
    write_section(args.out, section, get_machine_facts())
    print(f"\nwrote section {section.name!r} to {args.out}")


def random_prompts(
    num_prompts: int, vocab_size: int, min_len: int, max_len: int, seed: int
) -> list[list[int]]:
    """Prompts of uniformly random token ids, lengths uniform in [min_len, max_len]. The same
    arguments always give the same prompts, and prompt i doesn't depend on num_prompts."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(num_prompts):
        length = rng.randint(min_len, max_len)
        prompts.append([rng.randrange(vocab_size) for _ in range(length)])
    return prompts


def greedy(max_tokens: int) -> SamplingParams:
    """Greedy, fixed length: EOS is ignored so every request makes exactly max_tokens."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def build_core(args: BenchArgs, max_num_seqs: int, **overrides: Any) -> EngineCore:
    """An EngineCore on CPU for the benchmark model; `overrides` are NativeEngineConfig fields."""
    config = NativeEngineConfig(
        model_dir=args.model_dir,
        dtype=args.dtype_name,
        device="cpu",
        max_num_seqs=max_num_seqs,
        **overrides,
    )
    return EngineCore(config)


@dataclass(frozen=True)
class RunResult:
    num_requests: int
    num_output_tokens: int
    wall_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.num_output_tokens / self.wall_s


def run_continuous(
    core: EngineCore,
    prompts: Sequence[list[int]],
    concurrency: int,
    max_tokens: int,
    id_prefix: str = "bench",
    lora_names: Sequence[str | None] = (None,),
) -> RunResult:
    """Serve every prompt with at most `concurrency` requests in flight: whenever one
    finishes, the next is added before the following step. Prompt i runs with LoRA adapter
    `lora_names[i % len(lora_names)]` (None: the base model). Wall time covers the first add
    to the last token; asserts every request ran to exactly max_tokens."""
    pending = deque(enumerate(prompts))
    in_flight: set[str] = set()
    num_tokens = 0
    started_s = time.perf_counter()
    while pending or in_flight:
        while pending and len(in_flight) < concurrency:
            index, prompt = pending.popleft()
            request_id = f"{id_prefix}-{index}"
            core.add_request(
                EngineRequest(
                    request_id=request_id,
                    prompt_token_ids=prompt,
                    sampling=greedy(max_tokens),
                    lora_name=lora_names[index % len(lora_names)],
                )
            )
            in_flight.add(request_id)
        for output in core.step():
            num_tokens += len(output.new_token_ids)
            if output.finish_reason is not None:
                assert output.finish_reason is FinishReason.LENGTH, output
                in_flight.remove(output.request_id)
    wall_s = time.perf_counter() - started_s
    assert num_tokens == len(prompts) * max_tokens, (num_tokens, len(prompts), max_tokens)
    return RunResult(len(prompts), num_tokens, wall_s)


def warm_up(core: EngineCore, num_requests: int = 2) -> None:
    """A few short requests so lazy initialisation (allocator, kernels) is not timed."""
    prompts = random_prompts(num_requests, core.arch.vocab_size, 24, 40, seed=12345)
    run_continuous(core, prompts, num_requests, max_tokens=4, id_prefix="warmup")
