"""Served step times against the profile's model: how much slower a worker's engine steps run
when it serves through the whole stack (frontend, request plane, the other workers and the
bench client on the same cores) than the isolated timing profile says.

    python -m bench.served_steps [--workers N] [--max-num-seqs S] [--rate R] [--window-s W]

It profiles the native engine as bench.configurator_native does (one torch thread per worker),
serves `--workers` worker processes (`armature serve`, kv router), offers `armature bench`'s
Poisson load of the configurator validation's workload, and reads each worker's step records
from the event plane over a window in the middle of the run, with every process's and
thread's CPU from /proc over the same window. Each step's wall time is divided by what the
profile's timing model (the mocker's) gives for that step's work. The configurator issue:
this is the part of its prediction error that is the serving stack sharing the workers' cores.

Writes the `served_steps` section of docs/benchmarks.md (bench/out/ with --quick).
"""

from __future__ import annotations

import argparse
import asyncio
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
            work = StepWork(
                s.num_scheduled_prefill_tokens, s.num_decode_requests, 0.0, s.num_decode_kv_tokens
            )
            by_kind.setdefault(get_step_kind(s), []).append(
                (s.step_wall_s * 1000.0, timing.step_ms(work))
            )
        for kind in ("prefill", "decode", "mixed"):
            pairs = by_kind.get(kind, [])
            if pairs:
                out.append(
                    KindRatio(
                        worker.worker_id,
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2 or more)")
    parser.add_argument("--max-num-seqs", type=int, nargs="+", default=[8, 2])
    parser.add_argument(
        "--rate",
        type=float,
        nargs="+",
        default=[2.45, 0.96],
        help="requests/s offered, one per --max-num-seqs (the configurator's predicted rates "
        "for 2 workers in the 2026-11-28 validation run)",
    )
    parser.add_argument("--window-s", type=float, default=60.0)
    args, ns = parse_args(__doc__.splitlines()[0], parser)
    if ns.workers < 2:
        raise SystemExit("--workers: at least 2 (one worker runs inside the frontend's process)")
    if len(ns.rate) != len(ns.max_num_seqs):
        raise SystemExit("--rate: one per --max-num-seqs")
    plan = QUICK if args.quick else FULL
    window_s = 10.0 if args.quick else ns.window_s
    warm_s = 5.0 if args.quick else 20.0
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    profile_path = make_profile(args, plan, LOG_DIR, "profile")
    profile = read_profile(profile_path)
    timing = timing_from_profile(profile)
    w = plan.workload
    ratio_rows, cpu_rows = [], []
    for seqs, rate in zip(ns.max_num_seqs, ns.rate, strict=True):
        port = free_port("127.0.0.1")
        url = f"http://127.0.0.1:{port}"
        serve = [sys.executable, "-m", "armature.cli", "serve", "--workers", str(ns.workers)]
        serve += ["--model", str(args.model_dir), "--served-model-name", args.served_name]
        serve += ["--max-num-seqs", str(seqs), "--max-num-batched-tokens", "256"]
        serve += ["--num-kv-blocks", str(profile.num_kv_blocks), "--router", "kv"]
        serve += ["--host", "127.0.0.1", "--port", str(port)]
        num_requests = max(8, round(rate * (warm_s + window_s + 15.0)))
        bench = [sys.executable, "-m", "armature.cli", "bench", "--url", url]
        bench += ["--endpoint", "completions", "--rate", f"{rate:g}"]
        bench += ["--num-requests", str(num_requests), "--warmup", "4"]
        bench += ["--input-len", str(round(w.isl_tokens)), "--output-len", str(round(w.osl_tokens))]
        bench += ["--len-spread", str(w.spread), "--ignore-eos", "--seed", str(args.seed)]
        log = LOG_DIR / f"serve_seqs{seqs}.log"
        env = {**os.environ, **WORKER_ENV}
        with running_server(serve, url, log, env):
            found = _MEET.search(log.read_text())
            if found is None:
                raise RuntimeError(f"{log}: the serve log does not name its discovery directory")
            steps, shares = asyncio.run(_collect(found.group(1), bench, warm_s, window_s))
        label = f"seqs {seqs}, {rate:g} req/s"
        for r in get_ratios(steps, timing):
            ratio_rows.append(
                [
                    label,
                    r.worker,
                    r.kind,
                    r.num_steps,
                    f"{r.median_ratio:.3f}",
                    f"{r.measured_s:.1f}",
                    f"{r.modeled_s:.1f}",
                ]
            )
        for name, share in sorted(shares.items(), key=lambda kv: -kv[1]):
            cpu_rows.append([label, name, f"{share * 100:.1f}"])
        print(label, "done", flush=True)
    body = (
        f"`armature serve --workers {ns.workers}` (kv router, max-num-batched-tokens 256, "
        f"workers with one torch thread: `OMP_NUM_THREADS=1`), `armature bench` offering "
        f"Poisson arrivals of {round(w.isl_tokens)}-token prompts and {round(w.osl_tokens)} "
        f"output tokens (+-{w.spread:.0%}, EOS ignored, streaming) at each rate; a "
        f"{window_s:g} s window after {warm_s:g} s of load. Profile: `armature profile "
        f"--engine torch {' '.join(plan.profile_args)}` made first. `ratio`: a step's wall time "
        "(its step record, read from the event plane) over the profile's model of that step "
        "(the mocker's timing), the median over the window's steps of that kind; `measured` "
        "and `model`: their sums. CPU: % of one core over the window, per process and "
        "thread, [pid] and [tid] (the bench client and this script included; threads under "
        "0.1% left out).\n\n"
        + markdown_table(
            ["load", "worker", "steps", "count", "ratio", "measured s", "model s"], ratio_rows
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
