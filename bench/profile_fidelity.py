"""Profile fidelity: does the mocker, run from a profile of the native engine on this machine,
predict that engine's TTFT and ITL?

    1. `armature profile` of the native engine (the profiler's own code: profile_engine)
    2. a mixed-length workload, closed loop at concurrency 1, 4 and 16, through the real
       engine (registry kind `torch`) and through the mocker run from that profile
       (kind `mocker`, `--timing-profile`), both started as workers start them and driven
       through the same `Engine.generate` client (`armature.profiler.sweep.time_request`)
    3. per concurrency: mean and median TTFT and ITL of each, and the mocker's error
    4. a second profile after the runs: how far the machine's speed moved meanwhile

Target (issue "Planner: profile workers, then scale prefill and decode to meet TTFT and ITL
targets"): mean TTFT and mean ITL within 10% at every concurrency.

    python -m bench.profile_fidelity            # full run, writes docs/benchmarks.md
    python -m bench.profile_fidelity --quick    # smoke run, writes bench/out/benchmarks.md
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from armature.config import (
    EngineConfig,
    KvCacheConfig,
    ProfileConfig,
    ProfileSweepConfig,
    TransferConfig,
)
from armature.engines.registry import get_kind
from armature.engines.spec import EngineSpec, resolve_engine_model
from armature.profiler.points import RequestTimes
from armature.profiler.run import profile_engine
from armature.profiler.sweep import time_request
from armature.protocols.engine import EngineRequest, SamplingParams
from armature.protocols.timing_profile import TimingProfile, write_profile
from armature.workload.measure import quantile
from bench.harness import BenchArgs, parse_args, publish, random_prompts
from bench.profile_drift import drift_table
from bench.report import Section, markdown_table

TARGET = 0.10  # |mocker - real| / real, of mean TTFT and mean ITL


@dataclass(frozen=True)
class Plan:
    sweep: ProfileSweepConfig
    concurrencies: tuple[int, ...]
    requests_per_slot: int  # requests = concurrency x this, at least min_requests
    min_requests: int  # so that a low concurrency is timed over more than a few seconds
    min_input_tokens: int
    max_input_tokens: int
    output_tokens: int
    max_num_batched_tokens: int


FULL = Plan(
    sweep=ProfileSweepConfig(
        prefill_input_tokens=(16, 64, 128, 256, 512),
        prefill_repeats=3,
        prefill_batch_requests=4,
        decode_requests=(1, 2, 4, 8, 16),
        decode_context_tokens=(64, 256, 576),
        decode_output_tokens=16,
    ),
    concurrencies=(1, 4, 16),
    requests_per_slot=3,
    min_requests=12,
    min_input_tokens=32,
    max_input_tokens=512,
    output_tokens=32,
    max_num_batched_tokens=512,
)
QUICK = Plan(
    sweep=ProfileSweepConfig(
        prefill_input_tokens=(16, 64, 256),
        prefill_repeats=2,
        prefill_batch_requests=0,
        decode_requests=(1, 4, 16),
        decode_context_tokens=(64, 256),
        decode_output_tokens=6,
    ),
    concurrencies=(1, 4, 16),
    requests_per_slot=1,
    min_requests=1,
    min_input_tokens=16,
    max_input_tokens=256,
    output_tokens=8,
    max_num_batched_tokens=256,
)


@dataclass(frozen=True)
class Latencies:
    ttfts_ms: list[float]
    itls_ms: list[float]

    @property
    def mean_ttft_ms(self) -> float:
        return statistics.fmean(self.ttfts_ms)

    @property
    def mean_itl_ms(self) -> float:
        return statistics.fmean(self.itls_ms)


def _engine_config(args: BenchArgs, plan: Plan, **overrides: object) -> EngineConfig:
    fields: dict[str, object] = {
        "model": str(args.model_dir),
        "dtype": args.dtype_name,
        "device": "cpu",
        "max_num_seqs": max(plan.concurrencies),
        "max_num_batched_tokens": plan.max_num_batched_tokens,
        "seed": args.seed,
    }
    fields.update(overrides)
    return EngineConfig(**fields)  # type: ignore[arg-type]


async def _closed_loop(
    engine_config: EngineConfig, args: BenchArgs, plan: Plan, c: int
) -> Latencies:
    """Start the engine as a worker does, keep `c` requests in flight until the workload is
    done, stop it."""
    spec = EngineSpec(
        engine=engine_config,
        kv=KvCacheConfig(),
        transfer=TransferConfig(),
        model=resolve_engine_model(engine_config),  # as the profiler names it
        worker_id=f"fidelity-{engine_config.engine}",
    )
    built = get_kind(engine_config.engine).build(spec)
    engine = built.engine
    engine.start()
    prompts = random_prompts(
        max(c * plan.requests_per_slot, plan.min_requests),
        built.info.vocab_size,
        plan.min_input_tokens,
        plan.max_input_tokens,
        seed=args.seed + c,
    )
    sampling = SamplingParams(max_tokens=plan.output_tokens, temperature=0.0, ignore_eos=True)
    slots = asyncio.Semaphore(c)

    async def one(i: int, prompt: list[int]) -> RequestTimes:
        async with slots:
            request = EngineRequest(request_id=f"f-{i}", prompt_token_ids=prompt, sampling=sampling)
            return await time_request(engine, request)

    try:
        # warm-up, untimed, on a prompt of its own (a timed prompt would hit the cache)
        warm = EngineRequest(
            request_id="warm-up",
            prompt_token_ids=list(range(1, 33)),
            sampling=SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True),
        )
        await time_request(engine, warm)
        times = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    finally:
        await engine.stop()
    return Latencies(
        ttfts_ms=[t.ttft_s * 1e3 for t in times],
        itls_ms=[x * 1e3 for t in times for x in t.get_itls_s() if x is not None],
    )


def _error(real: float, mocked: float) -> float:
    return (mocked - real) / real


async def _run(
    args: BenchArgs, plan: Plan, profile_path: Path
) -> tuple[TimingProfile, TimingProfile, list[list[object]], list[str]]:
    """The profile, the real and mocked runs' rows and verdicts, and a second profile made
    after them (how far the machine's speed moved meanwhile)."""
    config = ProfileConfig(engine=_engine_config(args, plan), kv=KvCacheConfig(), sweep=plan.sweep)
    profile = await profile_engine(config)
    write_profile(profile, profile_path)
    print(json.dumps([(p.input_tokens, round(p.ttft_ms, 1)) for p in profile.prefill]))
    print(
        json.dumps([(d.num_requests, d.context_tokens, round(d.itl_ms, 1)) for d in profile.decode])
    )
    rows: list[list[object]] = []
    verdicts: list[str] = []
    mocker = _engine_config(args, plan, engine="mocker", timing_profile=str(profile_path))
    for c in plan.concurrencies:
        real = await _closed_loop(_engine_config(args, plan), args, plan, c)
        mocked = await _closed_loop(mocker, args, plan, c)
        ttft_error = _error(real.mean_ttft_ms, mocked.mean_ttft_ms)
        itl_error = _error(real.mean_itl_ms, mocked.mean_itl_ms)
        rows.append(
            [
                c,
                len(real.ttfts_ms),
                real.mean_ttft_ms,
                mocked.mean_ttft_ms,
                f"{ttft_error:+.1%}",
                quantile(real.ttfts_ms, 0.5),
                quantile(mocked.ttfts_ms, 0.5),
                real.mean_itl_ms,
                mocked.mean_itl_ms,
                f"{itl_error:+.1%}",
                quantile(real.itls_ms, 0.5),
                quantile(mocked.itls_ms, 0.5),
            ]
        )
        print(rows[-1], flush=True)
        for name, error in (("TTFT", ttft_error), ("ITL", itl_error)):
            verdict = "PASS" if abs(error) <= TARGET else "FAIL"
            verdicts.append(
                f"- {verdict}: c={c} mean {name} off by {error:+.1%} (target within {TARGET:.0%})"
            )
    after = await profile_engine(config)
    return profile, after, rows, verdicts


def main() -> None:
    args, _ = parse_args(__doc__.splitlines()[0] if __doc__ else "")
    plan = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory() as scratch:
        profile, after, rows, verdicts = asyncio.run(
            _run(args, plan, Path(scratch) / "profile.json")
        )
    sweep = plan.sweep
    body = (
        f"Profile: `armature profile --engine torch` of the default model with "
        f"--max-num-batched-tokens {plan.max_num_batched_tokens}, --max-num-seqs "
        f"{max(plan.concurrencies)}, prefill input tokens {list(sweep.prefill_input_tokens)} "
        f"(x{sweep.prefill_repeats}), decode requests {list(sweep.decode_requests)} x context "
        f"tokens {list(sweep.decode_context_tokens)}, {sweep.decode_output_tokens} ITLs each. "
        f"Workload: random prompts of {plan.min_input_tokens}..{plan.max_input_tokens} tokens "
        f"(uniform, seeded), {plan.output_tokens} output tokens each (EOS ignored), "
        f"{plan.requests_per_slot} requests per concurrency slot (at least {plan.min_requests}), "
        f"closed loop, through "
        f"`Engine.generate` of the real engine and of the mocker run from the profile "
        f"(`--engine mocker --timing-profile`, wall clock). Times in ms; error = (mocker - "
        f"real) / real.\n\n"
        + markdown_table(
            [
                "concurrency",
                "requests",
                "real TTFT mean",
                "mocker TTFT mean",
                "TTFT error",
                "real TTFT p50",
                "mocker TTFT p50",
                "real ITL mean",
                "mocker ITL mean",
                "ITL error",
                "real ITL p50",
                "mocker ITL p50",
            ],
            rows,
        )
        + "\n\n"
        + "\n".join(verdicts)
        + "\n\nThe machine's speed: the profile the mocker ran from against one made after the "
        "real runs, the same points (a move here is the machine's, not the model's).\n\n"
        + drift_table([("before the runs", profile), ("after the runs", after)])
        + "\n"
    )
    title = "Profile fidelity: the mocker from a profile vs the native engine"
    publish(args, Section("profile_fidelity", title, body, args.dtype_name))
    print(f"profile machine: {profile.source.machine}")


if __name__ == "__main__":
    main()
