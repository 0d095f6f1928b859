"""The hardware a search runs over, either kind behind one value:

accelerators   a system profile (systems/*.json): step times predicted by the operator
               model for each TP within a node, KV capacity by the memory-fit rule, KV
               transfers over NVLink within a node and the network across nodes
local          this machine, measured (`armature profile`): the profile's step times
               replace the operator model; one worker is one "GPU" (TP 1), its KV cache
               the profile's, its step budget the profile's, KV transfers over shared
               memory; the engines share the host's cores with the rest of the serving
               stack (`host.HostShare`), which slows their steps when the cores run short
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import msgspec

from armature.configurator.host import HostShare
from armature.configurator.memory import get_memory_fit
from armature.configurator.model_spec import ModelSpec
from armature.configurator.space import Deployment, SearchSpace
from armature.configurator.systems import SystemSpec
from armature.configurator.timing import (
    PREFILL_GRID_TOKENS,
    WorkerTiming,
    predict_profile,
)
from armature.errors import ConfigError
from armature.protocols.timing_profile import TimingProfile
from armature.sim.profile_timing import ProfileTiming, timing_from_profile

__all__ = ["LOCAL_TRANSFER_BYTES_S", "Hardware", "accelerator_hardware", "local_hardware"]

# KV blocks copied between worker processes through shared memory on this machine
LOCAL_TRANSFER_BYTES_S = 2e9
BLOCK_SIZE_TOKENS = 16
# a simulated worker's KV pool is capped here (the workload never needs more)
MAX_SIM_KV_BLOCKS = 1 << 18


@dataclass(frozen=True)
class Hardware:
    name: str
    model: ModelSpec
    timings: dict[int, WorkerTiming]  # by TP
    space: SearchSpace  # the search space narrowed to what this hardware can run
    system: SystemSpec | None  # None: the local machine
    gpus_per_node: int
    local_kv_blocks: int = 0  # the local machine's KV pool
    host: HostShare | None = None  # the local machine's cores (None: a GPU is its worker's)
    # step times by (TP, step budget), made as asked for
    _budget_timings: dict[tuple[int, int], ProfileTiming] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def get_timing(
        self,
        tp: int,
        num_workers: int,
        rate_per_s: float,
        max_num_batched_tokens: int | None = None,
    ) -> ProfileTiming:
        """Step times of a `tp` worker in a deployment of `num_workers` workers serving
        `rate_per_s` requests/s in all: on the local machine, slowed by the share of a core
        each engine gets (`HostShare`); an accelerator is its worker's alone. With
        `max_num_batched_tokens`, from the profile as a worker of that step budget reads it
        (the one `--save-dir` writes: no prefill point past the budget)."""
        timing = self._get_budget_timing(tp, max_num_batched_tokens)
        if self.host is None:
            return timing
        share = self.host.get_engine_share(num_workers, rate_per_s)
        if share >= 1.0:
            return timing
        return dataclasses.replace(timing, speedup_ratio=timing.speedup_ratio * share)

    def _get_budget_timing(self, tp: int, max_num_batched_tokens: int | None) -> ProfileTiming:
        worker = self.timings[tp]
        budget = max_num_batched_tokens
        if budget is None or budget == worker.profile.max_num_batched_tokens:
            return worker.timing
        key = (tp, budget)
        if key not in self._budget_timings:
            limited = msgspec.structs.replace(worker.profile, max_num_batched_tokens=budget)
            self._budget_timings[key] = timing_from_profile(limited)
        return self._budget_timings[key]

    def get_kv_blocks(self, tp: int, max_num_seqs: int, max_num_batched_tokens: int) -> int:
        """One worker's KV pool in blocks; 0 when the model does not fit."""
        if self.system is None:
            return self.local_kv_blocks
        fit = get_memory_fit(
            self.model,
            self.system,
            tp,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            request_tokens=0,
        )
        return min(MAX_SIM_KV_BLOCKS, fit.kv_capacity_tokens // BLOCK_SIZE_TOKENS)

    def fits(self, deployment: Deployment, request_tokens: int, isl_tokens: float) -> bool:
        """The memory-fit rule for every worker of `deployment`: decode (or aggregated)
        workers hold max-num-seqs requests, prefill workers a step's worth of prompts."""
        seqs, budget = deployment.max_num_seqs, deployment.max_num_batched_tokens
        blocks = self.get_kv_blocks(deployment.decode_tp, seqs, budget)
        if blocks * BLOCK_SIZE_TOKENS < seqs * request_tokens:
            return False
        if deployment.num_prefill_workers:
            prompts = max(1, int(budget // max(1.0, isl_tokens)))
            blocks = self.get_kv_blocks(deployment.prefill_tp, prompts, budget)
            return blocks * BLOCK_SIZE_TOKENS >= prompts * request_tokens
        return True

    def get_transfer_bytes_s(self, deployment: Deployment) -> float:
        """KV transfer bandwidth from a prefill to a decode worker: each rank of the
        narrower one over its own link; NVLink when the group fits in one node."""
        if self.system is None:
            return LOCAL_TRANSFER_BYTES_S
        s = self.system
        within_node = deployment.num_gpus <= self.gpus_per_node
        link = s.intra_node_bandwidth_bytes_s if within_node else s.inter_node_bandwidth_bytes_s
        ranks = min(deployment.prefill_tp, deployment.decode_tp) or 1
        return ranks * link.value * s.link_efficiency.value


def accelerator_hardware(
    model: ModelSpec, system: SystemSpec, space: SearchSpace, max_gpus: int, served_name: str
) -> Hardware:
    """`system`'s hardware for `model`: a predicted profile per TP that fits the weights
    (within a node and `max_gpus`). ConfigError when no TP fits the model."""
    per_node = system.get_num_gpus_per_node()
    system.get_peak_flops(model.dtype)  # the dtype is supported, or a one-line error
    top_budget = max(space.max_num_batched_tokens)
    within = [tp for tp in space.tensor_parallel if tp <= min(per_node, max_gpus)]
    if not within:
        raise ConfigError(
            f"no tensor parallelism to search: every --tp value "
            f"({', '.join(map(str, space.tensor_parallel))}) is above {min(per_node, max_gpus)} "
            f"({system.name} has {per_node} GPUs a node; {max_gpus} GPUs given)"
        )
    allowed = [tp for tp in within if model.splits_over(tp)]
    if not allowed:
        raise ConfigError(
            f"no tensor parallelism to search: {model.name}'s {model.num_heads} attention heads "
            f"({model.num_kv_heads} KV heads) split over none of --tp "
            f"{', '.join(map(str, within))} (the query heads must divide by it, and the KV "
            "heads by it or it by them)"
        )
    timings: dict[int, WorkerTiming] = {}
    for tp in allowed:
        fit = get_memory_fit(
            model,
            system,
            tp,
            max_num_seqs=1,
            max_num_batched_tokens=min(space.max_num_batched_tokens),
            request_tokens=0,
        )
        if fit.kv_capacity_tokens < BLOCK_SIZE_TOKENS:
            continue
        profile = predict_profile(
            model,
            system,
            tp,
            served_model_name=served_name,
            max_num_seqs=max(space.max_num_seqs),
            max_num_batched_tokens=max(top_budget, PREFILL_GRID_TOKENS[-1]),
            num_kv_blocks=1,
            block_size_tokens=BLOCK_SIZE_TOKENS,
        )
        timings[tp] = WorkerTiming.of(tp, profile)
    if not timings:
        weights_gb = model.get_weight_bytes() / 1e9
        top = max(allowed)
        raise ConfigError(
            f"model {model.name} ({weights_gb:.1f} GB of {model.dtype} weights) does not fit "
            f"on {system.name} at any tensor parallelism up to {top}"
        )
    tps = tuple(sorted(timings))
    narrowed = SearchSpace(
        tensor_parallel=tps,
        max_num_seqs=space.max_num_seqs,
        max_num_batched_tokens=space.max_num_batched_tokens,
        max_prefill_workers=space.max_prefill_workers,
        max_decode_workers=space.max_decode_workers,
        modes=space.modes,
    )
    return Hardware(system.name, model, timings, narrowed, system, per_node)


def local_hardware(
    model: ModelSpec, profile: TimingProfile, space: SearchSpace, host: HostShare | None = None
) -> Hardware:
    """This machine as `profile` measured it: TP 1, the profile's step budget and KV pool,
    and at most the profile's max-num-seqs; `host`: its cores and the serving stack's CPU
    (None: every worker has a core to itself)."""
    try:
        timing = WorkerTiming.of(1, profile)
    except ValueError as exc:
        raise ConfigError(f"the timing profile cannot give step times: {exc}") from None
    # step times are measured up to the engine's own limits: no more requests than it ran
    seqs = tuple(n for n in space.max_num_seqs if n <= profile.max_num_seqs)
    narrowed = SearchSpace(
        tensor_parallel=(1,),
        max_num_seqs=seqs or (profile.max_num_seqs,),
        max_num_batched_tokens=(profile.max_num_batched_tokens,),
        max_prefill_workers=space.max_prefill_workers,
        max_decode_workers=space.max_decode_workers,
        modes=space.modes,
    )
    blocks = profile.num_kv_blocks * profile.block_size_tokens // BLOCK_SIZE_TOKENS
    return Hardware("local", model, {1: timing}, narrowed, None, 1 << 30, blocks, host)
