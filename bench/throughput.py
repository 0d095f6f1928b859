"""Output tokens/s of the engine vs transformers, at several concurrencies, mixed prompt lengths.

    python -m bench.throughput            # full run, writes docs/benchmarks.md
    python -m bench.throughput --quick    # smoke run, writes bench/out/benchmarks.md

Workload: prompts of random token ids, lengths uniform in [32, 512] (seeded), 128 output
tokens each, greedy, EOS ignored so every request has the same length. For concurrency c:
  armature       EngineCore stepped directly, max_num_seqs = c, c requests kept in flight
                 (continuous batching) over max(2c, 4) requests;
  HF sequential  transformers `generate`, batch 1, over the c = 1 prompts;
  HF static      transformers `generate` on left-padded groups of c prompts (c > 1), each
                 group running until all rows have 128 tokens.
Wall time covers prefill and decode. Prompt i is the same prompt in every run.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
from dataclasses import dataclass

from bench.harness import (
    BenchArgs,
    RunResult,
    build_core,
    parse_args,
    publish,
    random_prompts,
    run_continuous,
    warm_up,
)
from bench.hf_baseline import load_hf_model, run_sequential, run_static_batches
from bench.report import Section, markdown_table

TARGET_C1_VS_SEQUENTIAL = 1.1
TARGET_C32_VS_STATIC = 1.3


@dataclass(frozen=True)
class Workload:
    concurrencies: tuple[int, ...]
    output_tokens: int
    min_prompt_tokens: int
    max_prompt_tokens: int
    requests_per_slot: int  # requests = max(requests_per_slot * c, min_requests)
    min_requests: int

    def num_requests(self, concurrency: int) -> int:
        return max(self.requests_per_slot * concurrency, self.min_requests)


FULL = Workload((1, 8, 32), 128, 32, 512, requests_per_slot=2, min_requests=4)
QUICK = Workload((1, 8, 32), 8, 16, 64, requests_per_slot=1, min_requests=2)


@dataclass(frozen=True)
class Row:
    concurrency: int
    armature: RunResult
    static: RunResult | None  # None at c = 1 (a static batch of 1 is the sequential run)


def _ratio(a: RunResult, b: RunResult | None) -> float | None:
    return None if b is None else a.tokens_per_s / b.tokens_per_s


def _fmt(value: float | None, suffix: str = "") -> str:
    return "—" if value is None else f"{value:,.2f}{suffix}"


def run(w: Workload, args: BenchArgs) -> tuple[list[Row], RunResult]:
    """One engine per concurrency (max_num_seqs differs); one HF model for all baselines."""
    print(f"loading {args.model_dir} ({args.dtype_name})", flush=True)
    hf_model = load_hf_model(args.model_dir, args.dtype)
    vocab_size = hf_model.config.vocab_size
    max_requests = max(w.num_requests(c) for c in (*w.concurrencies, 1))
    prompts = random_prompts(
        max_requests, vocab_size, w.min_prompt_tokens, w.max_prompt_tokens, args.seed
    )
    sequential_prompts = prompts[: w.num_requests(1)]
    sequential: RunResult | None = None
    rows: list[Row] = []
    for c in w.concurrencies:
        batch = prompts[: w.num_requests(c)]
        core = build_core(args, max_num_seqs=c)
        warm_up(core)
        ours = run_continuous(core, batch, c, w.output_tokens)
        del core
        gc.collect()
        print(f"c={c:>3} armature   {ours.tokens_per_s:8.2f} tok/s", flush=True)
        static = None
        if c > 1:
            static = run_static_batches(hf_model, batch, c, w.output_tokens)
            print(f"c={c:>3} HF static  {static.tokens_per_s:8.2f} tok/s", flush=True)
        if sequential is None and (c == 1 or c == w.concurrencies[-1]):
            # measured next to the c = 1 engine run, so drift on a shared machine hits both
            sequential = run_sequential(hf_model, sequential_prompts, w.output_tokens)
            print(f"      HF generate {sequential.tokens_per_s:8.2f} tok/s (batch 1)", flush=True)
        rows.append(Row(c, ours, static))
    assert sequential is not None
    return rows, sequential


def render(w: Workload, rows: list[Row], sequential: RunResult) -> str:
    table = markdown_table(
        [
            "concurrency",
            "requests",
            "armature tok/s",
            "HF generate (batch 1) tok/s",
            "HF static batch tok/s",
            "armature / generate",
            "armature / static batch",
        ],
        [
            [
                r.concurrency,
                r.armature.num_requests,
                _fmt(r.armature.tokens_per_s),
                _fmt(sequential.tokens_per_s),
                _fmt(r.static.tokens_per_s if r.static else None),
                _fmt(_ratio(r.armature, sequential), "x"),
                _fmt(_ratio(r.armature, r.static), "x"),
            ]
            for r in rows
        ],
    )
    checks = []
    by_c = {r.concurrency: r for r in rows}
    if 1 in by_c:
        ratio = _ratio(by_c[1].armature, sequential)
        assert ratio is not None
        verdict = "PASS" if ratio >= TARGET_C1_VS_SEQUENTIAL else "FAIL"
        checks.append(
            f"- {verdict}: c=1 is {ratio:.2f}x transformers `generate` "
            f"(target >= {TARGET_C1_VS_SEQUENTIAL}x)"
        )
    if 32 in by_c:
        ratio = _ratio(by_c[32].armature, by_c[32].static)
        assert ratio is not None
        verdict = "PASS" if ratio >= TARGET_C32_VS_STATIC else "FAIL"
        checks.append(
            f"- {verdict}: c=32 is {ratio:.2f}x the static padded batch of 32 "
            f"(target >= {TARGET_C32_VS_STATIC}x)"
        )
    workload = (
        f"Prompts: random token ids, lengths uniform in [{w.min_prompt_tokens}, "
        f"{w.max_prompt_tokens}] (seeded); {w.output_tokens} output tokens each, greedy, EOS "
        f"ignored. Armature: `EngineCore.step()` driven directly, max_num_seqs = concurrency, "
        f"that many requests kept in flight, max_num_batched_tokens 1024, prefix caching on (no "
        f"hits: random prompts). HF generate: batch 1 over the c=1 prompts. HF static batch: "
        f"left-padded groups of `concurrency` prompts, `min_new_tokens = max_new_tokens`. "
        f"Tokens/s = output tokens / wall time, prefill included."
    )
    return f"{workload}\n\n{table}\n\n" + "\n".join(checks) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=None)
    parser.add_argument("--output-tokens", type=int, default=None)
    args, ns = parse_args(parser.description or "", parser)
    w = QUICK if args.quick else FULL
    if ns.concurrency:
        w = dataclasses.replace(w, concurrencies=tuple(ns.concurrency))
    if ns.output_tokens:
        w = dataclasses.replace(w, output_tokens=ns.output_tokens)
    rows, sequential = run(w, args)
    body = render(w, rows, sequential)
    print()
    print(body)
    title = "Throughput: engine vs transformers"
    publish(
        args,
        Section(
            f"throughput-{args.dtype_name}", f"{title} ({args.dtype_name})", body, args.dtype_name
        ),
    )


if __name__ == "__main__":
    main()
