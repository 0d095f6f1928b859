"""Served step times against the profile's model: how much slower a worker's engine steps run
when it serves through the whole stack (frontend, request plane, the other workers and the
bench client on the same cores) than the isolated timing profile says.

    python -m bench.served_steps [--cases W:S:R ...] [--window-s W]

It profiles the native engine as bench.configurator_native does (one torch thread per
worker), serves each case's worker processes (`armature serve --worker-processes`, kv
router), offers `armature bench`'s Poisson load of the configurator validation's workload,
and reads each worker's step records from the event plane over a window in the middle of the
run, with every process's and thread's CPU from /proc over the same window. Each step's wall
time is divided by what the profile's timing model (the mocker's) gives for that step's work.
The configurator issue: this is the part of its prediction error that is the serving stack
sharing the workers' cores, or slowing a lone worker that has a core to itself.

Writes the `served_steps` section of docs/benchmarks.md (bench/out/ with --quick).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from armature.config.runtime import RuntimeConfig
from armature.planner.observation import WorkerSteps
from armature.planner.worker_feed import WorkerStepFeed
from armature.protocols.engine import StepRecord
from armature.protocols.timing_profile import read_profile
from armature.protocols.worker import WorkerRole
from armature.runtime.factory import make_event_plane, open_discovery
from armature.runtime.ports import free_port
from armature.sim.profile_timing import ProfileTiming, timing_from_profile
from armature.sim.timing import StepWork
from bench.configurator_native import FULL, QUICK, WORKER_ENV, make_profile
from bench.harness import parse_args, publish
from bench.paths import REPO_ROOT
from bench.report import Section, markdown_table
from bench.serving import running_server

LOG_DIR = REPO_ROOT / "bench" / "out" / "served_steps"
_MEET = re.compile(r"the workers meet in (\S+)")
WINDOW = "served_steps"


def get_step_kind(s: StepRecord) -> str:
    if s.num_scheduled_prefill_tokens and s.num_decode_requests:
        return "mixed"
    return "prefill" if s.num_scheduled_prefill_tokens else "decode"


@dataclass(frozen=True)
class KindRatio:
    worker: str
    role: WorkerRole
    kind: str
    num_steps: int
    median_ratio: float  # a step's wall time over the model's, the median
    measured_s: float
    modeled_s: float


def get_ratios(steps: Sequence[WorkerSteps], timing: ProfileTiming) -> list[KindRatio]:
    """Each worker's steps by kind (prefill, decode, mixed): wall time against the model."""
    out = []
    for worker in steps:
        by_kind: dict[str, list[tuple[float, float]]] = {}
        for s in worker.step_records:
            by_kind.setdefault(get_step_kind(s), []).append(
                (s.step_wall_s * 1000.0, timing.step_ms(StepWork.of_record(s)))
            )
        for kind in ("prefill", "decode", "mixed"):
            pairs = by_kind.get(kind, [])
            if pairs:
                out.append(
                    KindRatio(
                        worker.worker_id,
                        worker.role,
                        kind,
                        len(pairs),
                        statistics.median(m / p for m, p in pairs),
                        sum(m for m, _ in pairs) / 1000.0,
                        sum(p for _, p in pairs) / 1000.0,
                    )
                )
    return out


def _thread_cpu_s() -> dict[tuple[int, int], tuple[str, float]]:
    """This process and its descendants (the server, its workers, the bench client), by
    (pid, tid): (the process's command, pid, thread name and tid; its CPU seconds)."""
    me = psutil.Process()
    out = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            with proc.oneshot():
                command = " ".join(proc.cmdline()[2:4])  # "python -m" skipped
                for t in proc.threads():
                    name = psutil.Process(t.id).name() if t.id != proc.pid else proc.name()
                    label = f"{command} [{proc.pid}] / {name} [{t.id}]"
                    out[(proc.pid, t.id)] = (label, t.user_time + t.system_time)
        except psutil.Error:
            continue  # gone meanwhile
    return out


async def _collect(
    directory: str, bench: list[str], warm_s: float, window_s: float
) -> tuple[list[WorkerSteps], dict[str, float]]:
    """Run `bench`; over [warm_s, warm_s + window_s] of it, the workers' step records and
    the CPU share (of one core) of every thread of this process tree."""
    runtime = RuntimeConfig(namespace="serve", discovery_dir=directory)
    discovery = await open_discovery(runtime)
    events = await make_event_plane(runtime)
    feed = WorkerStepFeed(discovery, events, "serve", (WINDOW,))
    task = asyncio.create_task(feed.run())
    try:
        client = await asyncio.create_subprocess_exec(*bench, stdout=subprocess.DEVNULL)
        await asyncio.sleep(warm_s)
        feed.take_steps(WINDOW)
        before, t0 = _thread_cpu_s(), time.monotonic()
        await asyncio.sleep(window_s)
        after, elapsed = _thread_cpu_s(), time.monotonic() - t0
        steps = feed.take_steps(WINDOW)
        if await client.wait() != 0:
            raise RuntimeError("armature bench failed")
    finally:
        task.cancel()
        await events.close()
        await discovery.close()
    shares: dict[str, float] = {}
    for key, (label, cpu_s) in after.items():
        share = (cpu_s - before.get(key, (label, 0.0))[1]) / elapsed
        if share >= 0.001:
            shares[label] = shares.get(label, 0.0) + share
    return steps, shares


@dataclass(frozen=True)
class Case:
    workers: int  # aggregated workers, or decode workers beside `prefill_workers`
    max_num_seqs: int
    rate_per_s: float
    prefill_workers: int = 0  # > 0: disaggregated, every prompt prefilled remotely

    @property
    def label(self) -> str:
        fleet = f"{self.workers} w"
        if self.prefill_workers:
            fleet = f"{self.prefill_workers}P:{self.workers}D"
        return f"{fleet}, seqs {self.max_num_seqs}, {self.rate_per_s:g} req/s"

    @property
    def name(self) -> str:
        """The case's logs' and report's file name."""
        fleet = f"w{self.workers}"
        if self.prefill_workers:
            fleet = f"p{self.prefill_workers}d{self.workers}"
        return f"{fleet}_seqs{self.max_num_seqs}_rate{self.rate_per_s:g}"

    def get_fleet_args(self) -> list[str]:
        """`armature serve`'s worker flags for this case's fleet."""
        if not self.prefill_workers:
            return ["--workers", str(self.workers)]
        return [
            *("--prefill-workers", str(self.prefill_workers)),
            *("--decode-workers", str(self.workers)),
            *("--max-local-prefill-tokens", "0"),  # as the configurator saves it
        ]


_DISAGG_FLEET = re.compile(r"(\d+)P(\d+)D")


def parse_case(text: str) -> Case:
    """`WORKERS:MAX_NUM_SEQS:RATE`, e.g. `2:8:2.45`; WORKERS as `<P>P<D>D` (`1P1D`) for P
    prefill and D decode workers."""
    try:
        fleet, seqs, rate = text.split(":")
        disagg = _DISAGG_FLEET.fullmatch(fleet)
        if disagg is None:
            case = Case(int(fleet), int(seqs), float(rate))
        else:
            prefill, decode = int(disagg.group(1)), int(disagg.group(2))
            case = Case(decode, int(seqs), float(rate), prefill)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give WORKERS:MAX_NUM_SEQS:RATE (WORKERS as 2, or 1P1D)"
        ) from None
    no_prefill = disagg is not None and case.prefill_workers < 1
    if case.workers < 1 or case.max_num_seqs < 1 or not case.rate_per_s > 0 or no_prefill:
        raise argparse.ArgumentTypeError(f"{text!r}: workers, seqs and rate must be positive")
    return case


# the configurator validation's predicted rates: 2 workers on 2026-11-28, 1 on 2026-11-29
DEFAULT_CASES = ("2:8:2.45", "2:2:0.96", "1:8:1.22", "1:4:0.93")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases",
        type=parse_case,
        nargs="+",
        default=[parse_case(c) for c in DEFAULT_CASES],
        metavar="W:S:R",
        help="worker processes (a lone one too), max-num-seqs and requests/s offered, one "
        f"run each (default: {' '.join(DEFAULT_CASES)})",
    )
    parser.add_argument("--window-s", type=float, default=60.0)
    args, ns = parse_args(__doc__.splitlines()[0], parser)
    plan = QUICK if args.quick else FULL
    window_s = 10.0 if args.quick else ns.window_s
    warm_s = 5.0 if args.quick else 20.0
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    profile_path = make_profile(args, plan, LOG_DIR, "profile")
    profile = read_profile(profile_path)
    timing = timing_from_profile(profile)
    w = plan.workload
    ratio_rows, latency_rows, cpu_rows = [], [], []
    for case in ns.cases:
        port = free_port("127.0.0.1")
        url = f"http://127.0.0.1:{port}"
        serve = [sys.executable, "-m", "armature.cli", "serve", *case.get_fleet_args()]
        serve += ["--worker-processes"]  # a lone worker too: its step records on the event plane
        serve += ["--model", str(args.model_dir), "--served-model-name", args.served_name]
        serve += ["--max-num-seqs", str(case.max_num_seqs), "--max-num-batched-tokens", "256"]
        serve += ["--num-kv-blocks", str(profile.num_kv_blocks), "--router", "kv"]
        serve += ["--host", "127.0.0.1", "--port", str(port)]
        num_requests = max(8, round(case.rate_per_s * (warm_s + window_s + 15.0)))
        bench = [sys.executable, "-m", "armature.cli", "bench", "--url", url]
        bench += ["--endpoint", "completions", "--rate", f"{case.rate_per_s:g}"]
        bench += ["--num-requests", str(num_requests), "--warmup", "4"]
        bench += ["--input-len", str(round(w.isl_tokens)), "--output-len", str(round(w.osl_tokens))]
        bench += ["--len-spread", str(w.spread), "--ignore-eos", "--seed", str(args.seed)]
        name = case.name
        bench += ["--report", str(LOG_DIR / name)]
        log = LOG_DIR / f"serve_{name}.log"
        env = {**os.environ, **WORKER_ENV}
        with running_server(serve, url, log, env):
            found = _MEET.search(log.read_text())
            if found is None:
                raise RuntimeError(f"{log}: the serve log does not name its discovery directory")
            steps, shares = asyncio.run(_collect(found.group(1), bench, warm_s, window_s))
        for r in get_ratios(steps, timing):
            ratio_rows.append(
                [
                    case.label,
                    f"{r.worker} ({r.role.value})",
                    r.kind,
                    r.num_steps,
                    f"{r.median_ratio:.3f}",
                    f"{r.measured_s:.1f}",
                    f"{r.modeled_s:.1f}",
                ]
            )
        summary = json.loads((LOG_DIR / name / "report.json").read_text())["steps"][0]["summary"]
        latency_rows.append(
            [
                case.label,
                summary["num_ok"],
                f"{summary['ttft_ms']['p50']:.1f}",
                f"{summary['itl_ms']['p50']:.1f}",
                f"{summary['itl_ms']['mean']:.1f}",
            ]
        )
        for label, share in sorted(shares.items(), key=lambda kv: -kv[1]):
            cpu_rows.append([case.label, label, f"{share * 100:.1f}"])
        print(case.label, "done", flush=True)
    body = (
        "`armature serve --workers W --worker-processes` (W worker processes, a lone one too; "
        "a `P`P`D`D case: `--prefill-workers P --decode-workers D --max-local-prefill-tokens 0`, "
        "every prompt prefilled remotely, as the configurator saves it; "
        "kv router, max-num-batched-tokens 256, "
        f"workers with one torch thread: `OMP_NUM_THREADS=1`), `armature bench` offering "
        f"Poisson arrivals of {round(w.isl_tokens)}-token prompts and {round(w.osl_tokens)} "
        f"output tokens (+-{w.spread:.0%}, EOS ignored, streaming) at each rate; a "
        f"{window_s:g} s window after {warm_s:g} s of load. Profile: `armature profile "
        f"--engine torch {' '.join(plan.profile_args)}` made first. `ratio`: a step's wall time "
        "(its step record, read from the event plane) over the profile's model of that step "
        "(the mocker's timing), the median over the window's steps of that kind; `measured` "
        "and `model`: their sums. The client's TTFT and ITL over the whole run (warm-up "
        "left out). CPU: % of one core over the window, per process and "
        "thread, [pid] and [tid] (the bench client and this script included; threads under "
        "0.1% left out).\n\n"
        + markdown_table(
            ["load", "worker", "steps", "count", "ratio", "measured s", "model s"], ratio_rows
        )
        + "\n\n"
        + markdown_table(
            ["load", "requests", "TTFT p50 ms", "ITL p50 ms", "ITL mean ms"], latency_rows
        )
        + "\n\n"
        + markdown_table(["load", "process / thread", "CPU %"], cpu_rows)
        + "\n"
    )
    publish(
        args,
        Section("served_steps", "Served step times against the profile's model", body, "auto"),
    )


if __name__ == "__main__":
    main()
