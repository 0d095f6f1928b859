"""The native engine's steps under Poisson load against its steps in uniform batches, each
against the timing profile's model, interleaved step by step so that the machine's drift
cancels: what the profile's load pass (`armature profile --load-requests`) corrects.

    python -m bench.loaded_steps [--rounds R] [--seconds S]   # writes docs/benchmarks.md
    python -m bench.loaded_steps --quick                      # smoke run, bench/out/

It profiles the native engine as bench.configurator_native does (one torch thread, the
validation's sweep, its load pass `--load-requests 48` included), then builds two engine
cores in this process with the profile's settings and steps them in turn, one step each: core U
serves uniform batches (8 prompts of 124 tokens, 36 outputs each, then the next 8), core P
Poisson arrivals of the validation's lengths (prompts 64-192, outputs 16-48 tokens; an
arrival before a step with probability 0.2, about 3 requests/s at its step times). Each
step's wall time (its step record) is divided by the profile's tables for the same work (no
load factor) and summed by kind, as the load pass sums them; the profile's own load factor
is beside.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec
import torch

from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.profiler.load_pass import sum_step_times
from armature.protocols.engine import EngineRequest, SamplingParams, StepRecord
from armature.protocols.timing_profile import LoadCheck, read_profile
from armature.sim.profile_timing import ProfileTiming, timing_from_profile
from bench.configurator_native import make_profile
from bench.configurator_plan import FULL, QUICK
from bench.harness import parse_args, publish
from bench.paths import REPO_ROOT
from bench.report import Section, markdown_table
from bench.served_steps import get_step_kind

LOG_DIR = REPO_ROOT / "bench" / "out" / "loaded_steps"
ARRIVAL_PER_STEP = 0.2
KINDS = ("prefill", "decode", "mixed")


def sum_ratios(
    records: Sequence[StepRecord], timing: ProfileTiming
) -> dict[str, tuple[int, float]]:
    """Per kind (and "all"): the number of steps and their summed wall time over the summed
    model time (as the load pass sums them)."""
    groups: dict[str, list[StepRecord]] = {"all": list(records)} if records else {}
    for r in records:
        groups.setdefault(get_step_kind(r), []).append(r)
    ratios = {}
    for kind, group in groups.items():
        measured_s, modeled_s = sum_step_times(group, timing)
        if modeled_s > 0:
            ratios[kind] = (len(group), measured_s / modeled_s)
    return ratios


class Streams:
    """The two cores and their request streams, stepped in turn."""

    def __init__(self, profile_path: Path, model_dir: Path, seed: int):
        profile = read_profile(profile_path)

        def core() -> EngineCore:
            config = NativeEngineConfig(
                model_dir=model_dir,
                dtype=profile.source.dtype,
                device="cpu",
                max_num_seqs=profile.max_num_seqs,
                max_num_batched_tokens=profile.max_num_batched_tokens,
            )
            return EngineCore(config)

        self.uniform, self.poisson = core(), core()
        self.vocab_size = self.uniform.arch.vocab_size
        self.rng = random.Random(seed)
        self.num_requests = 0

    def _request(self, prompt_tokens: int, output_tokens: int) -> EngineRequest:
        self.num_requests += 1
        return EngineRequest(
            request_id=f"r{self.num_requests}",
            prompt_token_ids=[self.rng.randrange(self.vocab_size) for _ in range(prompt_tokens)],
            sampling=SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True),
        )

    def run(self, seconds: float) -> tuple[list[StepRecord], list[StepRecord]]:
        """Step both cores in turn for `seconds`; their step records."""
        self.uniform.take_step_records()
        self.poisson.take_step_records()
        started_s = time.perf_counter()
        while time.perf_counter() - started_s < seconds:
            if not self.uniform.has_work():
                for _ in range(8):
                    self.uniform.add_request(self._request(124, 36))
            self.uniform.step()
            if self.rng.random() < ARRIVAL_PER_STEP:
                prompt = self.rng.randint(64, 192)
                self.poisson.add_request(self._request(prompt, self.rng.randint(16, 48)))
            if self.poisson.has_work():
                self.poisson.step()
        return self.uniform.take_step_records(), self.poisson.take_step_records()


def _describe_load(load: LoadCheck) -> str:
    """The load pass's factors: all steps, and prompt steps over decode steps."""
    prompt = load.prompt_step_factor
    return f"factor {load.factor:.3f}, prompt step factor " + (
        "none (a class without steps)" if prompt is None else f"{prompt:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=90.0, help="per round")
    args, ns = parse_args(__doc__.splitlines()[0], parser)
    plan = QUICK if args.quick else FULL
    rounds, seconds = (1, 10.0) if args.quick else (ns.rounds, ns.seconds)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    profile_path = make_profile(args, plan, LOG_DIR, "profile")
    profile = read_profile(profile_path)
    load = profile.load
    tables = timing_from_profile(msgspec.structs.replace(profile, load=None))
    torch.set_num_threads(1)  # as profiled: a worker is one core
    streams = Streams(profile_path, args.model_dir, args.seed)
    streams.run(5.0 if not args.quick else 1.0)  # warm-up: lazy initialisation, not timed
    rows, poisson_over_uniform = [], []
    for number in range(1, rounds + 1):
        uniform, poisson = streams.run(seconds)
        u, p = sum_ratios(uniform, tables), sum_ratios(poisson, tables)
        for name, ratios in (("uniform", u), ("Poisson", p)):
            cells = [f"{ratios[k][1]:.3f} ({ratios[k][0]})" if k in ratios else "" for k in KINDS]
            rows.append([number, name, *cells, f"{ratios['all'][1]:.3f}"])
        poisson_over_uniform.append(p["all"][1] / u["all"][1])
        print(rows[-2], rows[-1], flush=True)
    spread = (
        f"median {statistics.median(poisson_over_uniform):.3f}, "
        f"{min(poisson_over_uniform):.3f}-{max(poisson_over_uniform):.3f}"
    )
    body = (
        f"The native engine in this process ({profile.source.dtype}, one torch thread, "
        f"max-num-seqs {profile.max_num_seqs}, batch {profile.max_num_batched_tokens}), "
        f"against its profile `armature profile --engine torch {' '.join(plan.profile_args)}` "
        f"made first; {rounds} rounds of {seconds:g} s, the two cores stepped in turn, one "
        "step each. Cells: the steps' summed wall time over the profile's tables (no load "
        "factor) for the same steps, by kind (steps in brackets); `all`: every step.\n\n"
        + markdown_table(["round", "stream", *KINDS, "all"], rows)
        + f"\n\n- Poisson over uniform, all steps: {spread}\n"
        + "- The profile's own load pass: "
        + (_describe_load(load) if load is not None else "none")
        + "\n"
    )
    publish(
        args,
        Section(
            "loaded_steps",
            "Steps under load against uniform batches",
            body,
            profile.source.dtype,
        ),
    )


if __name__ == "__main__":
    main()
