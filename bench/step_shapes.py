"""The native engine's prompt steps at a token count it has not run before, against the next
step at the same count: what a loaded server pays that the profile's sweep does not.

    python -m bench.step_shapes [--lengths N] [--rounds R]   # writes docs/benchmarks.md
    python -m bench.step_shapes --quick                      # smoke run, bench/out/

A profile's sweep times prefills at a few lengths (the validation's: 16, 64, 128, 192 and 256
tokens), each several times, and keeps the median: every length's second and later steps. A
loaded server's steps carry prompt chunks of any length beside its decodes, so most of its
prompt steps run a token count its process has not run before. A math library that builds a
kernel per matrix shape on first use (oneDNN's primitive cache, with its JIT kernels for AMX
and AVX-512) pays that build in the first step of each new count, which the sweep's medians
never see; one without per-shape kernels pays nothing. The configurator issue: on the Intel
VM of 2026-12-02 a loaded engine's prompt steps ran 1.12-1.34 of the profile's tables where
its decode steps (a handful of shapes, all swept) ran 1.02-1.06.

One engine core in this process (the engine's own dtype choice, one torch thread, the
validation's step budget of 256 tokens and max-num-seqs 8), warmed up at the sweep's five
lengths. Each round takes `--lengths` token counts not run before (seeded, distinct, in
17..255 and off the sweep's lengths), and for each runs a fresh prompt of that many tokens
alone twice in a row: its step's wall time the first time over the second. A round's counts
are new to the process, so each round measures first uses again.
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Sequence

import torch

from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.engines.native.device import pick_dtype
from armature.protocols.engine import EngineRequest, SamplingParams
from bench.harness import parse_args, publish
from bench.report import Section, markdown_table

SWEPT_TOKENS = (16, 64, 128, 192, 256)
BUDGET_TOKENS = 256


def pick_lengths(num_lengths: int, rounds: int, seed: int) -> list[list[int]]:
    """`rounds` lists of `num_lengths` token counts in 17..255, none swept and none twice
    over all rounds. ValueError when there are not that many."""
    pool = [n for n in range(17, BUDGET_TOKENS) if n not in SWEPT_TOKENS]
    if num_lengths * rounds > len(pool):
        raise ValueError(f"{num_lengths} x {rounds} lengths: only {len(pool)} to pick from")
    picked = random.Random(seed).sample(pool, num_lengths * rounds)
    return [picked[i * num_lengths : (i + 1) * num_lengths] for i in range(rounds)]


class PromptSteps:
    """One engine core that runs a fresh random prompt alone and times its step."""

    def __init__(self, config: NativeEngineConfig, seed: int):
        self.core = EngineCore(config)
        self.vocab_size = self.core.arch.vocab_size
        self.rng = random.Random(seed)
        self.num_requests = 0

    def time_prompt_s(self, num_tokens: int) -> float:
        """The wall time of the step that prefills a fresh `num_tokens`-token prompt."""
        self.num_requests += 1
        request = EngineRequest(
            request_id=f"s{self.num_requests}",
            prompt_token_ids=[self.rng.randrange(self.vocab_size) for _ in range(num_tokens)],
            sampling=SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True),
        )
        self.core.take_step_records()
        self.core.add_request(request)
        while self.core.has_work():
            self.core.step()
        records = self.core.take_step_records()
        return sum(r.step_wall_s for r in records if r.num_scheduled_prefill_tokens)


def first_over_repeat(steps: PromptSteps, lengths: Sequence[int]) -> list[tuple[int, float, float]]:
    """(tokens, first step s, repeated step s) of each length, in order."""
    out = []
    for n in lengths:
        first_s = steps.time_prompt_s(n)
        out.append((n, first_s, steps.time_prompt_s(n)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, default=24, help="new token counts per round")
    parser.add_argument("--rounds", type=int, default=3)
    args, ns = parse_args(__doc__.splitlines()[0], parser)
    num_lengths, rounds = (4, 1) if args.quick else (ns.lengths, ns.rounds)
    torch.set_num_threads(1)  # as profiled: a worker is one core
    dtype = pick_dtype("auto", "cpu")
    config = NativeEngineConfig(
        model_dir=args.model_dir,
        dtype=dtype,
        device="cpu",
        max_num_seqs=8,
        max_num_batched_tokens=BUDGET_TOKENS,
    )
    steps = PromptSteps(config, args.seed)
    for n in SWEPT_TOKENS:  # the sweep's lengths, as a profiled engine has run them
        for _ in range(3):
            steps.time_prompt_s(n)
    rows, medians = [], []
    for number, lengths in enumerate(pick_lengths(num_lengths, rounds, args.seed), 1):
        timed = first_over_repeat(steps, lengths)
        ratios = [first / again for _, first, again in timed]
        medians.append(statistics.median(ratios))
        rows.append(
            [
                number,
                len(timed),
                f"{statistics.median(first for _, first, _ in timed) * 1e3:.1f}",
                f"{statistics.median(again for _, _, again in timed) * 1e3:.1f}",
                f"{medians[-1]:.3f}",
                f"{min(ratios):.3f}-{max(ratios):.3f}",
            ]
        )
        print(rows[-1], flush=True)
    swept = [steps.time_prompt_s(n) / steps.time_prompt_s(n) for n in SWEPT_TOKENS]
    body = (
        f"The native engine in this process ({dtype}, one torch thread, step budget "
        f"{BUDGET_TOKENS} tokens), warmed up at {', '.join(map(str, SWEPT_TOKENS))} tokens "
        f"three times each; {rounds} round(s) of {num_lengths} token counts new to the "
        "process, each a fresh prompt alone twice in a row. Ratio: the first step's wall "
        "time over the second's.\n\n"
        + markdown_table(
            [
                "round",
                "lengths",
                "first step ms, median",
                "second step ms, median",
                "first / second, median",
                "range",
            ],
            rows,
        )
        + f"\n\n- Median over rounds: {statistics.median(medians):.3f} "
        f"({min(medians):.3f}-{max(medians):.3f})\n"
        f"- The swept lengths again, two steps each (no new shape): median ratio "
        f"{statistics.median(swept):.3f}\n"
    )
    publish(args, Section("step_shapes", "Prompt steps at a new token count", body, dtype))


if __name__ == "__main__":
    main()
