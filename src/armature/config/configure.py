"""What `armature configure` takes: the model, the hardware, the workload, the targets, the
search space and where to write the chosen deployment. Its variables are
`ARMATURE_CONFIGURE_*` (a name such as ARMATURE_MODEL belongs to the workers)."""

from __future__ import annotations

from dataclasses import dataclass

from armature.config.settings import setting
from armature.config.values import (
    fraction,
    int64,
    non_negative_float,
    positive_float,
    positive_int,
    positive_ints,
)
from armature.errors import ConfigError

__all__ = ["CONFIGURE_DTYPES", "CONFIGURE_MODES", "DEFAULT_ITL_MS", "ConfigureConfig"]

CONFIGURE_DTYPES = ("bfloat16", "float16", "fp8", "float32")
CONFIGURE_MODES = ("agg", "disagg")
DEFAULT_ITL_MS = 50.0  # the latency target without --itl-ms or --e2e-ms


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(part.strip() for part in text.split(",") if part.strip())
    if not modes or any(m not in CONFIGURE_MODES for m in modes):
        raise ConfigError(f"expected a comma list of {', '.join(CONFIGURE_MODES)}, got {text!r}")
    return modes


def _env(name: str) -> str:
    return f"ARMATURE_CONFIGURE_{name}"


@dataclass(frozen=True, kw_only=True)
class ConfigureConfig:
    """`armature configure`: recommend a deployment without running it."""

    model: str | None = setting(
        None, "local HF model directory, or only its config.json (required)", env=_env("MODEL")
    )
    dtype: str = setting(
        "bfloat16", "weights and KV cache dtype", choices=CONFIGURE_DTYPES, env=_env("DTYPE")
    )
    system: str = setting(
        "h100_sxm",
        "hardware profile: h100_sxm, h200_sxm, b200_sxm, a100_sxm, l40s, a JSON file of the "
        "same form, or local (this machine, from --timing-profile)",
        env=_env("SYSTEM"),
    )
    timing_profile: str | None = setting(
        None,
        "--system local: this machine's timing profile (`armature profile --output`); its "
        "step times replace the operator model",
        env=_env("TIMING_PROFILE"),
    )
    host_cores: float | None = setting(
        None,
        "--system local: the cores the workers' engines and the serving stack share (default: "
        "this machine's)",
        parse=positive_float,
        env=_env("HOST_CORES"),
    )
    stack_idle_cores: float = setting(
        0.0,
        "--system local: cores the serving stack besides the engines takes whatever the load "
        "(timers, load reports, metrics)",
        parse=non_negative_float,
        env=_env("STACK_IDLE_CORES"),
    )
    stack_cpu_ms_per_request: float = setting(
        0.0,
        "--system local: CPU ms the serving stack besides the engines (frontend, workers' "
        "shells, a load generator on this host) spends per request, beyond its idle cores; "
        "it runs on the cores no engine holds, and what does not fit comes off the engines",
        parse=non_negative_float,
        env=_env("STACK_CPU_MS_PER_REQUEST"),
    )
    shell_cpu_ms_per_request: float = setting(
        0.0,
        "--system local: of --stack-cpu-ms-per-request, the CPU ms spent in the workers' own "
        "processes (their shells: request plane, streaming, KV events), which takes turns "
        "with their engines",
        parse=non_negative_float,
        env=_env("SHELL_CPU_MS_PER_REQUEST"),
    )
    frontend_cpu_ms_per_request: float = setting(
        0.0,
        "--system local: of --stack-cpu-ms-per-request, the CPU ms spent in the frontend's "
        "process, which takes turns with a lone worker's engine (it runs in that process)",
        parse=non_negative_float,
        env=_env("FRONTEND_CPU_MS_PER_REQUEST"),
    )
    total_gpus: int | None = setting(
        None,
        "GPUs to deploy on (--system local: workers); default one node (local: 2)",
        parse=positive_int,
        env=_env("TOTAL_GPUS"),
    )
    isl: int = setting(1024, "mean prompt length, tokens", parse=positive_int, env=_env("ISL"))
    osl: int = setting(256, "mean output length, tokens", parse=positive_int, env=_env("OSL"))
    spread: float = setting(
        0.0,
        "prompt and output lengths are drawn uniformly within +- this fraction of their means",
        parse=fraction,
        env=_env("SPREAD"),
    )
    trace: str | None = setting(
        None,
        "a Mooncake JSONL trace as the workload (its lengths and arrival pattern) instead of "
        "--isl/--osl",
        env=_env("TRACE"),
    )
    ttft_ms: float = setting(
        500.0, "target median time to first token, ms", parse=positive_float, env=_env("TTFT_MS")
    )
    itl_ms: float | None = setting(
        None,
        f"target mean inter-token latency, ms ({DEFAULT_ITL_MS:g} unless --e2e-ms is given)",
        parse=positive_float,
        env=_env("ITL_MS"),
    )
    e2e_ms: float | None = setting(
        None,
        "target end-to-end latency (median TTFT + mean ITL x output), ms; replaces --itl-ms",
        parse=positive_float,
        env=_env("E2E_MS"),
    )
    request_rate: float | None = setting(
        None,
        "requests/s to serve: rank by fewest GPUs at this rate (default: most tokens/s per GPU)",
        parse=positive_float,
        env=_env("REQUEST_RATE"),
    )
    tensor_parallel: tuple[int, ...] = setting(
        (1, 2, 4, 8),
        "tensor parallelism per worker to search, comma list (within a node)",
        flag="tp",
        parse=positive_ints,
        env=_env("TP"),
    )
    max_num_seqs: tuple[int, ...] = setting(
        (16, 32, 64, 128, 256, 512),
        "max-num-seqs values to search, comma list",
        parse=positive_ints,
        env=_env("MAX_NUM_SEQS"),
    )
    max_num_batched_tokens: tuple[int, ...] = setting(
        (2048, 4096, 8192, 16384),
        "max-num-batched-tokens values to search, comma list (2^k or 3 x 2^k, 24..32768)",
        parse=positive_ints,
        env=_env("MAX_NUM_BATCHED_TOKENS"),
    )
    modes: tuple[str, ...] = setting(
        CONFIGURE_MODES, "agg, disagg or both, comma list", parse=_modes, env=_env("MODES")
    )
    finalists: int = setting(
        6,
        "configurations simulated after the fast estimate (and the best of a mode none of them is)",
        parse=positive_int,
        env=_env("FINALISTS"),
    )
    sim_budget_s: float = setting(
        30.0,
        "wall time for simulating finalists, s (the rest keep their estimates; the best "
        "aggregated and disaggregated are simulated whatever it is)",
        parse=positive_float,
        env=_env("SIM_BUDGET_S"),
    )
    step_margin: float = setting(
        0.1,
        "headroom: a simulated configuration meets the targets only if it also does with "
        "every step this fraction slower than modeled (else it is offered 85%, then 70%, of "
        "its rate; with --request-rate, that share of the rate per group, more groups); 0 "
        "for none",
        parse=fraction,
        env=_env("STEP_MARGIN"),
    )
    max_ttft_growth: float = setting(
        0.5,
        "away from the knee: with every step --step-margin slower, a simulated configuration's "
        "TTFT p50 may grow at most this fraction (else it is offered less, as for the "
        "margin); 0 for no limit; not with --step-margin 0",
        parse=non_negative_float,
        env=_env("MAX_TTFT_GROWTH"),
    )
    top: int = setting(10, "rows of the ranked table", parse=positive_int, env=_env("TOP"))
    served_model_name: str | None = setting(
        None,
        "the model's name in the saved command lines (default: the model directory's name)",
        env=_env("SERVED_MODEL_NAME"),
    )
    save_dir: str | None = setting(
        None,
        "write the chosen deployment here: command lines, Helm values, the planner's profile "
        "and targets, the workload and its replay, the Pareto plot",
        env=_env("SAVE_DIR"),
    )
    plot: str | None = setting(
        None,
        "write the Pareto plot (PNG) here (default: pareto.png in --save-dir)",
        env=_env("PLOT"),
    )
    seed: int = setting(0, "seed of the simulated workload", parse=int64, env=_env("SEED"))
