"""Where a decode step's time goes, at concurrency 1 and 32.

    python -m bench.profile_decode            # full run, writes docs/benchmarks.md
    python -m bench.profile_decode --quick    # smoke run, writes bench/out/benchmarks.md

For each concurrency c: c requests with random prompts are prefilled, a few decode steps run
untimed, then the same number of pure-decode steps (batch c) run three times: plain (step
time), under cProfile (engine phases: schedule / build_batch / forward / sample), and under
torch.profiler (top aten ops by self CPU time). Profilers add overhead; read their numbers
as shares, and the plain run for absolute time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from dataclasses import dataclass

from torch.profiler import ProfilerActivity, profile

from armature.engines.native.core import EngineCore
from armature.protocols.engine import EngineRequest
from bench.harness import build_core, greedy, parse_args, publish, random_prompts, warm_up
from bench.report import Section, markdown_table

# (file name, function name) of the engine phases, in step order
PHASES = {
    "Scheduler.schedule": ("scheduler.py", "schedule"),
    "TorchModelRunner.build_batch": ("model_runner.py", "build_batch"),
    "model forward": ("forward.py", "forward"),
    "sampler.sample": ("sampler.py", "sample"),
    "StepStats.record": ("step_stats.py", "record"),
}
STEP = ("core.py", "step")


@dataclass(frozen=True)
class Plan:
    prompt_tokens: int
    settle_steps: int  # decode steps run untimed before measuring
    measured_steps: int  # per tool
    top_ops: int


FULL = Plan(prompt_tokens=256, settle_steps=3, measured_steps=10, top_ops=15)
QUICK = Plan(prompt_tokens=32, settle_steps=1, measured_steps=2, top_ops=10)


def start_decoding(core: EngineCore, c: int, plan: Plan, seed: int) -> None:
    """Add c requests and step until every one has its first token (all prefills done)."""
    max_tokens = plan.settle_steps + 3 * plan.measured_steps + 2
    prompts = random_prompts(c, core.arch.vocab_size, plan.prompt_tokens, plan.prompt_tokens, seed)
    for i, prompt in enumerate(prompts):
        request = EngineRequest(
            request_id=f"p-{i}", prompt_token_ids=prompt, sampling=greedy(max_tokens)
        )
        core.add_request(request)
    started: set[str] = set()
    while len(started) < c:
        started.update(o.request_id for o in core.step())
    for _ in range(plan.settle_steps):
        core.step()


def _decode_steps(core: EngineCore, c: int, num_steps: int) -> None:
    for _ in range(num_steps):
        outputs = core.step()
        assert len(outputs) == c and core.take_step_records()[-1].num_decode_requests == c


def _cumtime_s(stats: pstats.Stats, where: tuple[str, str]) -> float:
    file_name, func = where
    raw = stats.stats  # type: ignore[attr-defined]  # pstats keeps it undocumented but public
    return sum(
        ct
        for (path, _, name), (_, _, _, ct, _) in raw.items()
        if name == func and path.endswith(file_name)
    )


def profile_phases(core: EngineCore, c: int, num_steps: int) -> list[list[object]]:
    profiler = cProfile.Profile()
    profiler.enable()
    _decode_steps(core, c, num_steps)
    profiler.disable()
    stats = pstats.Stats(profiler)
    step_s = _cumtime_s(stats, STEP)
    rows: list[list[object]] = []
    for label, where in PHASES.items():
        phase_s = _cumtime_s(stats, where)
        rows.append([label, phase_s / num_steps * 1e3, f"{phase_s / step_s:.0%}"])
    print(f"\n-- cProfile, c={c}: top functions by own time --")
    stats.sort_stats("tottime").print_stats(12)
    return rows


def profile_ops(
    core: EngineCore, c: int, num_steps: int, top: int
) -> tuple[list[list[object]], float]:
    """Top torch ops by self CPU time, and the share of wall time spent outside any op."""
    started_s = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _decode_steps(core, c, num_steps)
    wall_us = (time.perf_counter() - started_s) * 1e6
    averages = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total_self_us = sum(e.self_cpu_time_total for e in averages)
    rows: list[list[object]] = [
        [
            f"`{e.key}`",
            e.self_cpu_time_total / num_steps / 1e3,
            f"{e.self_cpu_time_total / wall_us:.1%}",
            e.count // num_steps,
        ]
        for e in averages[:top]
    ]
    outside = max(0.0, 1 - total_self_us / wall_us)
    return rows, outside


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    args, ns = parse_args(parser.description or "", parser)
    plan = QUICK if args.quick else FULL
    sections = []
    for c in ns.concurrency:
        core = build_core(args, max_num_seqs=c)
        warm_up(core)
        start_decoding(core, c, plan, args.seed)
        started_s = time.perf_counter()
        _decode_steps(core, c, plan.measured_steps)
        step_ms = (time.perf_counter() - started_s) / plan.measured_steps * 1e3
        phases = profile_phases(core, c, plan.measured_steps)
        ops, outside = profile_ops(core, c, plan.measured_steps, plan.top_ops)
        text = (
            f"### c = {c}: {step_ms:.1f} ms per decode step ({c / step_ms * 1e3:.1f} tok/s), "
            f"unprofiled\n\n"
            + markdown_table(["phase (cProfile)", "ms / step", "share of step"], phases)
            + "\n\n"
            + markdown_table(
                ["torch op (torch.profiler)", "self ms / step", "share of wall", "calls / step"],
                ops,
            )
            + f"\n\nOutside any torch op (Python, scheduling, profiler): {outside:.0%} of wall.\n"
        )
        print(f"\n{text}", flush=True)
        sections.append(text)
        del core
    body = (
        f"Pure decode steps after {plan.prompt_tokens}-token random prompts were prefilled; "
        f"{plan.measured_steps} steps per measurement, greedy. cProfile and torch.profiler "
        f"slow the step down: shares are the signal.\n\n" + "\n".join(sections)
    )
    publish(args, Section("profile_decode", "Profile: decode step", body, args.dtype_name))


if __name__ == "__main__":
    main()
