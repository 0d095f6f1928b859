"""`armature configure`'s predictions against public GPU figures (issue "Configurator",
Validation, GPU systems: "where public, reproducible figures exist for a model and GPU,
compare them and publish the error").

Each published point below is data, with its source: a model's shape, its dtype, a shipped
system and TP, the prompt and output lengths, how many requests run at once, and the figures
the source reports (end-to-end latency of a batch, or TTFT and ITL). For each, this script
predicts the same run as the configurator does, with nothing fitted to these points:

    hardware    `accelerator_hardware`: the operator model's profile of one worker of TP
                GPUs of the system (the shipped efficiency factors, untouched)
    run         one aggregated worker replayed by the configurator's simulator
                (`configurator.simulate.simulate`): `concurrency` requests of the point's
                lengths arriving together (a fixed batch), or one request (concurrency 1)
    figures     TTFT (median) and ITL (mean) as the configurator reports them; end-to-end
                latency as its --e2e-ms target counts it: TTFT + ITL x (output - 1)

and the error of each figure, (predicted - published) / published. A second table splits
the predicted decode step at the point's batch into the operator model's parts, beside the
published time per output token.

    python -m bench.configurator_gpu [--quick]

Writes the `configurator_gpu` section of docs/benchmarks.md (bench/out/ with --quick).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from armature.configurator.hardware import BLOCK_SIZE_TOKENS, Hardware, accelerator_hardware
from armature.configurator.model_spec import ModelSpec, read_model_spec
from armature.configurator.operators import StepBreakdown, get_step_breakdown
from armature.configurator.simulate import SimPlan, simulate
from armature.configurator.space import AGG, Deployment, SearchSpace
from armature.configurator.systems import Sourced, SystemSpec, load_system
from armature.sim.replay import ReplayConfig
from armature.workload.traces import TRACE_BLOCK_TOKENS, TraceRequest
from bench.configurator_fidelity import LLAMA_8B
from bench.paths import results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section

# the public config.json shapes (no weights needed); Llama-3-8B and Llama-3.1-8B share theirs,
# as do Llama-3-70B, 3.1-70B and 3.3-70B
LLAMA_70B = dict(LLAMA_8B, num_hidden_layers=80, hidden_size=8192, num_attention_heads=64)
LLAMA_70B["intermediate_size"] = 28672
SHAPES = {"llama-8b": LLAMA_8B, "llama-70b": LLAMA_70B}
MAX_NUM_SEQS = 256
MAX_NUM_BATCHED_TOKENS = 8192


@dataclass(frozen=True)
class Source:
    name: str
    date: str
    engine: str
    settings: str


VLLM_LATENCY_SETTINGS = (
    "vLLM's `benchmark_latency.py` as its performance pipeline runs it "
    "(vllm-project/vllm .buildkite/nightly-benchmarks/tests/latency-tests.json): "
    "meta-llama/Meta-Llama-3-8B at TP 1 and Meta-Llama-3-70B-Instruct at TP 4, "
    "`load_format dummy`, 5 warm-up and 15 timed iterations; each iteration generates for "
    "one fixed batch of 8 prompts of 32 tokens, 128 output tokens each (the page's "
    "'Input length: 32 tokens. Output length: 128 tokens. Batch size: fixed (8)'); the "
    "model's own dtype (bfloat16); the figure is the median latency of the whole batch"
)
VLLM_DATE = (
    "about 2024-10-28 (vllm-project/vllm PR #9768, '[perf bench] H200 development', links "
    "build 9515 of the same pipeline); the stored pages show no date or commit"
)
VLLM_ENGINE = "vLLM main at the build (the v0.6.3 era: V0 engine, CUDA graphs)"


VLLM_LATENCY = Source("vLLM performance pipeline", VLLM_DATE, VLLM_ENGINE, VLLM_LATENCY_SETTINGS)


def _vllm_build(number: int) -> str:
    return f"https://buildkite.com/vllm/performance-benchmark/builds/{number}"


NIM_GUIDE = "https://docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance.md"
NIM_70B = Source(
    "NIM benchmarking guide",
    "not shown on the stored page (NIM container 1.8.0 for llama-3.3-70b-instruct)",
    "NVIDIA NIM 1.8.0 (a TensorRT-LLM or vLLM profile; the page does not say which)",
    "NIM benchmarking guide, 'Performance', Llama-3.3-70b-instruct results, version 1.8.0, "
    "'2 x H100 80G', 'fp8 TP2'; AIPerf at a fixed concurrency; each table is one "
    "input/output length pair",
)


@dataclass(frozen=True)
class Published:
    """One public figure set: the run it describes and what its source reports."""

    name: str
    shape: str  # a key of SHAPES
    dtype: str
    system: str  # a shipped system
    tp: int
    isl_tokens: int
    osl_tokens: int
    concurrency: int  # requests running at once: a fixed batch, or 1 (one at a time)
    source: Source
    url: str  # where the source reports these figures
    e2e_ms: float | None = None
    ttft_ms: float | None = None
    itl_ms: float | None = None


POINTS = (
    Published("8B tp1 H100", "llama-8b", "bfloat16", "h100_sxm", 1, 32, 128, 8,
              VLLM_LATENCY, _vllm_build(9555), e2e_ms=997.365),
    Published("8B tp1 H200", "llama-8b", "bfloat16", "h200_sxm", 1, 32, 128, 8,
              VLLM_LATENCY, _vllm_build(9513), e2e_ms=834.014),
    Published("8B tp1 A100", "llama-8b", "bfloat16", "a100_sxm", 1, 32, 128, 8,
              VLLM_LATENCY, _vllm_build(9523), e2e_ms=1579.34),
    Published("70B tp4 H100", "llama-70b", "bfloat16", "h100_sxm", 4, 32, 128, 8,
              VLLM_LATENCY, _vllm_build(9555), e2e_ms=2444.3),
    Published("70B tp4 H200", "llama-70b", "bfloat16", "h200_sxm", 4, 32, 128, 8,
              VLLM_LATENCY, _vllm_build(9513), e2e_ms=2075.36),
    Published("70B tp4 A100", "llama-70b", "bfloat16", "a100_sxm", 4, 32, 128, 8,
              VLLM_LATENCY, _vllm_build(9523), e2e_ms=3990.39),
    Published("70B fp8 tp2 H100, 5000/500", "llama-70b", "fp8", "h100_sxm", 2, 5000, 500, 1,
              NIM_70B, NIM_GUIDE, ttft_ms=406.77, itl_ms=18.58),
    Published("70B fp8 tp2 H100, 500/2000", "llama-70b", "fp8", "h100_sxm", 2, 500, 2000, 1,
              NIM_70B, NIM_GUIDE, ttft_ms=47.77, itl_ms=18.91),
)  # fmt: skip


@dataclass(frozen=True)
class Predicted:
    ttft_ms: float
    itl_ms: float
    e2e_ms: float
    decode_step: StepBreakdown  # the operator model's decode step at the point's batch


@dataclass(frozen=True)
class Calibration:
    """The engine's own costs, fitted: a step's fixed cost and one all-reduce hop's latency."""

    step_overhead_s: float
    link_latency_s: float

    def apply(self, system: SystemSpec) -> SystemSpec:
        source = "fitted on bench.configurator_gpu's calibration half"
        return msgspec.structs.replace(
            system,
            step_overhead_s=Sourced(self.step_overhead_s, source),
            link_latency_s=Sourced(self.link_latency_s, source),
        )


def _model(shape: str, dtype: str) -> ModelSpec:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(SHAPES[shape]))
        return read_model_spec(Path(tmp), dtype)


def _hardware(point: Published, model: ModelSpec, system: SystemSpec) -> Hardware:
    space = SearchSpace(
        tensor_parallel=(point.tp,),
        max_num_seqs=(MAX_NUM_SEQS,),
        max_num_batched_tokens=(MAX_NUM_BATCHED_TOKENS,),
    )
    return accelerator_hardware(model, system, space, point.tp, point.name)


def _requests(point: Published) -> list[TraceRequest]:
    """The point's requests, all arriving at once, no prompt sharing a prefix."""
    num_blocks = -(-point.isl_tokens // TRACE_BLOCK_TOKENS)
    return [
        TraceRequest(
            0.0,
            point.isl_tokens,
            point.osl_tokens,
            tuple(range(i * num_blocks, (i + 1) * num_blocks)),
        )
        for i in range(point.concurrency)
    ]


def predict(point: Published, calibration: Calibration | None = None) -> Predicted:
    """The configurator's prediction of the point's run: one aggregated worker of its TP,
    replayed on the operator model's step times (the shipped system's, or with
    `calibration`'s engine costs in place of its own)."""
    model = _model(point.shape, point.dtype)
    system = load_system(point.system)
    if calibration is not None:
        system = calibration.apply(system)
    hardware = _hardware(point, model, system)
    deployment = Deployment(AGG, point.tp, MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS)
    config = ReplayConfig(
        num_workers=1,
        router="kv",
        block_size=BLOCK_SIZE_TOKENS,
        num_kv_blocks=hardware.get_kv_blocks(point.tp, MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS),
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        max_num_seqs=MAX_NUM_SEQS,
        kv_bytes_per_block=model.get_kv_bytes_per_token() * BLOCK_SIZE_TOKENS,
    )
    requests = _requests(point)
    plan = SimPlan(deployment, 1, float(point.concurrency), len(requests), config)
    predicted = simulate(plan, requests, hardware.timings[point.tp].timing)
    e2e_ms = predicted.ttft_ms + predicted.itl_ms * (point.osl_tokens - 1)
    context_tokens = point.isl_tokens + point.osl_tokens // 2
    step = get_step_breakdown(
        model,
        system,
        point.tp,
        num_prefill_tokens=0,
        num_decode_requests=point.concurrency,
        num_kv_tokens=point.concurrency * context_tokens,
    )
    return Predicted(predicted.ttft_ms, predicted.itl_ms, e2e_ms, step)


# the calibration half (both models, every GPU, one NIM point); the rest is held out
CALIBRATION_HALF = ("8B tp1 H100", "8B tp1 A100", "70B tp4 H200", "70B fp8 tp2 H100, 5000/500")
OVERHEAD_GRID_S = tuple(i * 0.25e-3 for i in range(2, 17))  # 0.5 .. 4 ms
HOP_LATENCY_GRID_S = tuple(i * 1e-6 for i in range(1, 9))  # 1 .. 8 us


def _figures(point: Published, p: Predicted) -> list[tuple[str, float, float]]:
    """(figure, published, predicted) for each figure the source reports."""
    figures = [
        ("end-to-end ms", point.e2e_ms, p.e2e_ms),
        ("TTFT ms", point.ttft_ms, p.ttft_ms),
        ("ITL ms", point.itl_ms, p.itl_ms),
    ]
    return [(name, pub, pred) for name, pub, pred in figures if pub is not None]


def _mean_abs_error(points: Sequence[Published], calibration: Calibration) -> float:
    errors = [
        abs(pred - pub) / pub
        for point in points
        for _, pub, pred in _figures(point, predict(point, calibration))
    ]
    return sum(errors) / len(errors)


def calibrate(points: Sequence[Published]) -> Calibration:
    """The grid's engine costs of least mean absolute error over `points`' figures."""
    grid = [Calibration(o, h) for o in OVERHEAD_GRID_S for h in HOP_LATENCY_GRID_S]
    return min(grid, key=lambda c: _mean_abs_error(points, c))


def _error(value: float, reference: float) -> str:
    return f"{(value - reference) / reference * 100.0:+.1f}"


def comparison_rows(point: Published, p: Predicted) -> list[list[object]]:
    """One row per figure the source reports: published, predicted, error %."""
    run = (
        f"{point.system} x{point.tp}, {point.dtype}, {point.isl_tokens}/{point.osl_tokens}, "
        f"{'batch' if point.concurrency > 1 else 'concurrency'} {point.concurrency}"
    )
    return [
        [point.name, run, name, published, round(predicted, 2), _error(predicted, published),
         f"[{point.source.name}]({point.url})"]
        for name, published, predicted in _figures(point, p)
    ]  # fmt: skip


def step_row(point: Published, p: Predicted) -> list[object]:
    """The predicted decode step's parts beside the published time per output token (ITL,
    or a batch's end-to-end latency over its output tokens)."""
    per_token_ms = point.itl_ms if point.itl_ms is not None else (point.e2e_ms or 0.0)
    if point.itl_ms is None:
        per_token_ms /= point.osl_tokens
    s = p.decode_step
    return [
        point.name,
        round(per_token_ms, 2),
        round(s.total_s * 1000.0, 2),
        round(s.gemm_s * 1000.0, 2),
        round(s.attention_s * 1000.0, 3),
        round(s.all_reduce_s * 1000.0, 2),
        round(s.overhead_s * 1000.0, 2),
    ]


def _sources_list(points: tuple[Published, ...]) -> str:
    """Each source once, with the addresses its points cite."""
    urls: dict[Source, list[str]] = {}
    for point in points:
        cited = urls.setdefault(point.source, [])
        if point.url not in cited:
            cited.append(point.url)
    return "\n".join(
        f"- **{s.name}** ({', '.join(cited)}). Date: {s.date}. Engine: {s.engine}. "
        f"Settings: {s.settings}."
        for s, cited in urls.items()
    )


STEP_HEADERS = [
    "point",
    "published ms/token",
    "step",
    "GEMMs + LM head",
    "attention",
    "all-reduce",
    "fixed overhead",
]


def held_out_text(
    points: tuple[Published, ...], shipped: list[Predicted], calibration: Calibration
) -> str:
    """The held-out half's errors with the shipped profiles and with `calibration`'s costs."""
    rows = []
    for point, p in zip(points, shipped, strict=True):
        if point.name in CALIBRATION_HALF:
            continue
        fitted = _figures(point, predict(point, calibration))
        for (name, published, predicted), (_, _, refit) in zip(
            _figures(point, p), fitted, strict=True
        ):
            rows.append(
                [
                    point.name,
                    name,
                    published,
                    _error(predicted, published),
                    _error(refit, published),
                ]
            )
    return (
        "\n\nA calibration, held out: the engine's two costs that no datasheet gives (a "
        "step's fixed overhead, one all-reduce hop's latency) fitted on a grid (0.5-4 ms, 1-8 "
        "us) to the least mean absolute error over the calibration half "
        f"({', '.join(CALIBRATION_HALF)}) "
        f"give {calibration.step_overhead_s * 1e3:.2f} ms and "
        f"{calibration.link_latency_s * 1e6:.0f} us (shipped: 0.5 ms, 8 us); the other "
        "half, which the fit did not see, with the shipped profiles and with the fitted costs "
        "(the shipped profiles are unchanged):\n\n"
        + markdown_table(
            ["held-out point", "figure", "published", "shipped error %", "fitted error %"], rows
        )
    )


def render(points: tuple[Published, ...], predicted: list[Predicted], held_out: str) -> str:
    comparison = [
        row for pt, p in zip(points, predicted, strict=True) for row in comparison_rows(pt, p)
    ]
    steps = [step_row(pt, p) for pt, p in zip(points, predicted, strict=True)]
    return (
        "Published figures for Llama-3 8B and 70B shapes on the shipped h100_sxm, h200_sxm and "
        "a100_sxm profiles against the configurator's prediction of the same run (one "
        "aggregated worker of the point's TP, max-num-seqs 256, max-num-batched-tokens 8192, "
        "the shipped efficiency factors; nothing fitted to these points). Error: (predicted - "
        "published) / published in %. Runs in seconds on a CPU (a shared, loaded 2-core "
        "machine here); no GPU was used.\n\n"
        + markdown_table(
            ["point", "run", "figure", "published", "predicted", "error %", "source"],
            comparison,
        )
        + "\n\nThe predicted decode step at the point's batch (context: prompt + half the "
        "output), by part, in ms, beside the published time per output token (ITL, or a "
        "batch's end-to-end latency over its output tokens, prefill included):\n\n"
        + markdown_table(STEP_HEADERS, steps)
        + held_out
        + "\n\nSources:\n\n"
        + _sources_list(points)
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the first two points, no calibration")
    args = parser.parse_args()
    points = POINTS[:2] if args.quick else POINTS
    predicted = []
    for point in points:
        predicted.append(predict(point))
        print(point.name, predicted[-1], flush=True)
    out = results_path(args.quick)
    held_out = ""
    if not args.quick:
        calibration = calibrate([p for p in points if p.name in CALIBRATION_HALF])
        held_out = held_out_text(points, predicted, calibration)
    body = render(points, predicted, held_out)
    section = Section(
        "configurator_gpu", "Configurator: predictions vs public GPU figures", body, "n/a"
    )
    write_section(out, section, get_machine_facts())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
