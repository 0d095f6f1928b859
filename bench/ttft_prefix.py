"""Time to first token of a 512-token prompt, cold vs served from the prefix cache.

    python -m bench.ttft_prefix            # full run, writes docs/benchmarks.md
    python -m bench.ttft_prefix --quick    # smoke run, writes bench/out/benchmarks.md

EngineCore driven directly, one request at a time. Each repetition sends a fresh random
prompt (cold: nothing cached), lets it finish, then sends the same prompt again under a new
request id (cached: every full block but the one holding the last token is a prefix hit).
TTFT = add_request to the step that returns the request's first token.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from armature.engines.native.core import EngineCore
from armature.protocols.engine import EngineRequest
from armature.workload.measure import quantile
from bench.harness import build_core, greedy, parse_args, publish, random_prompts, warm_up
from bench.report import Section, markdown_table

TARGET_SPEEDUP = 5.0


@dataclass(frozen=True)
class Ttft:
    ttft_ms: float
    num_cached_tokens: int


def measure_ttft(core: EngineCore, request_id: str, prompt: list[int]) -> Ttft:
    """Add one request (max_tokens 1) to an idle engine and step until its first token."""
    assert not core.has_work()
    started_s = time.perf_counter()
    request = EngineRequest(request_id=request_id, prompt_token_ids=prompt, sampling=greedy(1))
    core.add_request(request)
    while True:
        for output in core.step():
            if output.request_id == request_id and output.new_token_ids:
                ttft_ms = (time.perf_counter() - started_s) * 1e3
                assert output.finish_reason is not None  # max_tokens 1: done after one token
                return Ttft(ttft_ms, output.num_cached_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=None, help="default 5 (2 with --quick)")
    args, ns = parse_args(parser.description or "", parser)
    repeats = ns.repeats or (2 if args.quick else 5)
    core = build_core(args, max_num_seqs=1)
    # the whole prompt must fit one step, or cold TTFT would also measure chunking
    assert ns.prompt_tokens <= core.config.max_num_batched_tokens
    warm_up(core)
    # all prompts (warm-up first) are drawn from one stream: none starts cached by accident
    warm, *prompts = random_prompts(
        repeats + 1, core.arch.vocab_size, ns.prompt_tokens, ns.prompt_tokens, args.seed
    )
    measure_ttft(core, "warm-cold", warm)  # both paths once, untimed
    measure_ttft(core, "warm-cached", warm)
    rows = []
    for i, prompt in enumerate(prompts):
        cold = measure_ttft(core, f"cold-{i}", prompt)
        cached = measure_ttft(core, f"cached-{i}", prompt)
        assert cold.num_cached_tokens == 0, cold
        print(
            f"rep {i}: cold {cold.ttft_ms:8.1f} ms, cached {cached.ttft_ms:8.1f} ms "
            f"({cached.num_cached_tokens} tokens cached)",
            flush=True,
        )
        rows.append((cold, cached))
    cold_p50 = quantile([c.ttft_ms for c, _ in rows], 0.5)
    cached_p50 = quantile([c.ttft_ms for _, c in rows], 0.5)
    speedup = cold_p50 / cached_p50
    table = markdown_table(
        ["repetition", "cold TTFT ms", "cached TTFT ms", "cached tokens", "speedup"],
        [
            [i, c.ttft_ms, h.ttft_ms, h.num_cached_tokens, f"{c.ttft_ms / h.ttft_ms:.1f}x"]
            for i, (c, h) in enumerate(rows)
        ]
        + [["**median**", cold_p50, cached_p50, "", f"**{speedup:.1f}x**"]],
    )
    verdict = "PASS" if speedup >= TARGET_SPEEDUP else "FAIL"
    body = (
        f"{ns.prompt_tokens}-token prompts of random token ids, max_tokens 1, greedy; "
        f"EngineCore stepped directly (block size {core.config.block_size}, prefix caching "
        f"on, {repeats} repetitions, each a fresh prompt). Cold = first time the prompt is "
        f"seen; cached = the same prompt again after the first finished.\n\n{table}\n\n"
        f"- {verdict}: cached TTFT is {speedup:.1f}x faster than cold (median; target >= "
        f"{TARGET_SPEEDUP:.0f}x)\n"
    )
    print()
    print(body)
    publish(args, Section("ttft_prefix", "TTFT: cold vs prefix-cached", body, args.dtype_name))


if __name__ == "__main__":
    main()
