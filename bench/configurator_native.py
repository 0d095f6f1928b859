"""The configurator against measured runs of the native engine on this machine (issue
"Configurator", Validation: "predicted TTFT p50 and ITL p50 within 15% of the measured
figures, and the configuration ranked first is the measured best or within 5% of it").

    1. `armature profile --engine torch` of the default model, one torch thread per worker
       (a worker is one core: the local system's "GPU"), before each case
    2. `armature configure --system local` on the case's profile, as its code searches, once
       per max-num-seqs value, for each case (2 workers, then 1): every simulated finalist is
       a configuration to check, and all of a case's are ranked together as the search
       ranks its finalists (`rank_key`: on what the simulator predicts)
    3. per configuration, in rank order, `--passes` times over the case: a new profile, then
       the configuration saved as `--save-dir` saves it, its `commands_native.sh` serve line
       run for real, and `armature bench --trace` sending it the saved `workload.jsonl`: the
       very requests (arrivals and lengths) whose simulation is the prediction, at the rate
       the search predicted, unique prompts, EOS ignored. Until 12-05 the bench drew its own
       Poisson sample at that rate, whose first 50-300 gaps (the same seed every run) ran
       3-16% longer than the rate's: near a knee the two samples' TTFT p50 differ by tens of
       percent, more than the target, whichever one the model is right about
    4. per configuration and pass: predicted (the finalist's replay on the median of the
       profiles the case made before the run; beside it, on the one profile made just before
       the run and on the case's profile) and measured TTFT p50, ITL p50 and ITL mean, their
       errors, and tokens/s per worker measured; per case, the rank the configurator gave
       against the measured best; a plot of predicted against measured

This machine's speed moves by tens of percent within minutes (the same profile sweep has
measured the engine 48% slower 13 minutes later), more than the 15% target: a prediction from
a profile made half an hour earlier measures the machine's drift, not the model. So each run
is predicted from the profiles made up to just before it: their median, the machine's speed
over the case so far, which did better than the one profile made just before the run in all
three runs of 12-04 where both were made (the search and its ranking stay on the case's
profile). Every profile's speed is tabled against the first, so the drift that remains
(during a run: a profile and the next one) shows beside the errors.

    python -m bench.configurator_native             # full run, writes docs/benchmarks.md
    python -m bench.configurator_native --passes 2  # each configuration twice, interleaved
    python -m bench.configurator_native --co-profile  # each profile by as many engines at
                                                      # once as the case has workers
    python -m bench.configurator_native --quick     # smoke run, writes bench/out/benchmarks.md
    python -m bench.configurator_native --targets-scale 8  # a machine ~8x slower than the
                                                           # one the targets were set for
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from armature.config.configure import ConfigureConfig
from armature.configurator.hardware import Hardware, local_hardware
from armature.configurator.host import HostShare
from armature.configurator.model_spec import read_model_spec
from armature.configurator.save import SaveRequest, save_deployment
from armature.configurator.search import (
    RETRY_RATE_FACTORS,
    Ranked,
    SearchSettings,
    get_sim_timings,
    rank_key,
    search,
)
from armature.configurator.simulate import make_requests
from armature.configurator.space import SearchSpace
from armature.engines.native.device import pick_dtype
from armature.profiler.points import median_profile
from armature.protocols.timing_profile import TimingProfile, read_profile
from armature.runtime.ports import free_port
from armature.sim.replay import replay
from armature.workload.traces import TRACE_BLOCK_TOKENS, TraceRequest
from bench.configurator_checks import SLOWER_STEPS, Checked, Figures, checks, plot, row
from bench.configurator_plan import FULL, QUICK, Plan, with_targets_scale
from bench.harness import BenchArgs, parse_args, publish
from bench.paths import REPO_ROOT, image_dir
from bench.profile_drift import drift_table
from bench.report import Section, markdown_table
from bench.serving import running_server
from bench.stack_cpu import StackCpu, measure_stack_cpu

LOG_DIR = REPO_ROOT / "bench" / "out" / "configurator_native"
WORKER_ENV = {"OMP_NUM_THREADS": "1"}  # one core per worker, as profiled


def make_profile(args: BenchArgs, plan: Plan, out: Path, name: str, copies: int = 1) -> Path:
    """This machine's timing profile of the native engine, one thread per worker. With
    `copies` > 1, that many engines profiled at once (`armature profile --engines-at-once`:
    each in a process of its own, as a deployment of that many workers loads the host, each
    point the median of theirs)."""
    path = out / f"{name}.json"
    command = [sys.executable, "-m", "armature.cli", "profile", "--engine", "torch"]
    command += ["--model", str(args.model_dir), "--output", str(path), *plan.profile_args]
    if copies > 1:
        command += ["--engines-at-once", str(copies)]
    print("profiling:", shlex.join(command), flush=True)
    subprocess.run(command, check=True, env={**os.environ, **WORKER_ENV})
    return path


def _predicted(
    hardware: Hardware,
    r: Ranked,
    settings: SearchSettings,
    requests: list[TraceRequest] | None = None,
    step_scale: float = 1.0,
) -> Figures:
    """The finalist's own replay (its plan: the same requests, rate and fleet) on
    `hardware`'s step times: on the search's own hardware, the same TTFT p50 and ITL mean as
    its prediction, with the ITL p50 the prediction does not keep. With `requests`, the
    same fleet replays those instead (the ones a measured run sent). `step_scale`: every
    step time that many times longer."""
    assert r.plan is not None
    if requests is None:
        requests = make_requests(
            settings.workload,
            r.plan.request_rate_per_s,
            r.plan.num_requests,
            settings.seed,
            r.plan.arrival_shape,
        )
    rate = r.plan.request_rate_per_s / r.plan.num_groups
    timing, prefill = get_sim_timings(hardware, r, rate, step_scale)
    report = replay(requests, r.plan.config, timing, prefill)
    return Figures(
        report.ttft_ms.p50,
        report.itl_ms.p50,
        report.itl_ms.mean,
        r.prediction.tokens_per_s_per_gpu,
    )


def _serve_line(save_dir: Path) -> list[str]:
    """The one-command `armature serve` line of the saved native deployment."""
    lines = (save_dir / "commands_native.sh").read_text().splitlines()
    serve = next(line for line in lines if line.startswith("armature serve "))
    return shlex.split(serve)[1:]


def _measure(
    args: BenchArgs, plan: Plan, r: Ranked, save: Path
) -> tuple[Figures, list[TraceRequest]]:
    """Run the saved deployment for real and send it the requests its prediction simulated
    (the saved `workload.jsonl`), after `plan.warmup` requests one at a time."""
    assert r.plan is not None
    if r.plan.num_groups != r.num_groups:  # the sample is the simulated groups' share alone
        raise ValueError(f"{save.name}: {r.num_groups} groups, {r.plan.num_groups} simulated")
    trace = save / "workload.jsonl"  # `save_deployment` wrote the plan's requests there
    num_requests = r.plan.num_requests
    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "armature.cli", *_serve_line(save)]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    name = save.name
    print("serving:", shlex.join(command), flush=True)
    env = {**os.environ, **WORKER_ENV}
    with running_server(command, url, LOG_DIR / f"{name}.log", env):
        report_dir = LOG_DIR / name
        for bench in run_commands(args, plan, url, trace, num_requests, report_dir):
            subprocess.run(bench, check=True, stdout=subprocess.DEVNULL)
    step = json.loads((report_dir / "report.json").read_text())["steps"][0]
    summary = step["summary"]
    if summary["num_ok"] != num_requests:
        raise RuntimeError(f"{name}: {summary['errors']} (see {LOG_DIR / name})")
    figures = Figures(
        summary["ttft_ms"]["p50"],
        summary["itl_ms"]["p50"],
        summary["itl_ms"]["mean"],
        summary["output_tokens_per_s"] / r.num_gpus,
    )
    return figures, measured_requests(step["requests"])


def run_commands(
    args: BenchArgs, plan: Plan, url: str, trace: Path, num_requests: int, report_dir: Path
) -> tuple[list[str], list[str]]:
    """The `armature bench` lines of a run: `plan.warmup` synthetic requests one at a time,
    then the `num_requests` of `trace` on its own schedule, none of them left out as warm-up
    (the run is that sample, whole), reported into `report_dir`."""
    warmup = [*_bench_base(args, url), "--concurrency", "1", *_lengths(plan)]
    warmup += ["--num-requests", str(plan.warmup), "--warmup", "0"]
    bench = [*_bench_base(args, url), "--trace", str(trace)]
    bench += ["--num-requests", str(num_requests), "--warmup", "0", "--report", str(report_dir)]
    return warmup, bench


def _bench_base(args: BenchArgs, url: str) -> list[str]:
    """`armature bench` against `url`: streaming /v1/completions, EOS ignored, prompts
    counted in the served model's tokens."""
    bench = [sys.executable, "-m", "armature.cli", "bench", "--url", url]
    bench += ["--tokenizer", str(args.model_dir), "--endpoint", "completions", "--ignore-eos"]
    return [*bench, "--seed", str(args.seed)]


def _lengths(plan: Plan) -> list[str]:
    """The plan's synthetic prompts and outputs: its lengths and spread, unique prompts."""
    w = plan.workload
    lengths = ["--input-len", str(round(w.isl_tokens)), "--output-len", str(round(w.osl_tokens))]
    return [*lengths, "--len-spread", str(w.spread)]


def measure_stack(args: BenchArgs, plan: Plan) -> StackCpu:
    """The serving stack's CPU per request besides the engines (`bench.stack_cpu`), served
    as the 2-worker deployments are, on the plan's workload at `plan.stack_rate_per_s`."""
    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    serve = [sys.executable, "-m", "armature.cli", "serve", "--workers", "2"]
    serve += ["--model", str(args.model_dir), "--served-model-name", args.served_name]
    serve += ["--max-num-seqs", "4", "--max-num-batched-tokens", "256", "--router", "kv"]
    serve += ["--host", "127.0.0.1", "--port", str(port)]
    print("stack cpu:", shlex.join(serve), flush=True)
    window_requests = plan.stack_rate_per_s * plan.stack_window_s
    num_requests = plan.warmup + round(3 * window_requests) + 20  # outlasts the window
    bench = [*_bench_base(args, url), "--rate", f"{plan.stack_rate_per_s:.6g}"]
    bench += ["--num-requests", str(num_requests), "--warmup", str(plan.warmup)]
    bench += [*_lengths(plan), "--report", str(LOG_DIR / "stack_cpu")]
    stack = measure_stack_cpu(
        serve,
        bench,
        url,
        {**os.environ, **WORKER_ENV},
        LOG_DIR / "stack_cpu.log",
        settle_requests=plan.warmup + 4,
        window_s=plan.stack_window_s,
    )
    print("stack cpu:", stack.describe(), flush=True)
    return stack


def measured_requests(records: list[dict[str, Any]]) -> list[TraceRequest]:
    """The requests a bench run sent, as a trace: arrivals from its first send, the prompt
    and output tokens the server counted, no prompt sharing a block with another."""
    ordered = sorted(records, key=lambda r: r["sent_s"])
    first_s = ordered[0]["sent_s"]
    trace, next_id = [], 0
    for r in ordered:
        num_blocks = -(-r["prompt_tokens"] // TRACE_BLOCK_TOKENS)
        hash_ids = tuple(range(next_id, next_id + num_blocks))
        next_id += num_blocks
        arrival_ms = (r["sent_s"] - first_s) * 1000.0
        trace.append(TraceRequest(arrival_ms, r["prompt_tokens"], r["output_tokens"], hash_ids))
    return trace


def run_case(
    args: BenchArgs,
    plan: Plan,
    total: int,
    save_root: Path,
    profiles: list[tuple[str, Path]],
    passes: int,
    host: HostShare,
    co_profile: bool = False,
) -> list[Checked]:
    """Profile, search and rank the case's finalists (the engines sharing `host`); run each
    `passes` times, in rank order within a pass, a profile made just before each run (appended
    to `profiles`), the run predicted from the median of the case's profiles so far (and
    from the one just made, and with the former prompt-step rule, beside it).
    `co_profile`: each profile made by as many engines at once as the case has workers
    (`make_profile`'s copies)."""
    copies = total if co_profile else 1
    at_once = f" ({copies} at once)" if copies > 1 else ""
    profile = make_profile(args, plan, LOG_DIR, f"profile_before_{total}_workers", copies)
    profiles.append((f"{total}-worker case: search{at_once}", profile))
    case_profiles = [read_profile(profile)]  # the search's, then each run's
    model = read_model_spec(args.model_dir, pick_dtype("auto", "cpu"))  # as the workers run
    settings = SearchSettings(
        plan.workload,
        plan.targets,
        total,
        num_finalists=plan.num_finalists,
        sim_requests=plan.sim_requests,
        sim_budget_s=600.0,
        seed=args.seed,
        step_margin=SLOWER_STEPS - 1.0,  # as `armature configure`'s default
        max_ttft_growth=ConfigureConfig().max_ttft_growth,
    )
    finalists: dict[str, tuple[Hardware, Ranked]] = {}
    for seqs in plan.max_num_seqs:
        space = SearchSpace(tensor_parallel=(1,), max_num_seqs=(seqs,))
        hardware = local_hardware(model, case_profiles[0], space, host)
        result = search(hardware, settings, on_progress=print)
        for r in result.ranked:
            if r.simulated:
                finalists.setdefault(f"{r.deployment.describe()} x{r.num_groups}", (hardware, r))
    ranked = sorted(finalists.values(), key=lambda hr: rank_key(hr[1], by_gpus=False))

    def on(profile: TimingProfile, max_num_seqs: int, shared: bool = True) -> Hardware:
        space = SearchSpace(tensor_parallel=(1,), max_num_seqs=(max_num_seqs,))
        return local_hardware(model, profile, space, host if shared else None)

    # on the case's profile a finalist's replay is the same every pass
    at_search = [_predicted(hardware, r, settings) for hardware, r in ranked]
    checked = []
    for run in range(1, passes + 1):
        for rank, (hardware, r) in enumerate(ranked, start=1):
            name = f"w{total}_rank{rank}_pass{run}"
            fresh = make_profile(args, plan, LOG_DIR, f"profile_{name}", copies)
            profiles.append((f"{total} workers, #{rank}, pass {run}{at_once}", fresh))
            case_profiles.append(read_profile(fresh))
            so_far = median_profile(case_profiles)  # the machine before this run
            seqs = r.deployment.max_num_seqs
            now = on(so_far, seqs)
            save = save_root / name
            request = SaveRequest(save, args.model_dir, args.served_name, hardware, settings, r)
            save_deployment(request)
            rate = r.prediction.request_rate_per_s * r.num_groups
            measured, sent = _measure(args, plan, r, save)
            meets = plan.targets.get_miss(measured.ttft_p50_ms, measured.itl_mean_ms, 0.0) <= 1.0
            one = Checked(
                total,
                rank,
                run,
                r,
                rate,
                len(sent),
                _predicted(now, r, settings),
                at_search[rank - 1],
                _predicted(now, r, settings, sent),
                _predicted(on(so_far, seqs, shared=False), r, settings),
                _predicted(now, r, settings, step_scale=SLOWER_STEPS),
                measured,
                meets,
                just_before=_predicted(on(case_profiles[-1], seqs), r, settings),
                prompt_relative=_predicted(on(prompt_factor_relative(so_far), seqs), r, settings),
            )
            checked.append(one)
            print(row(one), flush=True)
    return checked


def prompt_factor_relative(profile: TimingProfile) -> TimingProfile:
    """`profile` with its load pass's prompt steps at their measured-over-modeled time over
    the decode steps' (the mocker's rule until 12-05, which cancelled the machine's drift
    between the sweep and the pass), where the mocker takes their own: the prompt class's
    measured time divided by the decode class's factor. Unchanged without both classes."""
    load = profile.load
    if load is None or load.prompt_step_factor is None or load.decode_step_factor is None:
        return profile
    prompt_s = load.prompt_measured_s / load.decode_step_factor
    return msgspec.structs.replace(
        profile, load=msgspec.structs.replace(load, prompt_measured_s=prompt_s)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--passes",
        type=int,
        default=1,
        choices=range(1, 6),
        metavar="N",
        help="run every configuration N times, a pass over the case at a time (1-5)",
    )
    parser.add_argument(
        "--co-profile",
        action="store_true",
        help="make each case's profiles with as many engines at once as it has workers (they "
        "share the host's memory bandwidth as its workers do), each point their median",
    )
    parser.add_argument(
        "--targets-scale",
        type=float,
        default=1.0,
        help="multiply the TTFT and ITL targets by this, on a machine this many times slower "
        "than the one they were set for (a lone 256-token prefill ~140 ms); choose it from a "
        "profile before the run",
    )
    parser.add_argument(
        "--totals",
        type=int,
        nargs="+",
        default=None,
        metavar="WORKERS",
        help="the cases to run, by workers deployed (default: the plan's, 2 then 1)",
    )
    args, ns = parse_args(__doc__.splitlines()[0], parser)
    plan = QUICK if args.quick else FULL
    if ns.totals is not None:
        if any(t < 1 for t in ns.totals):
            raise SystemExit("--totals: each case needs at least one worker")
        plan = dataclasses.replace(plan, totals=tuple(ns.totals))
    if ns.targets_scale != 1.0:
        plan = with_targets_scale(plan, ns.targets_scale)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    checked: list[Checked] = []
    profiles: list[tuple[str, Path]] = []
    stack = measure_stack(args, plan)
    host = HostShare(
        float(os.cpu_count() or 1),
        stack.total_ms / 1000.0,
        stack.idle_cores,
        stack.shells_ms / 1000.0,
        stack.frontend_ms / 1000.0,
    )
    with tempfile.TemporaryDirectory() as tmp:
        for total in plan.totals:
            checked += run_case(
                args, plan, total, Path(tmp), profiles, ns.passes, host, ns.co_profile
            )
        profiles.append(("at the end", make_profile(args, plan, LOG_DIR, "profile_at_end")))
    image = "configurator_native.png"
    plot_path = image_dir(args.out) / image
    in_repo = plot_path.is_relative_to(REPO_ROOT)
    shown_plot = plot_path.relative_to(REPO_ROOT) if in_repo else plot_path
    plot(checked, plot_path)
    w, t = plan.workload, plan.targets
    table = markdown_table(
        [
            "workers",
            "rank",
            "pass",
            "configuration",
            "rate req/s",
            "requests",
            "TTFT p50 ms predicted / measured",
            "ITL p50 ms",
            "ITL mean ms",
            "TTFT / ITL p50 error from the one profile made just before the run",
            "TTFT / ITL p50 error from the search's profile",
            "TTFT / ITL p50 error, prompt steps at their ratio to the decode steps'",
            "TTFT / ITL p50 error, the measured requests replayed",
            "TTFT / ITL p50 error, engines a core each",
            f"TTFT p50 ms predicted with steps {SLOWER_STEPS - 1:.0%} slower",
            "tokens/s per worker",
            "meets targets measured",
        ],
        [row(c) for c in checked],
    )
    body = (
        f"The default model on this machine's CPU, one torch thread per worker "
        f"(`OMP_NUM_THREADS=1`: a worker is one core, the local system's GPU). Each profile: "
        f"`armature profile --engine torch {' '.join(plan.profile_args)}`"
        + (
            ", made by as many engines at once as the case has workers (each point their "
            "median; `--co-profile`)"
            if ns.co_profile
            else ""
        )
        + ". The search: "
        f"`--system local` on the case's profile, max-num-seqs "
        f"{', '.join(map(str, plan.max_num_seqs))}, prompts of "
        f"{w.isl_tokens:.0f} and outputs of {w.osl_tokens:.0f} tokens within +-{w.spread:.0%}, "
        f"targets TTFT p50 {t.ttft_ms:.0f} ms and ITL mean {t.itl_ms:.0f} ms, met with "
        f"every step {SLOWER_STEPS - 1:.0%} slower too and TTFT p50 growing at most "
        f"{ConfigureConfig().max_ttft_growth:.0%} there (`armature configure`'s defaults; the "
        f"latter since 12-05: a finalist at its knee is offered "
        f"{', then '.join(f'{x:.0%}' for x in RETRY_RATE_FACTORS)} of its rate), "
        f"{plan.num_finalists} finalists per max-num-seqs value, a case's finalists ranked "
        f"together. Each ran {ns.passes} time(s) (a pass over the case at a time) as its saved "
        f"`commands_native.sh` serve line with `armature bench` sending it the very requests "
        f"its prediction simulated (the saved `workload.jsonl` as `--trace`: the search's "
        f"sample of the workload, at least {plan.sim_requests} requests, Poisson arrivals at "
        f"the rate the search predicted, their lengths and arrival times; /v1/completions, "
        f"streaming, EOS ignored, unique prompts; {plan.warmup} warm-up requests one at a "
        f"time before, not counted); the bench client and the frontend share "
        f"the machine's cores with the workers. Predicted: the finalist's replay on the "
        f"median of the profiles the case made before the run (the search's and the one made "
        f"before each run so far, this run's included: the machine's speed over the case, not "
        f"in the one minute before the run); beside it, the errors of the same replay on the "
        f"one profile made just before the run (the published prediction until 12-05), on the "
        f"case's profile (the one the search ranked on), on the median with prompt steps at "
        f"the load pass's measured-over-modeled time over its decode steps' (the mocker's rule "
        f"until 12-05, which cancelled the machine's drift between the sweep and the pass; "
        f"the mocker now takes the prompt steps' own), and of the requests the run sent "
        f"(their arrivals and lengths as the server saw them) replayed on the same fleet and "
        f"profile: what is left of the error once the client's timing and the prompts' "
        f"token counts are the run's own. The engines share the host's "
        f"{host.num_cores:g} cores with the rest of the stack (`HostShare`), whose CPU was "
        f"measured first (`bench.stack_cpu`, 2 workers, {plan.stack_window_s:g} s): "
        f"{stack.describe()}: each engine loses what runs in its own process (its worker's "
        f"shell; a lone worker's, the frontend too: since 12-05) and an equal part of what "
        f"the rest does not fit on the cores no engine holds; the errors of the prediction "
        f"that gives each engine a core to itself (as before that model) are the last error "
        f"column. Errors: predicted against "
        f"measured. The column after them: the same prediction with every step time "
        f"{SLOWER_STEPS - 1:.0%} longer, and how far its TTFT p50 moves (near the knee far "
        f"more than 10%: what a machine slower during the run than at its profile does).\n\n"
        f"{table}\n\n" + "\n".join(checks(checked)) + "\n\n"
        f"Plot: `{shown_plot}`.\n\n"
        f"The machine's own speed, as each profile of the same engine measured it (the same "
        f"sweep each time, against the first; a run is predicted from the median of those "
        f"made before it, and the next profile shows how far the machine moved during the "
        f"run):"
        f"\n\n{drift_table([(when, read_profile(path)) for when, path in profiles])}\n"
    )
    publish(
        args,
        Section(
            "configurator_native",
            "Configurator: predictions vs the native engine",
            body,
            pick_dtype("auto", "cpu"),
        ),
    )


if __name__ == "__main__":
    main()
