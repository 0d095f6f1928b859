"""Engine flags and engine construction, shared by `armature serve` and `armature worker`."""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from armature.cli_args import CliError, parse_bytes, positive_float, positive_int

if TYPE_CHECKING:  # torch loads only when an engine is built
    from armature.engines.native.config import EngineConfig
    from armature.engines.native.core import EngineCore
    from armature.model.source import ResolvedModel

__all__ = ["BuiltEngines", "add_engine_args", "build_engines"]

log = logging.getLogger("armature")

DEFAULT_BLOCK_SIZE = 16


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help="local HF directory, ORG/NAME in the local HF cache, or omitted "
        "for the embedded SmolLM2-135M-Instruct",
    )
    parser.add_argument(
        "--engine",
        choices=["torch", "mocker", "vllm"],
        default="torch",
        help="torch: the native PyTorch engine; mocker: the same scheduler and KV cache with "
        "a timing model instead of a model (no weights loaded); vllm: vLLM's engine (needs "
        "pip install 'armature[vllm]')",
    )
    parser.add_argument(
        "--speedup-ratio",
        type=positive_float,
        default=1.0,
        help="mocker only: divide every simulated step time by this",
    )
    parser.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="weights and KV dtype; auto = bfloat16 where supported",
    )
    parser.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="auto = cuda where present, else cpu",
    )
    parser.add_argument(
        "--block-size",
        type=positive_int,
        default=None,
        help=f"tokens per KV block (default: {DEFAULT_BLOCK_SIZE}; vllm: its platform's, 128 on "
        "CPU, where it must be a multiple of 32)",
    )
    parser.add_argument(
        "--enforce-eager",
        action="store_true",
        help="vllm only: skip torch.compile (vLLM then starts in ~45 s instead of ~2 min on "
        "2 CPU cores, and runs slower)",
    )
    parser.add_argument(
        "--kv-cache-bytes",
        type=parse_bytes,
        default=1 << 30,
        help="KV cache capacity in bytes (e.g. 2GiB)",
    )
    parser.add_argument(
        "--num-kv-blocks",
        type=positive_int,
        default=None,
        help="KV cache capacity in blocks (overrides --kv-cache-bytes)",
    )
    parser.add_argument(
        "--max-num-seqs", type=positive_int, default=64, help="requests running at once"
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        default=1024,
        help="tokens per engine step (prefill chunk budget)",
    )
    parser.add_argument(
        "--max-model-len",
        type=positive_int,
        default=None,
        help="context length (default: the model's)",
    )
    parser.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    parser.add_argument("--seed", type=int, default=0, help="seed for requests that bring none")
    parser.add_argument(
        "--cache-dir",
        default=None,
        help="where the default model is converted (default: $ARMATURE_CACHE_DIR or the XDG cache)",
    )


@dataclass(frozen=True)
class BuiltEngines:
    cores: list[EngineCore]
    config: EngineConfig
    resolved: ResolvedModel
    load_s: float


def build_engines(
    args: argparse.Namespace, count: int, *, shared_kv_cache: bool = False
) -> BuiltEngines:
    """`count` engine cores of one model from the engine flags; CliError for user mistakes.
    `shared_kv_cache`: KV caches in shared memory (CPU) for same-host KV transfers."""
    import torch

    from armature.engines.native.config import EngineConfig, parse_dtype
    from armature.engines.native.core import EngineCore
    from armature.engines.native.device import pick_device, pick_dtype
    from armature.model.source import ModelSourceError, resolve_model
    from armature.sim.mocker import build_mocker_core
    from armature.sim.timing import PolynomialTiming

    try:
        device = pick_device(args.device)
        dtype = parse_dtype(pick_dtype(args.dtype, device))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    cache_dir = Path(args.cache_dir) if args.cache_dir else None
    try:
        resolved = resolve_model(args.model, cache_dir=cache_dir, log=log.info)
    except ModelSourceError as exc:
        raise CliError(str(exc)) from None
    started_s = time.perf_counter()
    try:
        config = EngineConfig(
            model_dir=resolved.path,
            dtype=dtype,
            device=device,
            block_size=args.block_size or DEFAULT_BLOCK_SIZE,
            num_kv_blocks=args.num_kv_blocks,
            kv_cache_bytes=args.kv_cache_bytes,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=args.max_model_len,
            enable_prefix_caching=not args.no_prefix_caching,
            seed=args.seed,
            shared_kv_cache=shared_kv_cache and device == "cpu" and args.engine == "torch",
            kv_pin_ttl_s=getattr(args, "kv_pin_ttl_s", 30.0),
        )
        cores = []
        for _ in range(count):
            if args.engine == "mocker":
                timing = PolynomialTiming(speedup_ratio=args.speedup_ratio)
                cores.append(build_mocker_core(config, timing=timing))
            else:
                cores.append(EngineCore(config))
    except (ValueError, KeyError, FileNotFoundError) as exc:
        raise CliError(f"cannot load {resolved.path}: {exc}") from None
    except torch.OutOfMemoryError:
        raise CliError(
            "out of memory while allocating the model or KV cache; lower --kv-cache-bytes"
        ) from None
    return BuiltEngines(cores, config, resolved, time.perf_counter() - started_s)
