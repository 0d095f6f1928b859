"""Decode steps over a batch of mixed context lengths against one of equal lengths with the
same mean (the native engine attends to each group of decodes padded to the group's longest
context: `model.decode_groups`).

    python -m bench.decode_groups [--rounds R]   # writes docs/benchmarks.md
    python -m bench.decode_groups --quick        # smoke run, writes bench/out/benchmarks.md

Per round, in turn: 8 requests of 160-token prompts, then 4 of 32 and 4 of 288 tokens (the
same mean context), each batch prefilled and then decoded together; a batch's figure is the
median wall time of its decode-only steps (the engine's step records). With one group per
batch, the mixed batch pays for 8 x its longest context; grouped, about what its sequences
attend over.
"""

from __future__ import annotations

import argparse
import statistics

from armature.engines.native.core import EngineCore
from armature.protocols.engine import EngineRequest
from bench.harness import build_core, greedy, parse_args, publish, random_prompts, warm_up
from bench.report import Section, markdown_table

UNIFORM = [160] * 8
MIXED = [32] * 4 + [288] * 4


def decode_step_ms(core: EngineCore, lengths: list[int], new_tokens: int, seed: int) -> float:
    """The median wall time of the decode-only steps of `lengths`' prompts decoded together."""
    prompts = [
        random_prompts(1, core.arch.vocab_size, n, n, seed + i)[0] for i, n in enumerate(lengths)
    ]
    for i, prompt in enumerate(prompts):
        request_id = f"s{seed}-{i}"
        core.add_request(
            EngineRequest(
                request_id=request_id, prompt_token_ids=prompt, sampling=greedy(new_tokens)
            )
        )
    core.take_step_records()
    while core.has_work():
        core.step()
    steps = [
        r.step_wall_s * 1000.0
        for r in core.take_step_records()
        if r.num_scheduled_prefill_tokens == 0 and r.num_decode_requests == len(lengths)
    ]
    if not steps:
        raise RuntimeError("no decode-only step of the whole batch ran")
    return statistics.median(steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args, ns = parse_args(__doc__.splitlines()[0], parser)
    rounds = 1 if args.quick else ns.rounds
    new_tokens = 8 if args.quick else 40
    core = build_core(args, max_num_seqs=8, max_num_batched_tokens=2048)
    warm_up(core)
    rows, ratios = [], []
    for r in range(rounds):
        uniform = decode_step_ms(core, UNIFORM, new_tokens, seed=1000 * r)
        mixed = decode_step_ms(core, MIXED, new_tokens, seed=1000 * r + 500)
        ratios.append(mixed / uniform)
        rows.append([r + 1, f"{uniform:.1f}", f"{mixed:.1f}", f"{mixed / uniform:.3f}"])
        print(rows[-1], flush=True)
    body = (
        f"The native engine in-process ({args.dtype_name}, max-num-seqs 8), {rounds} rounds in "
        f"turn: 8 requests of 160-token prompts, then 4 of 32 and 4 of 288 tokens (the same "
        f"mean context); each batch's median decode-only step time over {new_tokens} output "
        "tokens (its step records).\n\n"
        + markdown_table(["round", "8 x 160 ms", "4 x 32 + 4 x 288 ms", "mixed / equal"], rows)
        + f"\n\n- mixed / equal: median {statistics.median(ratios):.3f}, "
        f"{min(ratios):.3f}-{max(ratios):.3f}\n"
    )
    publish(
        args, Section("decode_groups", "Decode steps: mixed context lengths", body, args.dtype_name)
    )


if __name__ == "__main__":
    main()
