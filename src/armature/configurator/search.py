"""The search: every deployment that fits in memory, estimated in closed form at each
operating point; the best layouts simulated; ranked.

    deployments --memory fit--> estimate (best point per deployment) --rank--> finalists
               (the best limits of each layout, the best agg and disagg among them)
               --simulate--> ranked again on what the simulator predicts

Ranking: configurations that meet the targets first; among them the most tokens/s per GPU,
or with a request rate the fewest GPUs (then the most tokens/s per GPU), ties to the lower
TTFT; those that miss, by how far they miss (`get_acceptance_miss`, and the GPUs a request
rate needs over --total-gpus). A finalist meets its targets when the simulator finds it does
at its profiled step times and also with every step `step_margin` slower (headroom for a
machine slower than its profile, or a model a little optimistic), and its TTFT p50 grows by
at most `max_ttft_growth` there. Near a configuration's knee TTFT grows many times faster
than its step times: where 10% slower steps double it, a 2% error in a step time moves it
20%, so such a point is neither safe to serve at nor predictable. (A disaggregated
deployment's TTFT is its prefill pool's; its decode pool's knee shows in the ITL, which the
margin holds to the target but does not limit the growth of.) One that misses at the
estimated rate is simulated again at each of RETRY_RATE_FACTORS of it in turn, until one
meets; with a request rate, over more groups instead, each offered that share of the rate.
Its prediction is the simulation at the profiled step times. Finalists are simulated best
first (the best of the other mode second; those two whatever the budget), the rest while
`sim_budget_s` lasts. The result lists the simulated finalists, ranked, then every other
deployment by its estimate. On the local machine a finalist's steps are simulated at its
engines' share of the host's cores at the rate it is offered (`Hardware.get_timing`); the
closed-form estimate that picks the finalists takes each worker to have a core.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from armature.configurator.estimate import Estimator, Prediction
from armature.configurator.hardware import BLOCK_SIZE_TOKENS, Hardware
from armature.configurator.simulate import SimPlan, get_num_sim_requests, make_requests, simulate
from armature.configurator.space import AGG, DISAGG, Deployment, Targets, Workload
from armature.sim.replay import ReplayConfig
from armature.sim.replay_config import bytes_s_from_gbs, gbs_from_bytes_s
from armature.sim.timing import TimingModel

__all__ = [
    "Ranked",
    "SearchResult",
    "SearchSettings",
    "get_acceptance_miss",
    "get_sim_timings",
    "get_ttft_growth",
    "rank_key",
    "search",
]

RETRY_RATE_FACTORS = (0.85, 0.7)


@dataclass(frozen=True)
class SearchSettings:
    workload: Workload
    targets: Targets
    total_gpus: int
    request_rate_per_s: float | None = None
    num_finalists: int = 6
    sim_requests: int = 200  # at least; more for long requests
    sim_budget_s: float = 30.0  # wall time for simulating finalists
    # groups a finalist's simulation replays together behind the kv router (at most the
    # deployment's own): a deployment of up to this many groups is predicted by replaying
    # all of it; a larger one by this many, at their share of the rate
    max_sim_groups: int = 4
    seed: int = 0
    # a finalist meets its targets only if it does with every step this fraction slower too
    step_margin: float = 0.0
    # and, with every step `step_margin` slower, its TTFT p50 grows at most this fraction
    # (None: no limit; needs a step margin)
    max_ttft_growth: float | None = None

    def __post_init__(self) -> None:
        if self.max_ttft_growth is not None and not self.max_ttft_growth > 0:
            raise ValueError(f"max_ttft_growth must be > 0 or None, got {self.max_ttft_growth}")


@dataclass(frozen=True)
class Ranked:
    """A deployment, how many groups it deploys, and its prediction (the simulator's for a
    finalist, else the estimate)."""

    deployment: Deployment
    num_groups: int
    prediction: Prediction
    miss: float  # <= 1: meets the targets
    simulated: bool = False
    plan: SimPlan | None = None  # the simulation that gave `prediction`
    estimate: Prediction | None = None  # a simulated finalist's estimate, before simulation
    # the same simulation with every step `SearchSettings.step_margin` slower (when > 0)
    slower: Prediction | None = None

    @property
    def num_gpus(self) -> int:
        return self.num_groups * self.deployment.num_gpus

    @property
    def meets_targets(self) -> bool:
        return self.miss <= 1.0


@dataclass(frozen=True)
class SearchResult:
    # the simulated finalists, best first, then every other deployment by its estimate
    ranked: list[Ranked]
    points: list[tuple[Deployment, Prediction]] = field(default_factory=list)  # every estimate
    num_deployments: int = 0
    num_fitting: int = 0
    request_rate_per_s: float | None = None  # --request-rate, which the groups share

    @property
    def meets_targets(self) -> bool:
        return bool(self.ranked) and self.ranked[0].meets_targets

    def get_served(self, r: Ranked) -> tuple[float, float]:
        """(requests/s per group, output tokens/s per GPU) `r` serves: a simulated row's as
        simulated; an estimated one's at its capacity, or with --request-rate at that rate's
        share per group (at most its capacity), as the simulated rows are."""
        p = r.prediction
        rate = self.request_rate_per_s
        if r.simulated or rate is None or p.request_rate_per_s <= 0:
            return p.request_rate_per_s, p.tokens_per_s_per_gpu
        share = min(1.0, rate / r.num_groups / p.request_rate_per_s)
        return p.request_rate_per_s * share, p.tokens_per_s_per_gpu * share

    def get_best(self, mode: str) -> Ranked | None:
        return next((r for r in self.ranked if r.deployment.mode == mode), None)


def rank_key(ranked: Ranked, by_gpus: bool) -> tuple[float, ...]:
    """Sort key, smallest best (the module docstring's order); ties go to the lower TTFT,
    then the smaller group and max-num-seqs."""
    if not ranked.meets_targets:
        return (1.0, ranked.miss, 0.0, 0.0, 0.0)
    per_gpu = -ranked.prediction.tokens_per_s_per_gpu
    ttft = ranked.prediction.ttft_ms
    d = ranked.deployment
    if by_gpus:
        return (0.0, float(ranked.num_gpus), per_gpu, ttft, float(d.max_num_seqs))
    return (0.0, per_gpu, ttft, float(d.num_gpus), float(d.max_num_seqs))


def get_num_groups(deployment: Deployment, prediction: Prediction, settings: SearchSettings) -> int:
    """Groups to deploy: as many as the GPUs hold, or as the request rate needs (which may
    be more than --total-gpus hold: such a deployment misses)."""
    if settings.request_rate_per_s is None:
        return settings.total_gpus // deployment.num_gpus
    return math.ceil(settings.request_rate_per_s / prediction.request_rate_per_s)


def _get_gpu_miss(deployment: Deployment, num_groups: int, settings: SearchSettings) -> float:
    """How far the groups a request rate needs overflow --total-gpus (<= 1: they fit; 0
    without a request rate)."""
    if settings.request_rate_per_s is None:
        return 0.0
    return num_groups * deployment.num_gpus / settings.total_gpus


def _estimate_all(
    hardware: Hardware, settings: SearchSettings, estimator: Estimator
) -> tuple[list[Ranked], list[tuple[Deployment, Prediction]], int, int]:
    workload, targets = settings.workload, settings.targets
    request_tokens = workload.get_max_request_tokens()
    ranked: list[Ranked] = []
    points: list[tuple[Deployment, Prediction]] = []
    num_deployments = num_fitting = 0
    for deployment in hardware.space.iter_deployments(settings.total_gpus):
        num_deployments += 1
        if not hardware.fits(deployment, request_tokens, workload.isl_tokens):
            continue
        num_fitting += 1
        points += [(deployment, p) for p in estimator.get_points(deployment)]
        best = estimator.get_best(deployment, targets)
        if best is None:
            continue
        prediction, miss = best
        num_groups = get_num_groups(deployment, prediction, settings)
        miss = max(miss, _get_gpu_miss(deployment, num_groups, settings))
        ranked.append(Ranked(deployment, num_groups, prediction, miss))
    return ranked, points, num_deployments, num_fitting


def _layout(deployment: Deployment) -> tuple[object, ...]:
    c = deployment
    return (c.mode, c.prefill_tp, c.decode_tp, c.num_prefill_workers, c.num_decode_workers)


def pick_finalists(ranked: list[Ranked], num_finalists: int) -> list[Ranked]:
    """The best of each layout, `num_finalists` of them, and the best of each mode."""
    seen: set[tuple[object, ...]] = set()
    finalists: list[Ranked] = []
    for r in ranked:
        layout = _layout(r.deployment)
        if layout not in seen:
            seen.add(layout)
            finalists.append(r)
    chosen = finalists[:num_finalists]
    for mode in (AGG, DISAGG):
        if not any(r.deployment.mode == mode for r in chosen):
            chosen += [r for r in finalists if r.deployment.mode == mode][:1]
    if chosen:  # the best of the other mode second: simulated even on a short budget
        other = next((r for r in chosen if r.deployment.mode != chosen[0].deployment.mode), None)
        if other is not None:
            chosen.remove(other)
            chosen.insert(1, other)
    return chosen


def make_plan(
    hardware: Hardware, r: Ranked, rate_per_s: float, settings: SearchSettings
) -> SimPlan:
    """The replay of min(groups, `settings.max_sim_groups`) groups of `r`, each at
    `rate_per_s`: their arrivals what that many of the deployment's groups see of one
    Poisson stream spread over all of them in turn."""
    c = r.deployment
    model = hardware.model
    num_groups = max(1, min(r.num_groups, settings.max_sim_groups))
    config = ReplayConfig(
        num_workers=(c.num_prefill_workers + c.num_decode_workers) * num_groups,
        num_prefill_workers=c.num_prefill_workers * num_groups,
        router="kv",
        block_size=BLOCK_SIZE_TOKENS,
        num_kv_blocks=hardware.get_kv_blocks(c.decode_tp, c.max_num_seqs, c.max_num_batched_tokens),
        max_num_batched_tokens=c.max_num_batched_tokens,
        max_num_seqs=c.max_num_seqs,
        # as the saved replay line's `--transfer-bandwidth-gbs` reads back: that line then
        # gives back this prediction exactly
        transfer_bandwidth_bytes_s=bytes_s_from_gbs(
            gbs_from_bytes_s(hardware.get_transfer_bytes_s(c))
        ),
        kv_bytes_per_block=model.get_kv_bytes_per_token() * BLOCK_SIZE_TOKENS,
        seed=settings.seed,
    )
    p = r.prediction
    e2e_ms = p.ttft_ms + p.itl_ms * settings.workload.osl_tokens
    # the groups' arrivals together span the simulated time: as many requests as one group's
    # replay would need at their joint rate (not that many per group)
    num_requests = get_num_sim_requests(rate_per_s * num_groups, e2e_ms, settings.sim_requests)
    return SimPlan(
        c,
        num_groups,
        rate_per_s * num_groups,
        num_requests,
        config,
        arrival_shape=max(1, r.num_groups // num_groups),
    )


def get_sim_timings(
    hardware: Hardware, r: Ranked, rate_per_s: float, step_scale: float = 1.0
) -> tuple[TimingModel, TimingModel | None]:
    """The step times of `r`'s decode (or aggregated) and prefill workers with each of its
    groups serving `rate_per_s` (on the local machine the whole deployment shares the host),
    each `step_scale` times as long."""
    c = r.deployment
    num_workers = (c.num_prefill_workers + c.num_decode_workers) * r.num_groups
    rate = rate_per_s * r.num_groups

    def get(tp: int) -> TimingModel:
        timing = hardware.get_timing(tp, num_workers, rate, c.max_num_batched_tokens)
        if step_scale == 1.0:
            return timing
        return dataclasses.replace(timing, speedup_ratio=timing.speedup_ratio / step_scale)

    return get(c.decode_tp), (get(c.prefill_tp) if c.prefill_tp else None)


def get_acceptance_miss(
    predicted: Prediction, slower: Prediction | None, settings: SearchSettings
) -> float:
    """How far a simulated finalist misses what it must meet (<= 1: it meets it all): the
    targets at its profiled step times; with a step margin, the targets with every step that
    much slower too and, with `max_ttft_growth`, TTFT p50's growth there over that limit. A
    simulation in which no request finished (no rate) meets nothing: its latencies are 0."""
    if predicted.request_rate_per_s <= 0 or (slower is not None and slower.request_rate_per_s <= 0):
        return math.inf
    osl = settings.workload.osl_tokens
    miss = settings.targets.get_miss(predicted.ttft_ms, predicted.itl_ms, osl)
    if slower is not None:
        miss = max(miss, settings.targets.get_miss(slower.ttft_ms, slower.itl_ms, osl))
        if settings.max_ttft_growth is not None:
            miss = max(miss, get_ttft_growth(predicted, slower) / settings.max_ttft_growth)
    return miss


def _offers(r: Ranked, settings: SearchSettings) -> list[tuple[int, float]]:
    """(groups, requests/s per group) to simulate `r` at, in turn until one meets: its
    estimated rate, then RETRY_RATE_FACTORS of it; with a request rate, that rate over the
    estimate's groups, then over more groups (each retry factor's share of the rate per group
    the estimate gave, rounded up to whole groups; a count already tried is skipped)."""
    if settings.request_rate_per_s is None:
        rate = r.prediction.request_rate_per_s
        return [(r.num_groups, rate * f) for f in (1.0, *RETRY_RATE_FACTORS)]
    # the factors fall, so the counts never do: a repeat is the one just before
    counts = [math.ceil(r.num_groups / f) for f in (1.0, *RETRY_RATE_FACTORS)]
    distinct = [n for i, n in enumerate(counts) if i == 0 or n != counts[i - 1]]
    return [(n, settings.request_rate_per_s / n) for n in distinct]


def _simulate(hardware: Hardware, r: Ranked, settings: SearchSettings) -> Ranked:
    c = r.deployment
    result = r
    for num_groups, rate in _offers(r, settings):
        offered = dataclasses.replace(r, num_groups=num_groups)
        plan = make_plan(hardware, offered, rate, settings)
        requests = make_requests(
            settings.workload,
            plan.request_rate_per_s,
            plan.num_requests,
            settings.seed,
            plan.arrival_shape,
        )
        predicted = simulate(plan, requests, *get_sim_timings(hardware, offered, rate))
        slower = None
        if settings.step_margin > 0:
            scale = 1.0 + settings.step_margin
            slower = simulate(plan, requests, *get_sim_timings(hardware, offered, rate, scale))
        gpu_miss = _get_gpu_miss(c, num_groups, settings)
        miss = max(get_acceptance_miss(predicted, slower, settings), gpu_miss)
        result = Ranked(c, num_groups, predicted, miss, True, plan, r.prediction, slower)
        if miss <= 1.0 or gpu_miss > 1.0:  # more groups would not fit either
            break
    return result


def get_ttft_growth(predicted: Prediction, slower: Prediction) -> float:
    """How far TTFT p50 grows, as a fraction, from `predicted` to the same simulation with
    slower steps (inf from a TTFT of 0 to more)."""
    if predicted.ttft_ms <= 0:
        return 0.0 if slower.ttft_ms <= 0 else math.inf
    return slower.ttft_ms / predicted.ttft_ms - 1.0


def search(
    hardware: Hardware,
    settings: SearchSettings,
    on_progress: Callable[[str], None] | None = None,
) -> SearchResult:
    """Estimate every deployment, simulate the finalists, rank them."""
    by_gpus = settings.request_rate_per_s is not None
    estimator = Estimator(
        {tp: w.timing for tp, w in hardware.timings.items()},
        settings.workload,
        lambda c: (
            settings.workload.isl_tokens
            * hardware.model.get_kv_bytes_per_token()
            / hardware.get_transfer_bytes_s(c)
            * 1000.0
        ),
    )
    ranked, points, num_deployments, num_fitting = _estimate_all(hardware, settings, estimator)
    ranked.sort(key=lambda r: rank_key(r, by_gpus))
    finalists = pick_finalists(ranked, settings.num_finalists)
    started_s = time.monotonic()
    simulated = []
    for i, r in enumerate(finalists):
        if i > 1 and time.monotonic() - started_s > settings.sim_budget_s:
            break  # out of time: the rest keep their estimates (the best of each mode ran)
        if on_progress is not None:
            on_progress(f"simulating {i + 1}/{len(finalists)}: {r.deployment.describe()}")
        simulated.append(_simulate(hardware, r, settings))
    simulated.sort(key=lambda r: rank_key(r, by_gpus))
    done = {id(r.deployment) for r in simulated}
    rest = [r for r in ranked if id(r.deployment) not in done]
    return SearchResult(
        simulated + rest, points, num_deployments, num_fitting, settings.request_rate_per_s
    )
