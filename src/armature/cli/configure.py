"""`armature configure`: recommend a deployment for a model, hardware and latency targets,
without running it (`armature.configurator`)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from armature.cli.options import CliError, HelpFormatter, add_settings, read_settings
from armature.config import flag_name, iter_settings
from armature.config.configure import DEFAULT_ITL_MS, ConfigureConfig

if TYPE_CHECKING:
    from armature.configurator.hardware import Hardware
    from armature.configurator.model_spec import ModelSpec
    from armature.configurator.search import SearchResult, SearchSettings
    from armature.configurator.space import SearchSpace, Workload
    from armature.protocols.timing_profile import TimingProfile

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "configure",
        help="recommend a deployment (agg/disagg, P:D, TP, batch limits) for latency targets",
        description="Search aggregated and disaggregated layouts, tensor parallelism and batch "
        "limits for a model on a hardware profile: a fast estimate of every deployment that fits "
        "in memory, then the finalists through the replay simulator (the mocker's scheduler and "
        "KV cache on the predicted step times). Prints a ranked table, the best aggregated and "
        "disaggregated side by side, and writes a Pareto plot and the chosen deployment.",
        formatter_class=HelpFormatter,
    )
    add_settings(parser, ConfigureConfig())


def _workload(config: ConfigureConfig) -> Workload:
    from armature.cli.paths import read_trace
    from armature.configurator.space import Workload

    if config.trace is None:
        if config.osl < 2:
            raise CliError(
                f"--osl must be at least 2 (ITL is the time between output tokens), got "
                f"{config.osl}"
            )
        return Workload(float(config.isl), float(config.osl), config.spread)
    path = Path(config.trace)
    defaults = ConfigureConfig()
    ignored = [
        f"--{flag_name(field.name, setting)}"
        for _, field, setting in iter_settings(ConfigureConfig)
        if field.name in ("isl", "osl", "spread")
        and getattr(config, field.name) != getattr(defaults, field.name)
    ]
    if ignored:
        print(
            f"armature: note: {', '.join(ignored)} not used: the trace gives the lengths",
            file=sys.stderr,
        )
    requests = read_trace(path)
    if len(requests) < 2:
        raise CliError(f"trace {path} has fewer than 2 requests")
    if requests[-1].arrival_ms <= requests[0].arrival_ms:
        raise CliError(
            f"trace {path}: every request has the same timestamp (its arrivals must span some "
            "time to give a request rate)"
        )
    if max(r.output_length for r in requests) < 2:
        raise CliError(
            f"trace {path}: every request has one output token (ITL is the time between "
            "output tokens)"
        )
    return Workload.of_trace(tuple(requests))


def _check_outputs(config: ConfigureConfig) -> None:
    """--save-dir and --plot can be written (before the search, which takes a while)."""
    from armature.cli.paths import check_apart, check_image, make_dir

    inputs = {"--trace": config.trace, "--timing-profile": config.timing_profile}
    check_apart({"--plot": config.plot}, inputs, ("--save-dir", config.save_dir))
    if config.plot is not None:
        check_image(Path(config.plot), "--plot")
    if config.save_dir is not None:
        make_dir(Path(config.save_dir), "--save-dir")


def _space(config: ConfigureConfig) -> SearchSpace:
    from armature.configurator.space import SearchSpace
    from armature.configurator.timing import PREFILL_GRID_TOKENS

    # a step budget holds at least two of the grid's prompt lengths: prefill times between
    # them are interpolated (the grid's first alone gives no slope)
    allowed = PREFILL_GRID_TOKENS[1:]
    odd = [t for t in config.max_num_batched_tokens if t not in allowed]
    if odd:
        raise CliError(
            f"--max-num-batched-tokens {odd[0]}: must be a power of 2, or 3 x one, from "
            f"{allowed[0]} to {allowed[-1]}"
        )
    return SearchSpace(
        tensor_parallel=tuple(sorted(set(config.tensor_parallel))),
        max_num_seqs=tuple(sorted(set(config.max_num_seqs))),
        max_num_batched_tokens=tuple(sorted(set(config.max_num_batched_tokens))),
        modes=config.modes,
    )


def _hardware(
    config: ConfigureConfig, model: ModelSpec, space: SearchSpace, served_name: str
) -> tuple[Hardware, int]:
    """The hardware and the GPUs (local: workers) to deploy on."""
    from armature.configurator.hardware import accelerator_hardware, local_hardware
    from armature.configurator.host import HostShare
    from armature.configurator.systems import LOCAL_SYSTEM, load_system
    from armature.protocols.timing_profile import read_profile

    if config.system == LOCAL_SYSTEM:
        if config.timing_profile is None:
            raise CliError(
                "--system local needs --timing-profile (write one with armature profile)"
            )
        profile = read_profile(Path(config.timing_profile))
        _check_local_space(config, profile)
        if profile.source.model != served_name:  # a directory's name may differ, so a note
            print(
                f"armature: note: the timing profile was measured on model "
                f"{profile.source.model!r}, not {served_name!r}: its step times are that "
                "model's",
                file=sys.stderr,
            )
        cores = config.host_cores or float(os.cpu_count() or 1)
        if config.stack_idle_cores >= cores:
            raise CliError(
                f"--stack-idle-cores {config.stack_idle_cores:g}: the serving stack alone would "
                f"take every one of the host's {cores:g} cores (--host-cores), none left for "
                "the engines"
            )
        try:  # the flags' parsers refuse every other bad value: this is the parts' sum
            host = HostShare(
                cores,
                config.stack_cpu_ms_per_request / 1000.0,
                config.stack_idle_cores,
                config.shell_cpu_ms_per_request / 1000.0,
                config.frontend_cpu_ms_per_request / 1000.0,
            )
        except ValueError as exc:
            parts_ms = config.shell_cpu_ms_per_request + config.frontend_cpu_ms_per_request
            raise CliError(
                f"--shell-cpu-ms-per-request and --frontend-cpu-ms-per-request ({parts_ms:g} "
                f"ms together) are parts of --stack-cpu-ms-per-request "
                f"({config.stack_cpu_ms_per_request:g}) and cannot exceed it"
            ) from exc
        workers = config.total_gpus or 2
        at_once = profile.source.engines_at_once
        if at_once != workers:
            print(
                f"armature: note: the timing profile was measured with {at_once} engine(s) at "
                f"once; {workers} workers on this host run {workers} (armature profile "
                f"--engines-at-once {workers} measures the step times they see)",
                file=sys.stderr,
            )
        if profile.load is None:
            print(
                "armature: note: the timing profile has no load pass: its step times are "
                "uniform batches', which a loaded server's mixed batches exceed (armature "
                "profile --load-requests 48 measures by how much)",
                file=sys.stderr,
            )
        return local_hardware(model, profile, space, host), workers
    for name, given in (
        ("--timing-profile", config.timing_profile is not None),
        ("--host-cores", config.host_cores is not None),
        ("--stack-cpu-ms-per-request", config.stack_cpu_ms_per_request > 0),
        ("--stack-idle-cores", config.stack_idle_cores > 0),
        ("--shell-cpu-ms-per-request", config.shell_cpu_ms_per_request > 0),
        ("--frontend-cpu-ms-per-request", config.frontend_cpu_ms_per_request > 0),
    ):
        if given:
            raise CliError(f"{name} is for --system local")
    system = load_system(config.system)
    total = config.total_gpus or system.get_num_gpus_per_node()
    return accelerator_hardware(model, system, space, total, served_name), total


def _check_local_space(config: ConfigureConfig, profile: TimingProfile) -> None:
    """CliError for a search flag --system local cannot honour: it runs the engine as the
    timing profile measured it (tensor parallelism 1, the profile's step budget); a note for
    --max-num-seqs values above the profile's, which it leaves out."""
    defaults = ConfigureConfig()
    if config.tensor_parallel != defaults.tensor_parallel and config.tensor_parallel != (1,):
        raise CliError("--tp: --system local runs one engine per worker (tp 1); drop --tp")
    budget = profile.max_num_batched_tokens
    given = config.max_num_batched_tokens
    if given != defaults.max_num_batched_tokens and given != (budget,):
        raise CliError(
            f"--max-num-batched-tokens: --system local searches the timing profile's step "
            f"budget, {budget} tokens (profile again with another to search it)"
        )
    above = [n for n in config.max_num_seqs if n > profile.max_num_seqs]
    if above and config.max_num_seqs != defaults.max_num_seqs:
        print(
            f"armature: note: --max-num-seqs {','.join(map(str, above))} left out: the timing "
            f"profile measured at most {profile.max_num_seqs} requests at once",
            file=sys.stderr,
        )


def run(args: argparse.Namespace) -> int:
    from armature.configurator.model_spec import read_model_spec
    from armature.configurator.search import SearchSettings, search
    from armature.configurator.space import Targets

    config = read_settings(args, ConfigureConfig)
    if config.model is None:
        raise CliError("give --model (a local HF model directory or its config.json)")
    if config.step_margin == 0 and config.max_ttft_growth != ConfigureConfig().max_ttft_growth:
        raise CliError("--max-ttft-growth limits growth under --step-margin; it is 0 (none)")
    model_path = Path(config.model)
    model = read_model_spec(model_path, config.dtype)
    served_name = config.served_model_name or model.name
    space = _space(config)
    hardware, total_gpus = _hardware(config, model, space, served_name)
    workload = _workload(config)
    _check_outputs(config)
    if workload.get_max_request_tokens() > model.max_context_tokens:
        raise CliError(
            f"requests of up to {workload.get_max_request_tokens()} tokens exceed the model's "
            f"context ({model.max_context_tokens})"
        )
    if config.e2e_ms is not None and config.itl_ms is not None:
        raise CliError("--e2e-ms replaces --itl-ms as the latency target: give one of them")
    itl_ms = DEFAULT_ITL_MS if config.e2e_ms is None and config.itl_ms is None else config.itl_ms
    settings = SearchSettings(
        workload=workload,
        targets=Targets(config.ttft_ms, itl_ms, config.e2e_ms),
        total_gpus=total_gpus,
        request_rate_per_s=config.request_rate,
        num_finalists=config.finalists,
        sim_budget_s=config.sim_budget_s,
        seed=config.seed,
        step_margin=config.step_margin,
        max_ttft_growth=config.max_ttft_growth or None,  # 0: no limit
    )
    started_s = time.monotonic()
    result = search(hardware, settings, on_progress=lambda line: print(line, flush=True))
    elapsed_s = time.monotonic() - started_s
    return _answer(config, model, hardware, settings, result, served_name, elapsed_s)


def _answer(
    config: ConfigureConfig,
    model: ModelSpec,
    hardware: Hardware,
    settings: SearchSettings,
    result: SearchResult,
    served_name: str,
    elapsed_s: float,
) -> int:
    from armature.cli.paths import writing
    from armature.configurator.plot import plot_pareto
    from armature.configurator.report import format_side_by_side, format_table
    from armature.configurator.space import AGG

    params_b = model.get_num_params() / 1e9
    print(
        f"\n{model.name}: {params_b:.2f}B parameters, {model.get_weight_bytes() / 1e9:.1f} GB in "
        f"{model.dtype}, {model.get_kv_bytes_per_token()} KV bytes/token; {hardware.name}, "
        f"{settings.total_gpus} {'workers' if hardware.system is None else 'GPUs'}"
    )
    print(
        f"{result.num_deployments} deployments, {result.num_fitting} fit in memory, "
        f"{sum(r.simulated for r in result.ranked)} simulated, {elapsed_s:.1f} s\n"
    )
    if not result.num_deployments:
        unit = "workers" if hardware.system is None else "GPUs"
        disagg_only = settings.total_gpus < 2 and AGG not in hardware.space.modes
        raise CliError(
            "the search space is empty: "
            + (
                f"disaggregated serving needs at least 2 {unit}, {settings.total_gpus} given"
                if disagg_only
                else "no layout of the given --modes and --tp fits the "
                f"{settings.total_gpus} {unit}"
            )
        )
    if not result.num_fitting:
        raise CliError(
            f"no deployment fits in memory: {min(hardware.space.max_num_seqs)} requests of up "
            f"to {settings.workload.get_max_request_tokens()} tokens need more KV cache than a "
            f"worker of {hardware.name} has left at any TP (lower --max-num-seqs, or shorten "
            "the requests)"
        )
    if not result.ranked:
        raise CliError(
            "no configuration has an operating point (the model fits, but no batch "
            "keeps up with its own prefills; try larger --max-num-batched-tokens)"
        )
    print(format_table(result, config.top))
    print()
    print(format_side_by_side(result))
    plot = _plot_path(config)
    # the closest configurations are plotted into the save directory when none meets the
    # targets, except over a deployment saved there before: its plot goes with it
    keep = config.plot is None and not result.meets_targets and _holds_a_save(config.save_dir)
    if plot is not None and not keep:
        title = f"{model.name} on {hardware.name}: tokens/s per GPU vs per user"
        with writing("--plot" if config.plot else "--save-dir", plot):  # its own, or the dir's
            print(f"\nplot: {plot_pareto(result, plot, title, config.top)}")
    if not result.meets_targets:
        e2e = settings.targets.e2e_ms is not None
        relax = "--ttft-ms/--e2e-ms" if e2e else "--ttft-ms/--itl-ms"
        saved_to = config.save_dir
        unsaved = "" if saved_to is None else f"; no deployment saved to {saved_to}"
        if keep:
            unsaved += " (the one saved there before, and its plot, are as they were)"
        raise CliError(
            f"no configuration meets the targets (the closest are shown above: relax "
            f"{relax}, --step-margin or --max-ttft-growth, or give more GPUs){unsaved}"
        )
    if config.save_dir is not None:
        with writing("--save-dir", config.save_dir):
            _save(config, hardware, settings, result, served_name)
    return 0


def _holds_a_save(save_dir: str | None) -> bool:
    """Whether `save_dir` holds files of a deployment saved there before."""
    from armature.configurator.save import SAVED_NAMES

    return save_dir is not None and any((Path(save_dir) / n).exists() for n in SAVED_NAMES)


def _plot_path(config: ConfigureConfig) -> Path | None:
    if config.plot is not None:
        return Path(config.plot)
    if config.save_dir is not None:
        return Path(config.save_dir) / "pareto.png"
    return None


def _save(
    config: ConfigureConfig,
    hardware: Hardware,
    settings: SearchSettings,
    result: SearchResult,
    served_name: str,
) -> None:
    from armature.configurator.save import SaveRequest, save_deployment

    assert config.model is not None and config.save_dir is not None
    model_path = Path(config.model).resolve()
    model_dir = model_path if model_path.is_dir() else model_path.parent
    request = SaveRequest(
        save_dir=Path(config.save_dir).resolve(),
        model_dir=model_dir,
        served_model_name=served_name,
        hardware=hardware,
        settings=settings,
        chosen=result.ranked[0],
    )
    for path in save_deployment(request):
        print(f"wrote {path}")
