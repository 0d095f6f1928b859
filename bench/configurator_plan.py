"""bench.configurator_native's plans: what each run profiles, searches and offers (the
full validation and its quick smoke run)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from armature.configurator.space import Targets, Workload

__all__ = ["FULL", "QUICK", "Plan", "with_targets_scale"]


@dataclass(frozen=True)
class Plan:
    profile_args: tuple[str, ...]  # `armature profile` options besides the engine and output
    max_num_seqs: tuple[int, ...]  # searched
    workload: Workload
    targets: Targets
    totals: tuple[int, ...]  # workers to deploy on, one case each
    num_finalists: int
    # the search's sample of the workload, at least this many requests (`SearchSettings`);
    # each run sends a finalist the very requests its prediction simulated
    sim_requests: int
    warmup: int  # requests sent one at a time before a run, not counted
    stack_rate_per_s: float  # the load under which the stack's CPU per request is measured
    stack_window_s: float


FULL = Plan(
    profile_args=(
        "--max-num-seqs=8",
        "--max-num-batched-tokens=256",
        "--prefill-input-tokens=16,64,128,192,256",
        "--prefill-repeats=3",
        "--decode-requests=1,2,4,8",
        "--decode-context-tokens=64,160,256",
        "--decode-output-tokens=16",
        # the load pass's prompt step factor: a loaded engine's steps that carry prefill
        # tokens against its decode steps of the same minutes, each against the tables (on
        # the Intel VM, 2026-12-02, prompt steps ran 1.12-1.34 of the tables where decode
        # steps ran 1.02-1.06: the TTFT optimism). Against decode steps, the VM's drift
        # since the sweep cancels, which the factor on every step did not (until 12-02)
        "--load-requests=48",
    ),
    max_num_seqs=(2, 4, 8),
    workload=Workload(128.0, 32.0, 0.5),
    # TTFT twice a lone request's (~250 ms): a target that binds, so that with the search's
    # step margin (configure's default) the operating points sit off their knees (since
    # 2026-12-05 the search's TTFT growth limit keeps them off whatever the target), where a
    # 10% slower machine moved the predicted TTFT p50 +77% (at 1500 ms, the runs up to
    # 2026-11-29 17:52, it never bound: every point ran at the estimate's rate). ITL loose
    # enough that the points are loaded: at 150 ms (the 2026-11-27 14:40 run) they sat
    # below one request per worker, where a worker's ITL has two modes (one request
    # decoding, or two) and its median flips between them
    targets=Targets(500.0, 300.0),
    totals=(2, 1),
    num_finalists=4,
    sim_requests=200,  # `armature configure`'s default
    warmup=4,
    stack_rate_per_s=1.0,
    stack_window_s=60.0,
)
QUICK = Plan(
    profile_args=(
        "--max-num-seqs=4",
        "--max-num-batched-tokens=128",
        "--prefill-input-tokens=16,64,128",
        "--prefill-repeats=1",
        "--decode-requests=1,4",
        "--decode-context-tokens=64,128",
        "--decode-output-tokens=4",
        "--load-requests=6",
    ),
    max_num_seqs=(2, 4),
    workload=Workload(48.0, 8.0, 0.5),
    targets=Targets(2000.0, 300.0),
    totals=(2,),
    num_finalists=2,
    sim_requests=12,
    warmup=2,
    stack_rate_per_s=1.0,
    stack_window_s=10.0,
)


def with_targets_scale(plan: Plan, scale: float) -> Plan:
    """`plan` with its TTFT and ITL targets `scale` times longer: for a machine that many times
    slower than the one they were set for (the Intel VM's bfloat16 engine, a lone 256-token
    prefill ~140 ms), so that they bind there as they bound here. Chosen before a run, from
    a profile, never from its results."""
    if scale <= 0:
        raise SystemExit("--targets-scale must be positive")
    t = plan.targets
    itl_ms = None if t.itl_ms is None else t.itl_ms * scale
    return replace(plan, targets=Targets(t.ttft_ms * scale, itl_ms))
